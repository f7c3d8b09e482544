"""A job back as its Volcano Job manifest, defaults applied: what the local engine records as
job.yaml and what the ``volcano`` cluster target submits (which adds its label to the templates)."""

from __future__ import annotations

from collections.abc import Callable

from torchjob.spec.model import API_VERSION, KIND, Job, Policy
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any


def _plain(value: Any) -> Any:
    """A deep copy of plain YAML data (much faster than copy.deepcopy)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _policy(policy: Policy) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if len(policy.events) == 1:  # the form users write; Volcano reads both
        out["event"] = policy.events[0]
    elif policy.events:
        out["events"] = list(policy.events)
    if policy.exit_code is not None:
        out["exitCode"] = policy.exit_code
    out["action"] = policy.action
    if policy.timeout is not None:
        out["timeout"] = policy.timeout
    return out


def job_manifest(
    job: Job,
    *,
    template: Callable[[dict[str, Any]], dict[str, Any]] = _plain,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The job as a Volcano Job manifest with every default Volcano's webhook fills in.

    ``template`` makes each task's pod template (a plain copy by default); ``metadata`` replaces
    the job's own name, namespace, labels and annotations.
    """
    spec = job.spec
    tasks = []
    for task in spec.tasks:
        item: dict[str, Any] = {"name": task.name, "replicas": task.replicas}
        if task.min_available is not None:
            item["minAvailable"] = task.min_available
        item["maxRetry"] = task.max_retry
        if task.policies:
            item["policies"] = [_policy(p) for p in task.policies]
        if task.depends_on is not None:
            item["dependsOn"] = {"name": list(task.depends_on.names), "iteration": task.depends_on.iteration}
        item.update(_plain(task.extra))
        item["template"] = template(task.template.raw)
        tasks.append(item)
    body: dict[str, Any] = {
        "schedulerName": spec.scheduler_name,
        "queue": spec.queue,
        "minAvailable": spec.min_available,
        "maxRetry": spec.max_retry,
    }
    if spec.min_success is not None:
        body["minSuccess"] = spec.min_success
    if spec.priority_class_name:
        body["priorityClassName"] = spec.priority_class_name
    if spec.ttl_seconds_after_finished is not None:
        body["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    if spec.policies:
        body["policies"] = [_policy(p) for p in spec.policies]
    if spec.plugins:
        body["plugins"] = {name: list(args) for name, args in spec.plugins.items()}
    body.update(_plain(spec.extra))
    body["tasks"] = tasks
    if metadata is None:
        metadata = {"name": job.name, "namespace": job.metadata.namespace}
        if job.metadata.labels:
            metadata["labels"] = dict(job.metadata.labels)
        if job.metadata.annotations:
            metadata["annotations"] = dict(job.metadata.annotations)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": body}
