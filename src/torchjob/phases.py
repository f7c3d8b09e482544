"""Job and pod phases: the one vocabulary every layer compares against.

Enum values are Volcano's (and Kubernetes') strings, so a member equals its string and a report
written with them reads the same. Reports keep plain strings in their fields (their JSON does not
change); code compares them with these members and asks :data:`TERMINAL_JOB_PHASES` whether a job
is over. It lives at the bottom layer so that the pure lifecycle, the engines and the display all
share it.
"""

from __future__ import annotations

from enum import Enum


class JobPhase(str, Enum):
    """A job's phase (``status.state.phase``)."""

    PENDING = "Pending"
    ABORTING = "Aborting"
    ABORTED = "Aborted"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    COMPLETING = "Completing"
    COMPLETED = "Completed"
    TERMINATING = "Terminating"
    TERMINATED = "Terminated"
    FAILED = "Failed"

    def __str__(self) -> str:
        return self.value

    @property
    def final(self) -> bool:
        """The job is over: Completed, Failed, Terminated or Aborted."""
        return self in TERMINAL_JOB_PHASES

    @property
    def transient(self) -> bool:
        """A phase that waits for pods to stop before it moves on on its own."""
        return self in _TRANSIENT


# The one terminal set. A str-valued member hashes and compares as its string, so a plain phase
# string read back from a report tests the same: ``"Failed" in TERMINAL_JOB_PHASES``.
TERMINAL_JOB_PHASES = frozenset({JobPhase.COMPLETED, JobPhase.FAILED, JobPhase.TERMINATED, JobPhase.ABORTED})
# Terminal and not a success.
UNSUCCESSFUL_JOB_PHASES = TERMINAL_JOB_PHASES - {JobPhase.COMPLETED}
_TRANSIENT = frozenset({JobPhase.RESTARTING, JobPhase.ABORTING, JobPhase.COMPLETING, JobPhase.TERMINATING})


class PodPhase(str, Enum):
    """A pod's phase (``status.phase``)."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    def __str__(self) -> str:
        return self.value


# Not a Volcano phase: a report's phase when its engine lost track of the job (a supervisor that
# died, a damaged status file, an object that is gone). Not terminal, yet nobody will change it.
UNKNOWN = "Unknown"


class PodState(str, Enum):
    """A pod as a report shows it: Kubernetes' phases, plus ``Stopped`` (the engine stopped it
    before it ended by itself) and ``Unknown`` (the engine lost track of it)."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    STOPPED = "Stopped"
    UNKNOWN = "Unknown"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, text: str) -> PodState:
        """The state a phase string names; a word no engine reports is ``Unknown``."""
        try:
            return cls(text)
        except ValueError:
            return cls.UNKNOWN


class ContainerState(str, Enum):
    """A container's state, as Kubernetes reports it (``waiting``, ``running``, ``terminated``)."""

    WAITING = "waiting"
    RUNNING = "running"
    TERMINATED = "terminated"

    def __str__(self) -> str:
        return self.value


def is_terminal(phase: str) -> bool:
    """Whether a job phase, as an enum member or its string, means the job is over."""
    return phase in TERMINAL_JOB_PHASES
