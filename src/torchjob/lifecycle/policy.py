"""Policy resolution: which action an event leads to (Volcano's ``applyPolicies``)."""

from __future__ import annotations

from collections.abc import Sequence

from torchjob.lifecycle.types import Action, Event
from torchjob.records import record
from torchjob.spec.model import Job, Policy
from torchjob.spec.units import parse_duration


@record(frozen=True)
class Resolution:
    """The action for one event, with the delay of its policy and where it came from."""

    action: Action
    delay: float | None = None  # seconds: the policy's timeout; the engine acts after this delay
    source: str = ""  # "" when no policy matched; else e.g. "task worker policy PodFailed -> RestartJob"


def _policy_text(policy: Policy) -> str:
    trigger = ",".join(policy.events) if policy.events else f"exitCode {policy.exit_code}"
    return f"{trigger} -> {policy.action}"


def _match(policies: Sequence[Policy], event: Event, exit_code: int | None, where: str) -> Resolution | None:
    for policy in policies:
        listed = event.value in policy.events or Event.ANY.value in policy.events
        # A pod is Pending for a while on every start; only a timeout makes that an incident.
        by_event = listed and (event is not Event.POD_PENDING or policy.timeout is not None)
        # Only PodFailed carries an exit code (0 is rejected by validation).
        by_code = policy.exit_code is not None and event is Event.POD_FAILED and policy.exit_code == exit_code
        if by_event or by_code:
            delay = parse_duration(policy.timeout) if policy.timeout is not None else None
            return Resolution(Action(policy.action), delay, f"{where}policy {_policy_text(policy)}")
    return None


def resolve(job: Job, event: Event, task: str | None, exit_code: int | None) -> Resolution:
    """Resolve ``event`` (from a pod of ``task``) against the job's policies.

    Internal events are SyncJob without looking at policies. Otherwise the task's policies are
    tried first, then the job's; in each list the first matching policy wins. A policy matches
    when it lists the event or ``*``, except that PodPending only matches a policy with a
    timeout, or when its ``exitCode`` equals the exit code of a PodFailed. No match is SyncJob.
    """
    if event.internal:
        return Resolution(Action.SYNC_JOB)
    if task is not None:
        spec_task = job.task(task)
        if spec_task is not None:
            found = _match(spec_task.policies, event, exit_code, f"task {task} ")
            if found is not None:
                return found
    found = _match(job.spec.policies, event, exit_code, "")
    return found if found is not None else Resolution(Action.SYNC_JOB)


def resolve_action(job: Job, event: Event, task: str | None, exit_code: int | None) -> Action:
    """The action of :func:`resolve`, for callers that do not care about delays."""
    return resolve(job, event, task, exit_code).action


def cancels_delay(delayed: Event, later: Event) -> bool:
    """Whether ``later`` (on the same pod) cancels an action delayed by a policy timeout for ``delayed``.

    A delayed PodPending action is dropped by any later non-pending event of that pod; a delayed
    PodFailed or PodEvicted action is dropped when the pod runs again.
    """
    if delayed is Event.POD_PENDING:
        return later is not Event.POD_PENDING
    if delayed in (Event.POD_FAILED, Event.POD_EVICTED):
        return later is Event.POD_RUNNING
    return False
