"""From an observed pod change to lifecycle events (Volcano's ``job_controller_handler``)."""

from __future__ import annotations

from collections.abc import Sequence

from torchjob.lifecycle.policy import resolve
from torchjob.lifecycle.types import Action, Event, PodChange, PodPhase, PodStatus
from torchjob.records import record
from torchjob.spec.model import Job

# Volcano treats a task maxRetry of 0 as 3 and -1 as "no limit".
_DEFAULT_TASK_MAX_RETRY = 3


def _view(change: PodChange, pods: Sequence[PodStatus]) -> tuple[PodStatus | None, list[PodStatus]]:
    """The changed pod as known before, and the task's pods with the change applied.

    Works whether ``pods`` was taken before or after the change.
    """
    known: PodStatus | None = None
    task_pods: list[PodStatus] = []
    for pod in pods:
        if pod.task != change.task:
            continue
        if pod.index == change.index:
            known = pod
            continue
        task_pods.append(pod)
    if change.new is not None:
        restarts = known.restarts if known is not None else 0
        task_pods.append(PodStatus(change.task, change.index, change.new, restarts, change.exit_code))
    return known, task_pods


def task_completed(job: Job, task: str, task_pods: Sequence[PodStatus]) -> bool:
    """Every replica of the task succeeded (a task with no replicas never completes)."""
    spec_task = job.task(task)
    if spec_task is None or spec_task.replicas <= 0:
        return False
    succeeded = sum(1 for p in task_pods if p.task == task and p.phase is PodPhase.SUCCEEDED)
    return succeeded >= spec_task.replicas


def task_restarts(task: str, task_pods: Sequence[PodStatus]) -> int:
    """Container restarts summed over the task's live (Pending/Running, not terminating) pods."""
    live = (PodPhase.PENDING, PodPhase.RUNNING)
    return sum(p.restarts for p in task_pods if p.task == task and p.phase in live and not p.terminating)


def task_max_retry(job: Job, task: str) -> int | None:
    """The task's restart threshold for TaskFailed; None when unlimited."""
    spec_task = job.task(task)
    if spec_task is None or spec_task.replicas == 0 or spec_task.max_retry == -1:
        return None
    return spec_task.max_retry or _DEFAULT_TASK_MAX_RETRY


def task_failed(job: Job, task: str, task_pods: Sequence[PodStatus]) -> bool:
    """The task's live pods restarted their containers at least the task's maxRetry times."""
    limit = task_max_retry(job, task)
    return limit is not None and task_restarts(task, task_pods) >= limit


def events_for(job: Job, change: PodChange, pods: Sequence[PodStatus]) -> list[Event]:
    """The events one pod change raises; never empty (OutOfSync stands for "just sync").

    ``pods`` are the job's current pods; the changed pod may be given before or after the change.
    """
    known, task_pods = _view(change, pods)
    # Pods the engine is stopping, or stopped, belong to a decision already taken: their exit
    # must not trigger policies again (Volcano filters these by job version).
    if change.killed or (known is not None and known.terminating):
        return [Event.OUT_OF_SYNC]
    if change.new is None:
        return [Event.POD_EVICTED]
    if change.old is None:
        events = [Event.POD_PENDING]
        if change.new is not PodPhase.PENDING:
            later = _update(job, change, PodPhase.PENDING, task_pods)
            events += [e for e in later if e is not Event.OUT_OF_SYNC]
        return events
    return _update(job, change, change.old, task_pods)


def _update(job: Job, change: PodChange, old: PodPhase, task_pods: Sequence[PodStatus]) -> list[Event]:
    new = change.new
    events: list[Event] = []
    if new is PodPhase.FAILED:
        if old is not PodPhase.FAILED:
            events.append(Event.POD_FAILED)
    elif new is PodPhase.SUCCEEDED:
        if old is not PodPhase.SUCCEEDED and task_completed(job, change.task, task_pods):
            events.append(Event.TASK_COMPLETED)
    elif new is not None:
        # Volcano lets PodRunning/PodPending replace TaskFailed here and so can lose it; keep both.
        if old is not new:
            events.append(Event.POD_RUNNING if new is PodPhase.RUNNING else Event.POD_PENDING)
        if task_failed(job, change.task, task_pods):
            events.append(Event.TASK_FAILED)
    return events or [Event.OUT_OF_SYNC]


_STATE_WORDS = {
    PodPhase.PENDING: "is pending",
    PodPhase.RUNNING: "is running",
    PodPhase.SUCCEEDED: "succeeded",
    PodPhase.FAILED: "failed",
}


def describe_event(job: Job, event: Event, change: PodChange, pods: Sequence[PodStatus]) -> str:
    """A short human description of ``event`` raised by ``change``."""
    pod = change.label
    if event is Event.POD_FAILED:
        code = change.exit_code
        return f"pod {pod} failed" + (f" with exit code {code}" if code is not None else "")
    if event is Event.POD_EVICTED:
        return f"pod {pod} disappeared"
    if event is Event.POD_PENDING:
        return f"pod {pod} is pending"
    if event is Event.POD_RUNNING:
        return f"pod {pod} is running"
    if event is Event.TASK_COMPLETED:
        spec_task = job.task(change.task)
        replicas = spec_task.replicas if spec_task is not None else 0
        return f"pod {pod} succeeded and task {change.task} completed ({replicas} of {replicas} succeeded)"
    if event is Event.TASK_FAILED:
        _, task_pods = _view(change, pods)
        return (
            f"task {change.task} restarted containers {task_restarts(change.task, task_pods)} times"
            f" (task maxRetry {task_max_retry(job, change.task)})"
        )
    if change.new is None:
        return f"pod {pod} stopped"
    return f"pod {pod} {_STATE_WORDS[change.new]}"


@record(frozen=True)
class Reaction:
    """One event of a pod change, resolved to an action.

    Pass ``action``, ``task``, ``index`` and ``cause`` to :func:`~torchjob.lifecycle.step`; if
    ``delay`` is set, do so only after that many seconds, unless a later event of the same pod
    cancels it (:func:`~torchjob.lifecycle.cancels_delay`).
    """

    event: Event
    action: Action
    task: str
    index: int
    exit_code: int | None
    delay: float | None
    cause: str  # e.g. "pod worker-1 failed with exit code 3; policy PodFailed -> RestartJob"


def reactions(job: Job, change: PodChange, pods: Sequence[PodStatus]) -> list[Reaction]:
    """:func:`events_for` followed by policy resolution for each event, with a human cause."""
    out: list[Reaction] = []
    for event in events_for(job, change, pods):
        exit_code = change.exit_code if event is Event.POD_FAILED else None
        found = resolve(job, event, change.task, exit_code)
        cause = describe_event(job, event, change, pods)
        if found.source:
            cause += f"; {found.source}"
        out.append(Reaction(event, found.action, change.task, change.index, exit_code, found.delay, cause))
    return out
