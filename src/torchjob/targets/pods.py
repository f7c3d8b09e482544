"""``pods``: the expansion as it stands (what Volcano's controller would create), each object labelled.

Sent to a cluster, these pods must run without Volcano: only a scheduler the job itself names is
kept. Volcano's webhook default (``schedulerName: volcano``) and the PodGroup annotation, which
only Volcano's scheduler reads, are dropped, so the cluster's default scheduler binds the pods.
A job that names ``volcano`` gets the PodGroup Volcano's controller would have made for it, so
Volcano gang-schedules the pods as it would the Job's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torchjob.expand import GROUP_NAME, Expansion, paused_gc
from torchjob.spec.model import Job
from torchjob.targets import JOB_LABEL, Target, TargetRender

VOLCANO = "volcano"
PODGROUP_API = "scheduling.volcano.sh/v1beta1"


def named_scheduler(job: Job, template_spec: dict[str, Any]) -> str | None:
    """The scheduler a task's pods ask for: the template's own, else the job's if it names one."""
    own = template_spec.get("schedulerName")
    if own:
        return str(own)
    return None if job.spec.scheduler_defaulted else job.spec.scheduler_name


def podgroup(job: Job) -> dict[str, Any]:
    """The PodGroup Volcano's job controller creates (``createOrUpdatePodGroup``), named as the
    pods' group annotation names it."""
    spec: dict[str, Any] = {"minMember": job.spec.min_available, "queue": job.spec.queue}
    if job.spec.priority_class_name:
        spec["priorityClassName"] = job.spec.priority_class_name
    return {
        "apiVersion": PODGROUP_API,
        "kind": "PodGroup",
        "metadata": {"name": job.name, "namespace": job.metadata.namespace, "labels": {JOB_LABEL: job.name}},
        "spec": spec,
    }


def objects(expansion: Expansion) -> Iterator[dict[str, Any]]:
    """Job-level objects first, then every pod, each carrying :data:`JOB_LABEL`."""
    job = expansion.job
    name = job.name
    for obj in expansion.objects():
        obj["metadata"].setdefault("labels", {})[JOB_LABEL] = name
        yield obj
    schedulers = {t.name: named_scheduler(job, t.template.spec) for t in job.spec.tasks}
    if VOLCANO in schedulers.values():
        yield podgroup(job)
    for pod in expansion.pods():
        manifest = pod.manifest
        manifest["metadata"]["labels"][JOB_LABEL] = name
        scheduler = schedulers.get(pod.task.name)
        if scheduler is None:
            manifest["spec"].pop("schedulerName", None)  # the cluster's default scheduler
        if scheduler != VOLCANO:
            manifest["metadata"].get("annotations", {}).pop(GROUP_NAME, None)
        yield manifest


def render(job: Job) -> TargetRender:
    expansion = Expansion(job)
    with paused_gc():
        items = list(objects(expansion))
    return TargetRender(
        kind="Pod",
        api_version="v1",
        objects=items,
        warnings=[(w.path, w.message) for w in expansion.warnings()],
    )


def _render(job: Job, runtime: str | None) -> TargetRender:
    from torchjob.target_api.common import uncontrolled_warnings

    rendered = render(job)
    rendered.warnings += uncontrolled_warnings(job)
    return rendered


# No controller: the pods are read back by their label, the job's phase from them alone.
TARGET = Target(
    name="pods",
    podgroup=True,
    side_kinds=(
        ("v1", "persistentvolumeclaims"),
        ("v1", "configmaps"),
        ("v1", "services"),
        ("networking.k8s.io/v1", "networkpolicies"),
        (PODGROUP_API, "podgroups"),
    ),
    render=_render,
    preference=1000,  # never chosen without --target
    can=frozenset(
        {
            "any-tasks",
            "no-pytorch",
            "elastic-range",
            "different-roles",
            "pod-field",
            "job-volumes",
            "no-command",
        }
    ),
    task_keys=("volcano.sh/task-spec",),
    index_keys=("volcano.sh/task-index",),
    attempt_keys=("volcano.sh/job-retry-count",),
)
