"""``volcano``: the defaulted, validated Volcano Job itself; Volcano's plugins do the rest.

Volcano has no field for the SDK's deadline or pod clean-up policy, so those are warned about;
the SDK already expresses backoff and TTL as ``maxRetry`` and ``ttlSecondsAfterFinished``.
"""

from __future__ import annotations

from typing import Any

from torchjob.spec.model import API_VERSION, KIND, Job, Policy
from torchjob.targets import TargetRender
from torchjob.targets.common import copy, labelled, metadata


def _policy(policy: Policy) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if len(policy.events) == 1:
        out["event"] = policy.events[0]
    elif policy.events:
        out["events"] = list(policy.events)
    if policy.exit_code is not None:
        out["exitCode"] = policy.exit_code
    out["action"] = policy.action
    if policy.timeout is not None:
        out["timeout"] = policy.timeout
    return out


def job_object(job: Job) -> dict[str, Any]:
    """The Job document with every default Volcano's webhook would fill in."""
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
        item.update(copy(task.extra))
        item["template"] = labelled(task.template.raw, job)
        tasks.append(item)
    out: dict[str, Any] = {
        "schedulerName": spec.scheduler_name,
        "queue": spec.queue,
        "minAvailable": spec.min_available,
        "maxRetry": spec.max_retry,
    }
    if spec.min_success is not None:
        out["minSuccess"] = spec.min_success
    if spec.priority_class_name:
        out["priorityClassName"] = spec.priority_class_name
    if spec.ttl_seconds_after_finished is not None:
        out["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    if spec.policies:
        out["policies"] = [_policy(p) for p in spec.policies]
    if spec.plugins:
        out["plugins"] = {name: list(args) for name, args in spec.plugins.items()}
    out.update(copy(spec.extra))
    out["tasks"] = tasks
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata(job), "spec": out}


def render(job: Job) -> TargetRender:
    warnings: list[tuple[str, str]] = []
    policy = job.run_policy
    if policy is not None and policy.active_deadline_seconds is not None:
        warnings.append(
            (
                "run_policy.active_deadline_seconds",
                "Volcano Jobs have no deadline; the SDK's active_deadline_seconds is dropped",
            )
        )
    if policy is not None and policy.clean_pod_policy not in (None, "None"):
        warnings.append(
            (
                "run_policy.clean_pod_policy",
                f"Volcano Jobs have no clean-pod policy; {policy.clean_pod_policy!r} is dropped "
                "(finished pods stay until the job is deleted or its TTL ends)",
            )
        )
    return TargetRender(kind=KIND, api_version=API_VERSION, objects=[job_object(job)], warnings=warnings)
