"""``volcano``: the defaulted, validated Volcano Job itself; Volcano's plugins do the rest.

Volcano has no field for the deadline or pod clean-up policy of an SDK task or a PyTorchJob, so
those are warned about (at ``run_policy.*``, which a kind's reader routes to its own fields);
backoff and TTL are already ``maxRetry`` and ``ttlSecondsAfterFinished``.
"""

from __future__ import annotations

from typing import Any

from torchjob.spec.manifest import job_manifest
from torchjob.spec.model import API_VERSION, KIND, Job
from torchjob.target_api.common import labelled, metadata
from torchjob.targets import Status, Target, TargetRender, TopKind


def job_object(job: Job) -> dict[str, Any]:
    """The Job document with every default Volcano's webhook would fill in, labelled for torchjob."""
    return job_manifest(job, template=lambda raw: labelled(raw, job), metadata=metadata(job))


def render(job: Job) -> TargetRender:
    warnings: list[tuple[str, str]] = []
    policy = job.run_policy
    if policy is not None and policy.active_deadline_seconds is not None:
        warnings.append(
            (
                "run_policy.active_deadline_seconds",
                "Volcano Jobs have no deadline; "
                f"the deadline of {policy.active_deadline_seconds} s is dropped",
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


def status(top: dict[str, Any]) -> Status:
    """Volcano says a phase itself (``status.state``)."""
    state = (top.get("status") or {}).get("state") or {}
    reason = ": ".join(str(p) for p in (state.get("reason"), state.get("message")) if p)
    since = state.get("lastTransitionTime")
    return Status(str(state.get("phase") or "Pending"), reason, None if since is None else str(since))


TARGET = Target(
    name="volcano",
    podgroup=True,
    render=lambda job, runtime: render(job),
    top=TopKind(API_VERSION, KIND, "jobs", "install Volcano"),
    preference=10,  # Volcano runs the job as written
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
    status=status,
    task_keys=("volcano.sh/task-spec",),
    index_keys=("volcano.sh/task-index",),
    attempt_keys=("volcano.sh/job-retry-count",),
)
