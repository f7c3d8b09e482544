"""What an engine provides to the controller: pod attempts it can start, observe and stop.

A pod slot (task, index) has at most one attempt at a time; a restart of the whole pod is a new
attempt, in-place container restarts count in the attempt's ``restarts``. Nothing here blocks:
starting an attempt may take time (a Slurm step waits for its node), so ``create`` returns an
attempt that is still Pending and later polls say what happened. An exit code may arrive after
the phase (a remote runtime learns it late); the controller reports each change it sees.

For the type checker only: a runtime matches these protocols by shape (nothing imports this
module at run time).
"""

from __future__ import annotations

from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Protocol, TypeVar

    from torchjob.controller.driver import Backoff
    from torchjob.expand import PodPlan
    from torchjob.lifecycle import JobStatus
    from torchjob.logs import Level

if TYPE_CHECKING:

    class Attempt(Protocol):
        """One attempt of one pod, as its runtime last saw it."""

        task: str
        index: int
        name: str
        phase: str  # Pending, Running, Succeeded or Failed
        exit_code: int | None
        terminating: bool  # asked to stop
        gone: bool  # stopped, with every process of it
        finished_at: float | None  # when it reached Succeeded or Failed (orders same-pass ends)
        rank: int | None  # the pod's rank, when it has one (the user's terms for a failure)

        @property
        def restarts(self) -> int: ...

    A = TypeVar("A", bound=Attempt)

    class PodRuntime(Protocol[A]):
        """The engine's side. Every method returns promptly; waits belong to the caller's loop."""

        def create(self, plan: PodPlan, status: JobStatus) -> A:
            """Make the next attempt of ``plan``'s pod and start it (it may stay Pending a while)."""
            ...

        def poll(self, attempts: Sequence[A]) -> None:
            """Refresh what is known of ``attempts`` (phase, restarts, exit code, gone)."""
            ...

        def terminate(self, attempts: Sequence[tuple[A, float]]) -> None:
            """Ask each attempt to stop (SIGTERM), killing it once its grace (seconds) is over."""
            ...

        def kill(self, attempts: Sequence[A]) -> None:
            """Kill the attempts now."""
            ...

        def forget(self, attempts: Sequence[A]) -> None:
            """The attempts are gone: release whatever the runtime kept for them."""
            ...

        def observed(self, attempt: A, restarted: bool) -> None:
            """A change of ``attempt`` is about to be reported to the lifecycle (the runtime's
            own notices: why a container failed, a restart's line)."""
            ...

        def backoff(self, attempt: A) -> Backoff | None:
            """The container of ``attempt`` waiting to restart in place, if any."""
            ...

        def note(self, text: str, level: Level) -> None:
            """Tell the user (``level``: how much it matters; a console colours by it)."""
            ...

        def record(self, text: str) -> None:
            """An event of the job: kept in its report and told."""
            ...
