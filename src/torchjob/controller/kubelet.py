"""A kubelet: every pod attempt's containers, run through an engine's container runtime.

One :class:`Pod` is one attempt of one pod. Its init containers run one at a time, in order; then
its containers together. ``restartPolicy`` is a kubelet's: a container that ends is started again
in place under ``Always`` (whatever its exit code) and ``OnFailure`` (a non-zero one; a failed init
container under both), after a back-off that doubles with each quick failure up to five minutes
and starts again from its base once a run lasted ten seconds (CrashLoopBackOff while it waits).
The pod's phase follows from its containers as Kubernetes says: Pending while init containers run
(and until the engine confirms the containers run), Running, then Succeeded or Failed once every
container ended and none will start again. Stopping an attempt sends SIGTERM to its running
containers and SIGKILL once the grace period is over; it is gone when nothing of it runs.

:class:`Kubelet` is the controller's pod runtime (:mod:`.runtime`) over any engine's
:class:`ContainerRuntime`, which is asked only to make an attempt's containers (``prepare``), to
start a container, poll it and signal it; the rest of what an engine may do has defaults in
:class:`RuntimeHooks`. Nothing here blocks: the engine's loop calls ``poll`` on each pass.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Sequence

from torchjob.controller.driver import BACKOFF_RESET, Backoff, backoff, waiting_backoff
from torchjob.files import append_private
from torchjob.logs import Level
from torchjob.phases import PodPhase
from torchjob.records import record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any, Protocol

    from torchjob.expand import PodPlan
    from torchjob.lifecycle import JobStatus

PENDING, RUNNING, SUCCEEDED, FAILED = (
    p.value for p in (PodPhase.PENDING, PodPhase.RUNNING, PodPhase.SUCCEEDED, PodPhase.FAILED)
)
ENDED = (SUCCEEDED, FAILED)
CANNOT_RUN = 2  # the exit code of a pod the engine could not prepare (no container to run)


class CannotStart(Exception):
    """A container that could not be started at all (its program missing, say): it ends at once
    with ``exit_code`` (127: not found, 126: not runnable), and ``why`` goes into its log."""

    def __init__(self, exit_code: int, why: str) -> None:
        super().__init__(why)
        self.exit_code = exit_code
        self.why = why


class StartLater(Exception):
    """The container cannot start yet (what it starts from is not ready): tried again in ``delay``
    seconds, without counting as a restart."""

    def __init__(self, delay: float) -> None:
        super().__init__(f"start again in {delay:g}s")
        self.delay = delay


_STARTED, _FAILED, _LATER = "started", "failed", "later"


@record
class Container:
    """One container of an attempt across its in-place restarts."""

    name: str
    init: bool
    spec: Any  # the engine's: what to run (command, environment, node)
    log: Path  # where its output goes; the kubelet adds its restart lines
    handle: Any = None  # the engine's: its latest run (None until it first starts)
    running: bool = False  # its latest run has not ended
    started: float | None = None  # when its latest run started (the kubelet's clock)
    exit_code: int | None = None  # of its latest run
    restarts: int = 0
    failures: int = 0  # consecutive quick failures, for the back-off
    next_start: float | None = None  # when it starts again (waiting out a back-off)
    done: bool = False  # ended, and not to be started again


class Pod:
    """One attempt of one pod: its containers, init containers first, and what became of them."""

    def __init__(
        self,
        *,
        name: str,
        task: str,
        index: int,
        attempt: int,
        containers: list[Container],
        restart_policy: str,
        log_dir: Path,
        address: str = "",
        rank: int | None = None,
        engine: Any = None,
    ) -> None:
        self.name, self.task, self.index, self.attempt = name, task, index, attempt
        self.restart_policy = restart_policy
        self.log_dir = log_dir
        self.address = address
        self.rank = rank  # the pod's rank (a plugin's), for reports
        self.engine = engine  # whatever else the engine keeps for the attempt
        self.inits = [c for c in containers if c.init]
        self.mains = [c for c in containers if not c.init]
        self.phase = PENDING
        self.exit_code: int | None = None
        self.reason = ""  # why it failed: the container and its exit code
        self.failed: Container | None = None  # the container whose exit failed the attempt
        self.terminating = False
        self.gone = False
        self.started_at: float | None = None  # seconds since the epoch
        self.finished_at: float | None = None
        self.next_init = 0  # the init container running (or waiting to restart)
        self.mains_started = False
        self.kill_at: float | None = None  # when SIGKILL follows the SIGTERM (the kubelet's clock)
        self.killed = False
        self.evidence: Any = None  # what its log says of its failure, once read (rootcause.py)

    @property
    def restarts(self) -> int:
        return sum(c.restarts for c in self.containers)

    @property
    def containers(self) -> list[Container]:
        return [*self.inits, *self.mains]

    def stuck(self, now: float, after: float) -> bool:
        """SIGKILL was sent ``after`` seconds ago and something of the attempt still has not died."""
        return self.killed and self.kill_at is not None and now > self.kill_at + after


if TYPE_CHECKING:

    class ContainerRuntime(Protocol):
        """What an engine provides: its containers and the few ways to act on them."""

        def prepare(self, plan: PodPlan, status: JobStatus) -> Pod:
            """The next attempt of ``plan``'s pod with its containers, not started (an attempt
            without containers fails at once: the engine wrote why into its log)."""
            ...

        def start(self, pod: Pod, container: Container) -> Any:
            """Start (or start again) ``container``: its new handle; CannotStart when it cannot."""
            ...

        def poll(self, pod: Pod, container: Container) -> int | None:
            """The running container's exit code once it ended (a signal N as 128+N), else None."""
            ...

        def signal(self, pod: Pod, container: Container, signum: int) -> None:
            """Send ``signum`` (SIGTERM, SIGKILL) to the running container, without waiting."""
            ...

        def refresh(self, pods: Sequence[Pod]) -> None: ...
        def confirmed(self, pod: Pod) -> bool: ...
        def ready(self, pod: Pod, container: Container, now: float) -> bool: ...
        def began(self, pod: Pod) -> None: ...
        def finished(self, pod: Pod) -> None: ...
        def stopping(self, pods: Sequence[Pod], signum: int) -> None: ...
        def lingering(self, pod: Pod) -> bool: ...
        def release(self, pods: Sequence[Pod]) -> None: ...
        def observed(self, pod: Pod, restarted: bool) -> None: ...
        def note(self, text: str, level: Level) -> None: ...
        def record(self, text: str) -> None: ...


class RuntimeHooks:
    """The optional part of a container runtime, with what an engine that needs none of it does."""

    def refresh(self, pods: Sequence[Pod]) -> None:
        """Before a pass over ``pods``: learn in one go what ``confirmed`` will be asked."""

    def confirmed(self, pod: Pod) -> bool:
        """The attempt's containers, once started, run (a remote start may take time): Running."""
        return True

    def ready(self, pod: Pod, container: Container, now: float) -> bool:
        """A restart is due: nothing of the container's last run is left to hold its files or ports."""
        return True

    def began(self, pod: Pod) -> None:
        """The attempt starts (its first container is about to)."""

    def finished(self, pod: Pod) -> None:
        """The attempt ended by itself (Succeeded or Failed)."""

    def stopping(self, pods: Sequence[Pod], signum: int) -> None:
        """The attempts are about to be signalled as a whole (SIGTERM: stopped; SIGKILL: killed)."""

    def lingering(self, pod: Pod) -> bool:
        """Something of the stopped attempt still lives though its containers ended."""
        return False

    def release(self, pods: Sequence[Pod]) -> None:
        """The attempts are gone: release what the engine kept for them."""

    def observed(self, pod: Pod, restarted: bool) -> None:
        """A change of the attempt is about to be reported to the job's lifecycle."""

    def note(self, text: str, level: Level) -> None:
        """Tell the person."""

    def record(self, text: str) -> None:
        """An event of the job, kept in its report."""


def restart_line(c: Container, policy: str, delay: float) -> str:
    """What the kubelet writes into a container's log as it schedules the container's restart."""
    return (
        f"--- torchjob: container {c.name!r} exited with code {c.exit_code}; "
        f"restart {c.restarts} in {delay:.1f}s (restartPolicy {policy}) ---\n"
    )


class Kubelet:
    """The controller's pod runtime: each attempt's containers through ``runtime``.

    ``clock`` gives seconds (monotonic) for back-offs and grace periods; ``wall`` the time reports
    show. Implements :class:`torchjob.controller.runtime.PodRuntime` for :class:`Pod`.
    """

    def __init__(
        self,
        runtime: ContainerRuntime,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.runtime = runtime
        self.clock = clock
        self.wall = wall

    # ------------------------------------------------------------ the controller's runtime

    def create(self, plan: PodPlan, status: JobStatus) -> Pod:
        pod = self.runtime.prepare(plan, status)
        pod.started_at = self.wall()
        if not pod.mains:
            self._finish(pod, FAILED, CANNOT_RUN, "it cannot run here")
            return pod
        self.runtime.began(pod)
        self.advance(pod, self.clock())
        return pod

    def poll(self, attempts: Sequence[Pod]) -> None:
        self.runtime.refresh(attempts)
        now = self.clock()
        for pod in attempts:
            self.advance(pod, now)

    def terminate(self, attempts: Sequence[tuple[Pod, float]]) -> None:
        fresh = [(pod, grace) for pod, grace in attempts if not pod.terminating]
        if not fresh:
            return
        now = self.clock()
        for pod, grace in fresh:
            pod.terminating = True
            pod.kill_at = now + grace
            for c in pod.containers:
                c.next_start = None  # a stopped attempt starts nothing again
        self.runtime.stopping([pod for pod, _ in fresh], signal.SIGTERM)
        for pod, _ in fresh:
            for c in pod.containers:
                if c.running:
                    self.runtime.signal(pod, c, signal.SIGTERM)
            self._stopping(pod, now)

    def kill(self, attempts: Sequence[Pod]) -> None:
        now = self.clock()
        for pod in attempts:
            pod.terminating = True
            pod.killed = True
            pod.kill_at = min(pod.kill_at if pod.kill_at is not None else now, now)
            for c in pod.containers:
                c.next_start = None
        self.runtime.stopping(attempts, signal.SIGKILL)
        for pod in attempts:
            for c in pod.containers:
                if c.running:
                    self.runtime.signal(pod, c, signal.SIGKILL)

    def forget(self, attempts: Sequence[Pod]) -> None:
        self.runtime.release(attempts)

    def observed(self, attempt: Pod, restarted: bool) -> None:
        self.runtime.observed(attempt, restarted)

    def backoff(self, attempt: Pod) -> Backoff | None:
        fields = ((c.name, c.failures, c.exit_code, c.next_start) for c in attempt.containers)
        return waiting_backoff(fields, self.clock())

    def note(self, text: str, level: Level) -> None:
        self.runtime.note(text, level)

    def record(self, text: str) -> None:
        self.runtime.record(text)

    # ------------------------------------------------------------ an attempt's course

    def advance(self, pod: Pod, now: float) -> None:
        """Move an attempt on: init containers in order, then the containers (each restarted in
        place as ``restartPolicy`` says), then its end; a stopped one until it is gone."""
        if pod.gone:
            return
        if pod.terminating:
            self._stopping(pod, now)
            return
        if pod.phase in ENDED:
            return
        while pod.next_init < len(pod.inits):
            c = pod.inits[pod.next_init]
            if not self._step(pod, c, now):
                return
            if c.exit_code == 0:
                c.done = True
                pod.next_init += 1
            elif pod.restart_policy == "Never":
                self._finish(
                    pod, FAILED, c.exit_code, f"init container {c.name} exited with code {c.exit_code}", c
                )
                return
            else:  # Kubernetes restarts a failed init container under Always and OnFailure
                self._schedule_restart(pod, c, now)
                return
        pod.mains_started = True  # each is started by its first step
        for c in pod.mains:
            if c.done or not self._step(pod, c, now):
                continue
            code = c.exit_code
            if pod.restart_policy == "Always" or (pod.restart_policy == "OnFailure" and code != 0):
                self._schedule_restart(pod, c, now)
            else:
                c.done = True
        if all(c.done for c in pod.mains):
            failed = [c for c in pod.mains if c.exit_code != 0]
            if failed:
                c = failed[0]
                code = c.exit_code if c.exit_code is not None else 1
                self._finish(pod, FAILED, code, f"container {c.name} exited with code {code}", c)
            else:
                self._finish(pod, SUCCEEDED, 0, "")
        elif pod.phase == PENDING and self.runtime.confirmed(pod):
            pod.phase = RUNNING

    def _step(self, pod: Pod, c: Container, now: float) -> bool:
        """Start the container when it is due; True when its run has just ended (its exit code is new)."""
        if c.next_start is not None or c.started is None:
            if c.next_start is not None and (now < c.next_start or not self.runtime.ready(pod, c, now)):
                return False
            started = self._start(pod, c, now)
            if started != _STARTED:
                return started == _FAILED
        if not c.running:
            return False
        code = self.runtime.poll(pod, c)
        if code is None:
            return False
        c.running, c.exit_code = False, code
        return True

    def _start(self, pod: Pod, c: Container, now: float) -> str:
        """Start a run of the container: started, failed (it has its exit code) or later."""
        c.next_start, c.exit_code, c.started = None, None, now
        try:
            c.handle = self.runtime.start(pod, c)
        except CannotStart as err:
            append_private(c.log, f"torchjob: cannot start container {c.name!r}: {err.why}\n")
            c.running, c.exit_code = False, err.exit_code
            return _FAILED
        except StartLater as later:
            c.running, c.next_start = False, now + later.delay
            return _LATER
        c.running = True
        return _STARTED

    def _schedule_restart(self, pod: Pod, c: Container, now: float) -> None:
        ran = now - (c.started if c.started is not None else now)
        c.failures = 1 if ran >= BACKOFF_RESET else c.failures + 1
        delay = backoff(c.failures)
        c.restarts += 1
        c.next_start = now + delay
        append_private(c.log, restart_line(c, pod.restart_policy, delay))

    def _finish(
        self, pod: Pod, phase: str, code: int | None, reason: str, c: Container | None = None
    ) -> None:
        pod.phase, pod.exit_code, pod.reason, pod.failed = phase, code, reason, c
        pod.finished_at = self.wall()
        self.runtime.finished(pod)

    def _stopping(self, pod: Pod, now: float) -> None:
        """A stopped attempt: how its containers ended (143 for SIGTERM, ...), gone once nothing runs."""
        for c in pod.containers:
            if not c.running:
                continue
            code = self.runtime.poll(pod, c)
            if code is None:
                continue
            c.running, c.exit_code = False, code
            if pod.exit_code is None and code != 0:
                pod.exit_code = code
        if not any(c.running for c in pod.containers) and not self.runtime.lingering(pod):
            pod.gone = True
            pod.finished_at = pod.finished_at or self.wall()
            return
        if not pod.killed and pod.kill_at is not None and now >= pod.kill_at:
            self.kill([pod])
