"""A job back as its Volcano Job manifest, defaults applied: what the local engine records as
job.yaml and what a cluster target submits."""

from __future__ import annotations

from typing import Any

from torchjob.spec.model import Job, Policy


def _policy(policy: Policy) -> dict[str, Any]:
    out: dict[str, Any] = {"action": policy.action}
    if policy.events:
        out["events"] = list(policy.events)
    if policy.exit_code is not None:
        out["exitCode"] = policy.exit_code
    if policy.timeout is not None:
        out["timeout"] = policy.timeout
    return out


def job_manifest(job: Job) -> dict[str, Any]:
    """The job as a Volcano Job manifest (defaults applied)."""
    spec = job.spec
    body: dict[str, Any] = {"minAvailable": spec.min_available, "maxRetry": spec.max_retry}
    if spec.min_success is not None:
        body["minSuccess"] = spec.min_success
    for key, value in (
        ("queue", spec.queue),
        ("schedulerName", spec.scheduler_name),
        ("priorityClassName", spec.priority_class_name),
    ):
        if value:
            body[key] = value
    if spec.ttl_seconds_after_finished is not None:
        body["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    if spec.policies:
        body["policies"] = [_policy(p) for p in spec.policies]
    if spec.plugins:
        body["plugins"] = {k: list(v) for k, v in spec.plugins.items()}
    body.update(spec.extra)
    tasks = []
    for task in spec.tasks:
        entry: dict[str, Any] = {"name": task.name, "replicas": task.replicas}
        if task.min_available is not None:
            entry["minAvailable"] = task.min_available
        entry["maxRetry"] = task.max_retry
        if task.policies:
            entry["policies"] = [_policy(p) for p in task.policies]
        if task.depends_on is not None:
            entry["dependsOn"] = {"name": list(task.depends_on.names), "iteration": task.depends_on.iteration}
        entry.update(task.extra)
        entry["template"] = task.template.raw
        tasks.append(entry)
    body["tasks"] = tasks
    meta: dict[str, Any] = {"name": job.name, "namespace": job.metadata.namespace}
    if job.metadata.labels:
        meta["labels"] = dict(job.metadata.labels)
    if job.metadata.annotations:
        meta["annotations"] = dict(job.metadata.annotations)
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": meta, "spec": body}
