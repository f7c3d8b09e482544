"""The vocabulary of the lifecycle: phases, events, actions and the plain records passed around.

Enum values are Volcano's strings, so a status written by torchjob reads like a Volcano status.
The phases themselves live in :mod:`torchjob.phases`, shared with the engines and the display.
"""

from __future__ import annotations

from enum import Enum

from torchjob.phases import JobPhase as JobPhase  # re-exported: the lifecycle's vocabulary
from torchjob.phases import PodPhase as PodPhase
from torchjob.records import record, replace
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Literal


class Event(str, Enum):
    """What happened; policies name these (``*`` matches any)."""

    ANY = "*"
    POD_PENDING = "PodPending"
    POD_RUNNING = "PodRunning"
    POD_FAILED = "PodFailed"
    POD_EVICTED = "PodEvicted"
    UNKNOWN = "Unknown"
    TASK_COMPLETED = "TaskCompleted"
    TASK_FAILED = "TaskFailed"
    JOB_UPDATED = "JobUpdated"
    OUT_OF_SYNC = "OutOfSync"
    COMMAND_ISSUED = "CommandIssued"

    def __str__(self) -> str:
        return self.value

    @property
    def internal(self) -> bool:
        """Controller-internal events: they always mean SyncJob, policies are not consulted."""
        return self in _INTERNAL_EVENTS


_INTERNAL_EVENTS = frozenset({Event.OUT_OF_SYNC, Event.COMMAND_ISSUED, Event.POD_RUNNING})


class Action(str, Enum):
    """What the controller does about an event."""

    SYNC_JOB = "SyncJob"
    ABORT_JOB = "AbortJob"
    RESTART_JOB = "RestartJob"
    RESTART_TASK = "RestartTask"
    RESTART_POD = "RestartPod"
    RESTART_PARTITION = "RestartPartition"
    TERMINATE_JOB = "TerminateJob"
    COMPLETE_JOB = "CompleteJob"
    RESUME_JOB = "ResumeJob"

    def __str__(self) -> str:
        return self.value

    @property
    def restart(self) -> bool:
        """A restart action: each one taken in Pending or Running costs one retry."""
        return self in RESTART_ACTIONS


RESTART_ACTIONS = frozenset(
    {Action.RESTART_JOB, Action.RESTART_TASK, Action.RESTART_POD, Action.RESTART_PARTITION}
)

# Retain sets of a kill: pods in these phases are left alone.
RETAIN_NONE: frozenset[PodPhase] = frozenset()
RETAIN_SOFT: frozenset[PodPhase] = frozenset({PodPhase.SUCCEEDED, PodPhase.FAILED})


def pod_label(task: str, index: int) -> str:
    """The short pod name used in messages and log prefixes: ``worker-1``."""
    return f"{task}-{index}"


@record(frozen=True)
class PodStatus:
    """What the engine knows of one pod of the current attempt."""

    task: str
    index: int
    phase: PodPhase
    restarts: int = 0  # container restarts inside this pod (restartPolicy), counted by the engine
    exit_code: int | None = None
    terminating: bool = False  # the engine is stopping it

    @property
    def label(self) -> str:
        return pod_label(self.task, self.index)


@record(frozen=True)
class JobStatus:
    phase: JobPhase = JobPhase.PENDING
    retry_count: int = 0  # job-level retries, compared with spec.maxRetry (one counter per job)
    version: int = 0  # bumped by every whole-job kill
    reason: str = ""  # one human sentence: why the job is in this phase


@record(frozen=True)
class PodChange:
    """One observed pod transition.

    ``old == new`` is a valid change: it reports a container restart inside a pod (its
    ``restarts`` went up), which is what can raise TaskFailed.
    """

    task: str
    index: int
    old: PodPhase | None  # None: the pod was just created
    new: PodPhase | None  # None: the pod disappeared (evicted/deleted)
    exit_code: int | None = None
    killed: bool = False  # the engine stopped this pod itself (carrying out a Kill)

    @property
    def label(self) -> str:
        return pod_label(self.task, self.index)


@record(frozen=True)
class Kill:
    """Pods the engine must stop: the whole job, one task, or one pod.

    ``indices`` narrows a task kill to some pod indices (RestartPartition); None means all.
    Use :meth:`selects` (or :func:`apply_kill`) rather than re-implementing the rule.
    """

    scope: Literal["job", "task", "pod"]
    task: str | None = None
    index: int | None = None
    retain: frozenset[PodPhase] = frozenset()  # pods in these phases are left alone
    indices: frozenset[int] | None = None

    def selects(self, pod: PodStatus) -> bool:
        """True if this kill stops ``pod`` (pods already terminating are never selected again)."""
        if pod.terminating or pod.phase in self.retain:
            return False
        if self.scope == "job":
            return True
        if pod.task != self.task:
            return False
        if self.scope == "task":
            return self.indices is None or pod.index in self.indices
        return pod.index == self.index


def apply_kill(pods: tuple[PodStatus, ...] | list[PodStatus], kill: Kill | None) -> tuple[PodStatus, ...]:
    """The pods as they look once ``kill`` has been issued: the selected ones are terminating."""
    if kill is None:
        return tuple(pods)
    return tuple(replace(p, terminating=True) if kill.selects(p) else p for p in pods)


@record(frozen=True)
class Decision:
    """What :func:`~torchjob.lifecycle.step` decided.

    The engine stops ``kill``'s pods (grace period, then kill), then starts missing pods if
    ``create_pods``. If ``resync`` is true the phase changed to one that is not final; call
    ``step(..., Action.SYNC_JOB)`` again once the kill has been issued (Volcano re-syncs a job
    whenever its phase changes; without this a job whose pods are all gone would stay in, say,
    Aborting forever because no further pod event arrives).
    """

    status: JobStatus
    kill: Kill | None
    create_pods: bool
    resync: bool = False
