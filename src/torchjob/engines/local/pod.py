"""A tiny kubelet for one pod attempt: init containers in order, then containers, restartPolicy.

Non-blocking: the supervisor calls :meth:`LocalPod.poll` on every tick and compares ``phase`` and
``restarts`` before and after to see pod changes. Phases follow Kubernetes: ``Pending`` while
init containers run, ``Running`` once the containers are started, ``Succeeded``/``Failed`` when
every container has ended and none will be restarted. A container that ends takes the rest of
its process group and recorded descendants with it, as a container's processes die with it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from torchjob.controller.driver import BACKOFF_RESET, backoff  # one back-off rule for every engine
from torchjob.engines.local import prewarm, process
from torchjob.engines.local.containers import ContainerRun
from torchjob.engines.local.state import make_private_dirs, open_private
from torchjob.phases import PodPhase
from torchjob.records import field, record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

    from torchjob.engines.local.preload import Forked

# Plain strings (they are written into the job's status files), spelled by the one vocabulary.
PENDING, RUNNING, SUCCEEDED, FAILED = (
    p.value for p in (PodPhase.PENDING, PodPhase.RUNNING, PodPhase.SUCCEEDED, PodPhase.FAILED)
)

RESTART_WAIT = 5.0  # seconds past a restart's time to wait for the previous run's processes to die
FORK_LATER = "later"  # a forker's answer: the preloading server is not ready yet (preload.py)
FORK_RETRY = 0.05  # seconds until such a container is tried again


def _log(c: RunningContainer, text: str) -> None:
    """torchjob's own line in a container's log; lost, not fatal, when the disk is full."""
    with contextlib.suppress(OSError), os.fdopen(open_private(c.log), "a") as log:
        log.write(text)


TEARDOWN_ABORT = 128 + signal.SIGABRT
TEARDOWN_NOTE = (
    "the program finished (exit code 0), then the interpreter aborted (SIGABRT) while shutting "
    "down, as torch 2.13 can at exit; counted as success"
)


def _finished(c: RunningContainer) -> bool:
    """The runner recorded that the container's program ended with code 0 (warmstart.py)."""
    marker = c.run.env.get(prewarm.FINISHED)
    if c.run.init or not marker:
        return False
    try:
        with open(marker, "rb") as handle:
            return handle.read(1) == b"0"
    except OSError:
        return False


def _forget_finished(c: RunningContainer) -> None:
    """A new run of the container: the previous run's marker does not speak for it."""
    marker = c.run.env.get(prewarm.FINISHED)
    if marker and not c.run.init:
        with contextlib.suppress(OSError):
            os.unlink(marker)


def exit_code_of(returncode: int) -> int:
    """A signal death (-N from Popen) becomes 128+N, as a container runtime reports it."""
    return 128 - returncode if returncode < 0 else returncode


@record
class RunningContainer:
    run: ContainerRun
    log: Path
    proc: subprocess.Popen[bytes] | Forked | None = None  # Forked: from the preloading server
    started: float | None = None
    exit_code: int | None = None
    restarts: int = 0
    failures: int = 0  # consecutive quick failures, for the back-off
    next_start: float | None = None
    done: bool = False
    tracked: dict[int, psutil.Process] = field(default_factory=dict)
    warm: prewarm.Warm | None = None  # its interpreter, started while the init containers run
    fork_wait: bool = False  # its next start waits for the fork server's import (FORK_LATER)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


class LocalPod:
    """One attempt of one pod of a job."""

    def __init__(
        self,
        *,
        name: str,
        task: str,
        index: int,
        attempt: int,
        inits: list[ContainerRun],
        mains: list[ContainerRun],
        restart_policy: str,
        log_dir: Path,
        on_group: Callable[[int, bool], None] = lambda pgid, started: None,
        adopt: Callable[[], list[int]] = list,
        prewarm_modules: tuple[str, ...] = (),
        forkers: Mapping[str, Callable[[ContainerRun, Path], Forked | str | None]] | None = None,
    ) -> None:
        self.name, self.task, self.index, self.attempt = name, task, index, attempt
        self.restart_policy = restart_policy
        self.log_dir = log_dir
        self.on_group = on_group  # tells the watchdog about each process group (True) and its end
        self.adopt = adopt  # job processes the supervisor adopted (orphans of ended main processes)
        self.prewarm_modules = prewarm_modules  # empty: no warm processes (prewarm.py)
        self.forkers = forkers or {}  # main containers forked from the preloading server (preload.py)
        with contextlib.suppress(OSError):  # a full disk: its containers then fail to start, and say why
            make_private_dirs(log_dir)
        self.inits = [RunningContainer(c, log_dir / f"{c.name}.log") for c in inits]
        self.mains = [RunningContainer(c, log_dir / f"{c.name}.log") for c in mains]
        for c in self.mains:  # where the runner records that the program finished (warmstart.py)
            c.run.env[prewarm.FINISHED] = str(log_dir / f"{c.run.name}.finished")
        self.phase = PENDING
        self.exit_code: int | None = None
        self.terminating = False
        self.gone = False
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.address = ""
        self.uid = ""  # the pod attempt's marker value (TORCHJOB_POD_UID)
        self.rank: str | None = None
        self._init_index = 0
        self._kill_deadline: float | None = None
        self._killed = False

    # ----------------------------------------------------------------- public

    @property
    def restarts(self) -> int:
        return sum(c.restarts for c in [*self.inits, *self.mains])

    @property
    def containers(self) -> list[RunningContainer]:
        return [*self.inits, *self.mains]

    def start(self, now: float) -> None:
        self.started_at = time.time()
        if self.inits:
            self._start(self.inits[0], now)
            if self.prewarm_modules:
                self._start_warm(now)
        else:
            self._start_mains(now)

    def poll(self, now: float) -> None:
        if self.gone:
            return
        self._poll_warm(now)
        if self.terminating:
            self._poll_terminating(now)
            return
        if self.phase == PENDING:
            self._poll_init(now)
        elif self.phase == RUNNING:
            self._poll_mains(now)

    def terminate(self, now: float, grace: float, tree: Mapping[int, list[int]] | None = None) -> None:
        """Stop the pod: SIGTERM to every group and recorded descendant, SIGKILL after the grace.

        ``tree`` (:func:`process.children_map`) can be shared when many pods stop at once.
        """
        if self.terminating:
            return
        self.terminating = True
        self.track(tree)
        for c in self.containers:
            c.next_start = None
            if c.warm is not None:
                prewarm.discard(c.warm)
            if c.running and c.proc is not None:
                process.signal_group(c.proc.pid, signal.SIGTERM)
            process.signal_processes(c.tracked.values(), signal.SIGTERM)
        self._kill_deadline = now + grace
        self._poll_terminating(now)

    def kill(self) -> None:
        """SIGKILL everything of the pod now (a second Ctrl-C, or the grace period is over)."""
        if not self._killed:
            self._killed = True
            self._kill_deadline = min(self._kill_deadline or time.monotonic(), time.monotonic())
        for c in self.containers:
            if c.warm is not None:
                prewarm.discard(c.warm)
            if c.proc is not None and c.proc.returncode is None:
                process.signal_group(c.proc.pid, signal.SIGKILL)
            process.signal_processes(process.alive(c.tracked.values()), signal.SIGKILL)

    def fail_now(self, exit_code: int) -> None:
        """The pod cannot run at all (its containers could not be prepared)."""
        self.started_at = time.time()
        self._finish(FAILED, exit_code)

    def live_pids(self) -> list[int]:
        pids = self.child_pids()
        return pids + [p.pid for c in self.containers for p in process.alive(c.tracked.values())]

    def child_pids(self) -> list[int]:
        """The pod's processes that the engine started itself (running and warm containers)."""
        pids = [c.proc.pid for c in self.containers if c.running and c.proc is not None]
        return pids + [c.warm.proc.pid for c in self.mains if c.warm is not None]

    def stuck(self, now: float, after: float) -> bool:
        """SIGKILL was sent ``after`` seconds ago and something still has not died."""
        return self._killed and self._kill_deadline is not None and now > self._kill_deadline + after

    def track(self, tree: Mapping[int, list[int]] | None = None) -> None:
        """Record the live descendants of running containers, to stop them even after they leave."""
        for c in self.containers:
            if c.tracked:
                c.tracked = {p.pid: p for p in process.alive(c.tracked.values())}
        running = [c for c in self.containers if c.running and c.proc is not None]
        if not running:
            return
        tree = process.children_map() if tree is None else tree
        for c in running:
            assert c.proc is not None
            new = [pid for pid in process.descendants_in(tree, c.proc.pid) if pid not in c.tracked]
            if not new:  # the usual case (a program without children): psutil is not even imported
                continue
            import psutil  # 10 ms of CPU, taken from the job's ranks if done while they start

            for pid in new:
                with contextlib.suppress(psutil.Error):
                    c.tracked[pid] = psutil.Process(pid)

    def tracked(self) -> list[psutil.Process]:
        return [p for c in self.containers for p in c.tracked.values()]

    # ---------------------------------------------------------------- private

    def _start(self, c: RunningContainer, now: float) -> None:
        c.next_start = None
        c.exit_code = None
        fork = None if c.run.init else self.forkers.get(c.run.name)
        argv = c.run.argv if c.run.init else prewarm.cold_argv(c.run) or c.run.argv
        _forget_finished(c)
        try:
            with process.ADOPTION:  # until c.proc holds it, the new process is nobody's (cleanup.py)
                forked = fork(c.run, c.log) if fork is not None else None
                if isinstance(forked, str):  # FORK_LATER: the fork server still imports; nothing waits
                    c.proc, c.next_start = None, now + FORK_RETRY  # or sooner: Supervisor.wake_forks
                    c.fork_wait = True
                    return
                c.fork_wait = False
                c.proc = forked or process.spawn(argv, c.run.env, c.run.cwd, c.log, c.run.before_exec)
        except OSError as err:
            what = f"{c.run.argv[0]}: {err.strerror or err}"
            if c.run.cwd and not os.path.isdir(c.run.cwd):  # the OSError would blame the program
                what = f"its working directory {c.run.cwd} does not exist"
            _log(c, f"torchjob: cannot start container {c.run.name!r}: {what}\n")
            c.proc = None
            c.started = now
            c.exit_code = 127 if err.errno == errno.ENOENT else 126
            return
        c.started = now
        self.on_group(c.proc.pid, True)

    def _reap(self, c: RunningContainer) -> bool:
        """True when the container's process has ended just now."""
        if c.proc is None or c.proc.returncode is not None:
            return False
        code = c.proc.poll()
        if code is None:
            return False
        c.exit_code = exit_code_of(code)
        if c.exit_code == TEARDOWN_ABORT and _finished(c):
            c.exit_code = 0
            _log(c, f"torchjob: {TEARDOWN_NOTE}\n")
        # Its orphans (a main process adopts those of its tree) went to the supervisor as it ended:
        # they are this container's, or of another that ended as well; either way they end now.
        orphans = [pid for pid in self.adopt() if pid not in c.tracked]
        if orphans:
            import psutil

            for pid in orphans:
                with contextlib.suppress(psutil.Error):
                    c.tracked[pid] = psutil.Process(pid)
        # The container's main process is gone: its other processes go with it.
        process.signal_group(c.proc.pid, signal.SIGKILL)
        process.signal_processes(process.alive(c.tracked.values()), signal.SIGKILL)
        self.on_group(c.proc.pid, False)
        return True

    def _due(self, c: RunningContainer, now: float) -> bool:
        """A restart is due, and nothing of the container's previous run is left to hold its
        ports or files (killed when it ended; a process stuck in the kernel is not waited for long)."""
        if c.next_start is None or now < c.next_start:
            return False
        process.reap_adopted(c.tracked)  # the killed ones the supervisor adopted: zombies otherwise
        # (Its process group got SIGKILL when it ended; the group id may belong to others by now.)
        left = process.alive(c.tracked.values())
        if not left:
            return True
        process.signal_processes(left, signal.SIGKILL)
        return now > c.next_start + RESTART_WAIT

    def _ended(self, c: RunningContainer) -> bool:
        """The container has an exit code (its process ended or could not start)."""
        return c.exit_code is not None and not c.running

    def _schedule_restart(self, c: RunningContainer, now: float) -> None:
        ran = now - (c.started or now)
        c.failures = 1 if ran >= BACKOFF_RESET else c.failures + 1
        delay = backoff(c.failures)
        c.restarts += 1
        c.next_start = now + delay
        _log(
            c,
            f"--- torchjob: container {c.run.name!r} exited with code {c.exit_code}; "
            f"restart {c.restarts} in {delay:.1f}s (restartPolicy {self.restart_policy}) ---\n",
        )

    def _poll_init(self, now: float) -> None:
        c = self.inits[self._init_index] if self._init_index < len(self.inits) else None
        if c is None:
            return
        if c.next_start is not None:
            if self._due(c, now):
                self._start(c, now)
            return
        self._reap(c)
        if not self._ended(c):
            return
        if c.exit_code == 0:
            self._init_index += 1
            if self._init_index < len(self.inits):
                self._start(self.inits[self._init_index], now)
            else:
                self._start_mains(now)
        elif self.restart_policy == "Never":
            self._finish(FAILED, c.exit_code)
        else:  # Kubernetes restarts failed init containers under Always and OnFailure
            self._schedule_restart(c, now)

    def _start_warm(self, now: float) -> None:
        for c in self.mains:
            with process.ADOPTION:
                c.warm = prewarm.start(c.run, c.log, self.prewarm_modules, now)
            if c.warm is not None:
                self.on_group(c.warm.proc.pid, True)  # the watchdog stops it if the supervisor dies

    def _poll_warm(self, now: float) -> None:
        """Reap warm processes that ended (discarded, or killed by someone), discard stale ones."""
        for c in self.mains:
            if c.warm is None:
                continue
            if now - c.warm.since > prewarm.MAX_WAIT:
                prewarm.discard(c.warm)
            if prewarm.reaped(c.warm):
                self.on_group(c.warm.proc.pid, False)
                c.warm = None

    def _start_mains(self, now: float) -> None:
        for c in self.mains:
            warm, c.warm = c.warm, None
            _forget_finished(c)
            if warm is not None and prewarm.release(warm, c.run.cwd):
                c.proc, c.started, c.exit_code, c.next_start = warm.proc, now, None, None
                continue
            if warm is not None:  # it ended meanwhile: reaped here, the container starts cold
                prewarm.discard(warm)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    warm.proc.wait(1.0)
                self.on_group(warm.proc.pid, False)
            self._start(c, now)
        self.phase = RUNNING
        self._poll_mains(now)

    def _poll_mains(self, now: float) -> None:
        for c in self.mains:
            if c.done:
                continue
            if c.next_start is not None:
                if self._due(c, now):
                    self._start(c, now)
                continue
            self._reap(c)
            if not self._ended(c):
                continue
            if self.restart_policy == "Always" or (self.restart_policy == "OnFailure" and c.exit_code != 0):
                self._schedule_restart(c, now)
            else:
                c.done = True
        if all(c.done for c in self.mains):
            failed = [c.exit_code for c in self.mains if c.exit_code != 0]
            self._finish(FAILED if failed else SUCCEEDED, failed[0] if failed else 0)

    def _finish(self, phase: str, exit_code: int | None) -> None:
        for c in self.mains:  # an init container failed: the program never runs
            if c.warm is not None:
                prewarm.discard(c.warm)
        self.phase = phase
        self.exit_code = exit_code
        self.finished_at = time.time()

    def _poll_terminating(self, now: float) -> None:
        for c in self.containers:
            if self._reap(c) and c.exit_code is not None and self.exit_code is None and c.exit_code != 0:
                self.exit_code = c.exit_code
        busy = any(c.running or c.warm is not None for c in self.containers)
        strays = [p for c in self.containers for p in process.alive(c.tracked.values())]
        if not busy and not strays:
            self.gone = True
            self.finished_at = self.finished_at or time.time()
            return
        if not self._killed and self._kill_deadline is not None and now >= self._kill_deadline:
            self.kill()
