"""``jobset``: a ``JobSet`` (``jobset.x-k8s.io/v1alpha2``) for clusters with only the JobSet controller.

Each task becomes a replicated job of ``replicas`` one-pod Indexed Jobs, so pod ``i`` of a task
is ``<job>-<task>-<i>-0`` (Volcano's ``<job>-<task>-<i>`` plus JobSet's pod index) and is reached
as ``<job>-<task>-<i>-0.<job>`` through the JobSet's headless service (``network.subdomain``).
The pytorch master comes first, so JobSet's global job index is the rank: the master is 0 and
worker ``i`` is ``i + 1``; ``RANK`` reads it from the pod annotation
``jobset.sigs.k8s.io/job-global-index``, whatever command or entrypoint the container has.
Every other task gets ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` and the port but no
``RANK``, as Volcano's pytorch plugin gives them.

- Start-up: ``startupPolicy: InOrder`` creates the workers once the master's Job is ready.
- Success: when the master completes if the master task ends the job (``TaskCompleted ->
  CompleteJob``, as the SDK writes), else when every Job completes (Volcano's default).
- Failure: ``failurePolicy.maxRestarts`` is ``maxRetry - 1`` when a failed pod restarts the job
  (Volcano fails the job on the restart that reaches ``maxRetry``), else 0. Child Jobs of
  ``Never`` pods have ``backoffLimit: 0``; of ``OnFailure`` pods no limit, as under Volcano.
- Deadline: a JobSet has none of its own; the SDK's ``active_deadline_seconds`` goes on each
  child Job, and a failure-policy rule fails the whole set when a Job fails for its deadline
  (``DeadlineExceeded``), where the default action would restart the set with fresh deadlines.
"""

from __future__ import annotations

from typing import Any

from torchjob.errors import SpecError
from torchjob.plugins.pytorch import PORT_NAME
from torchjob.records import record, replace
from torchjob.spec.model import Job, Task
from torchjob.target_api.common import (
    INT32_MAX,
    cannot,
    claim_objects,
    condition_status,
    copy,
    gang_warnings,
    job_restarts,
    labelled,
    metadata,
    mount_job_volumes,
    pod_scheduling,
    queue_warnings,
    scheduler_warnings,
    task_path,
    volcano_warnings,
    wait_master_flags,
)
from torchjob.target_api.names import POD_SUFFIX
from torchjob.targets import JOB_LABEL, Status, Target, TargetRender, TopKind

API_VERSION = "jobset.x-k8s.io/v1alpha2"
KIND = "JobSet"
GLOBAL_INDEX = "metadata.annotations['jobset.sigs.k8s.io/job-global-index']"
JOB_INDEX = "metadata.annotations['jobset.sigs.k8s.io/job-index']"


def pod_host(job: Job, task: Task, index: int) -> str:
    """The DNS name of pod ``index`` of ``task`` inside the JobSet."""
    return f"{job.name}-{task.name}-{index}-0.{job.name}"


def _field(path: str) -> dict[str, Any]:
    return {"fieldRef": {"fieldPath": path}}


def _ordered(job: Job) -> tuple[list[Task], Task | None, Task | None, int]:
    """Tasks with the pytorch master then worker first; the master, worker and port, if any."""
    if "pytorch" not in job.spec.plugins:
        return list(job.spec.tasks), None, None, 0
    from torchjob.plugins.pytorch import PyTorchPlugin

    plugin = PyTorchPlugin(job.spec.plugins["pytorch"])
    master, worker = job.task(plugin.master), job.task(plugin.worker)
    first = [t for t in (master, worker) if t is not None]
    return first + [t for t in job.spec.tasks if t not in first], master, worker, plugin.port


def render(job: Job) -> TargetRender:
    _refuse_elastic_range(job)
    tasks, master, worker, port = _ordered(job)
    warnings = _job_warnings(job, master)
    world = str(sum(t.replicas for t in (master, worker) if t is not None))
    wiring = Wiring(master, worker, port, world)
    replicated = [_replicated_job(job, task, wiring, warnings) for task in tasks]
    spec_out: dict[str, Any] = {
        "network": {"enableDNSHostnames": True, "subdomain": job.name, "publishNotReadyAddresses": True},
        "replicatedJobs": replicated,
        # The SDK's backoff_limit B is maxRetry B + 1: B restarts.
        "failurePolicy": _failure_policy(job),
        "successPolicy": _success_policy(master),
    }
    if master is not None:
        spec_out["startupPolicy"] = {"startupPolicyOrder": "InOrder"}
    ttl = job.spec.ttl_seconds_after_finished
    if ttl is not None:
        spec_out["ttlSecondsAfterFinished"] = ttl
    warnings += _cleanup_warnings(job)
    job_object = {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata(job), "spec": spec_out}
    return TargetRender(KIND, API_VERSION, [*claim_objects(job), job_object], warnings)


DEADLINE_RULE = "DeadlineExceeded"  # the failure-policy rule that ends the set at a Job's deadline


def _deadline(job: Job) -> int | None:
    sdk = job.run_policy
    return sdk.active_deadline_seconds if sdk is not None and sdk.active_deadline_seconds else None


def _failure_policy(job: Job) -> dict[str, Any]:
    """Restarts as Volcano counts them; a Job past its deadline fails the set, never restarts it."""
    policy: dict[str, Any] = {"maxRestarts": job_restarts(job)}
    if _deadline(job) is not None:
        policy["rules"] = [
            {"name": DEADLINE_RULE, "action": "FailJobSet", "onJobFailureReasons": ["DeadlineExceeded"]}
        ]
    return policy


@record(frozen=True)
class Wiring:
    """What the pytorch plugin wires into every task's pods (nothing when the job has no master)."""

    master: Task | None
    worker: Task | None
    port: int
    world: str


def _refuse_elastic_range(job: Job) -> None:
    e = job.elastic
    if e is not None and e.min_nodes != e.max_nodes:
        raise SpecError(
            [
                cannot(
                    "jobset",
                    "spec.minAvailable",
                    f"an elastic range of {e.min_nodes}:{e.max_nodes} nodes",
                    "elastic-range",
                    "a JobSet has a fixed number of pods",
                )
            ]
        )


def _job_warnings(job: Job, master: Task | None) -> list[tuple[str, str]]:
    warnings = [w for w in volcano_warnings(job, "jobset", master) if w[0] != "spec.plugins.env"]
    warnings += (
        queue_warnings(job, "jobset") + gang_warnings(job, "jobset") + scheduler_warnings(job, "jobset")
    )
    for flag in wait_master_flags(job) if master is not None else []:
        warnings.append(
            (
                "spec.plugins.pytorch",
                f"startupPolicy InOrder creates the workers once the master's Job is ready, with no "
                f"time limit; {flag} is dropped",
            )
        )
    return warnings


def _replicated_job(job: Job, task: Task, wiring: Wiring, warnings: list[tuple[str, str]]) -> dict[str, Any]:
    """One task as a replicated job of ``replicas`` one-pod Indexed Jobs."""
    template = labelled(task.template.raw, job)
    spec = template["spec"]
    path = f"{task_path(job, task)}.template.spec"
    _restart_policy(spec, path, warnings)
    _drop_own_names(spec, path, warnings)
    mount_job_volumes(job, spec)
    pod_scheduling(job, spec)
    _wire_containers(job, task, spec, wiring)
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": 1,
        "parallelism": 1,
        "template": template,
    }
    # Never: a failed pod fails its Job and the JobSet's failure policy decides, as Volcano's
    # policies do. OnFailure: the container restarts in place; under Volcano such a pod never
    # fails, so no limit here either (batch/v1's default of 6 would fail the set on the 7th crash).
    job_spec["backoffLimit"] = 0 if spec["restartPolicy"] == "Never" else INT32_MAX
    deadline = _deadline(job)
    if deadline is not None:
        job_spec["activeDeadlineSeconds"] = deadline
    return {
        "name": task.name,
        "replicas": task.replicas,
        "template": {"metadata": {"labels": {JOB_LABEL: job.name}}, "spec": job_spec},
    }


def _restart_policy(spec: dict[str, Any], path: str, warnings: list[tuple[str, str]]) -> None:
    """A Job's pods restart Never or OnFailure: Always (or none) becomes OnFailure."""
    policy = spec.get("restartPolicy")
    if policy not in (None, "Always"):
        return
    if policy == "Always":
        warnings.append(
            (
                f"{path}.restartPolicy",
                "pods of a Kubernetes Job cannot restart Always; "
                "OnFailure restarts the container in place the same way",
            )
        )
    spec["restartPolicy"] = "OnFailure"


def _drop_own_names(spec: dict[str, Any], path: str, warnings: list[tuple[str, str]]) -> None:
    for key in ("hostname", "subdomain"):
        if spec.pop(key, None) is not None:
            warnings.append(
                (f"{path}.{key}", f"JobSet names and addresses the pods itself; {key} is dropped")
            )


def _pytorch_env(job: Job, task: Task, wiring: Wiring) -> list[dict[str, Any]]:
    """The pytorch plugin wires every task's pods; only RANK is for master/worker."""
    if wiring.master is None:
        return []
    env: list[dict[str, Any]] = [
        {"name": "MASTER_ADDR", "value": pod_host(job, wiring.master, 0)},
        {"name": "MASTER_PORT", "value": str(wiring.port)},
        {"name": "WORLD_SIZE", "value": wiring.world},
    ]
    if task is wiring.master:
        env.append({"name": "RANK", "value": "0"})
    elif task is wiring.worker:
        env.append({"name": "RANK", "valueFrom": _field(GLOBAL_INDEX)})
    return env


def _wire_containers(job: Job, task: Task, spec: dict[str, Any], wiring: Wiring) -> None:
    """The master's port and the pytorch env in every container; Volcano's env plugin's index."""
    env_extra = _pytorch_env(job, task, wiring)
    for container in spec.get("containers", []):
        if wiring.master is not None:
            ports = container.setdefault("ports", [])
            if not any(p.get("containerPort") == wiring.port for p in ports):
                ports.append({"name": PORT_NAME, "containerPort": wiring.port})
        if env_extra:
            container.setdefault("env", []).extend(copy(env_extra))
    if "env" in job.spec.plugins:
        # Volcano's env plugin: the pod's index within its task, in every container and init container.
        index_env = [{"name": n, "valueFrom": _field(JOB_INDEX)} for n in ("VK_TASK_INDEX", "VC_TASK_INDEX")]
        for container in [*spec.get("containers", []), *spec.get("initContainers", [])]:
            container.setdefault("env", []).extend(copy(index_env))


def _success_policy(master: Task | None) -> dict[str, Any]:
    """Done when every Job is, or only the master's when the master's completion ends the job."""
    ends_with_master = master is not None and any(
        p.action == "CompleteJob" and p.events == ["TaskCompleted"] for p in master.policies
    )
    if ends_with_master and master is not None:
        return {"operator": "All", "targetReplicatedJobs": [master.name]}
    return {"operator": "All"}


def _cleanup_warnings(job: Job) -> list[tuple[str, str]]:
    sdk = job.run_policy
    if sdk is None or sdk.clean_pod_policy in (None, "None"):
        return []
    return [
        (
            "run_policy.clean_pod_policy",
            "a JobSet deletes its active Jobs when it finishes and "
            f"keeps finished pods; clean_pod_policy {sdk.clean_pod_policy!r} is dropped",
        )
    ]


def status(top: dict[str, Any]) -> Status:
    """JobSet's conditions; it has no Running one, so a running job is told by its pods. A set
    failed by the deadline rule failed for the deadline (JobSet's own reason names only the rule's
    action)."""
    said = condition_status(top, "Completed")
    spec = top.get("spec") or {}
    rules = [r.get("name") for r in (spec.get("failurePolicy") or {}).get("rules") or []]
    if (
        said.phase == "Failed"
        and rules == [DEADLINE_RULE]
        and said.reason.startswith("FailJobSetFailurePolicyAction")
    ):
        seconds = next(
            (
                r["template"]["spec"].get("activeDeadlineSeconds")
                for r in spec.get("replicatedJobs") or []
                if r.get("template", {}).get("spec", {}).get("activeDeadlineSeconds")
            ),
            None,
        )
        detail = said.reason.removeprefix("FailJobSetFailurePolicyAction").lstrip(": ")
        return replace(
            said, reason=f"DeadlineExceeded: a Job ran past its activeDeadlineSeconds ({seconds}s); {detail}"
        )
    return said


def generated(job: Job) -> list[tuple[str, str, str]]:
    """One replicated job per task, of `replicas` one-pod Jobs: Job <job>-<task>-<i>, pod <Job>-0-xxxxx."""
    return [
        (f"spec.tasks[{i}].name", "pod", f"{job.name}-{t.name}-{max(t.replicas - 1, 0)}-0{POD_SUFFIX}")
        for i, t in enumerate(job.spec.tasks)
    ]


TARGET = Target(
    name="jobset",
    generated=generated,
    dns1035=True,  # the JobSet's headless Service is named after it
    render=lambda job, runtime: render(job),
    top=TopKind(
        API_VERSION,
        "JobSet",
        "jobsets",
        "install JobSet",
        versions=(
            ("spec.startupPolicy", "JobSet v0.4"),
            ("spec.ttlSecondsAfterFinished", "JobSet v0.5"),
            ("spec.network.publishNotReadyAddresses", "JobSet v0.6"),
            ("spec.failurePolicy.rules", "JobSet v0.6"),
        ),
    ),
    preference=30,  # needs only JobSet's controller
    can=frozenset({"any-tasks", "no-pytorch", "different-roles", "pod-field", "no-command"}),
    status=status,
    task_keys=("jobset.sigs.k8s.io/replicatedjob-name",),
    # Each task runs as `replicas` one-pod Jobs: a pod's index is its Job's (its completion index is 0).
    index_keys=("jobset.sigs.k8s.io/job-index", "batch.kubernetes.io/job-completion-index"),
    attempt_keys=("jobset.sigs.k8s.io/restart-attempt",),
)
