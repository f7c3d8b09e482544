"""The kubelet's container runtime on this machine: each container run is a process group.

The kubelet (:mod:`torchjob.controller.kubelet`) runs each pod attempt: init containers in order,
then the containers, restarts in place, back-off, the attempt's phase. This runner starts a
container (a process in a session of its own; a main container may be forked from the preloading
server, or be a warm process that imported torch while the init containers ran), polls it (reaps
its main process) and signals it (its group and every descendant recorded). What is the local
engine's own: a container that ends takes the rest of its process group and recorded descendants
with it, as a container's processes die with it; a restart waits until nothing of the last run is
left to hold its ports or files; a stopped attempt is gone only when no stray of it lives.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from torchjob.controller.kubelet import CannotStart, Container, Pod, RuntimeHooks, StartLater
from torchjob.engines.local import prewarm, process, proctree
from torchjob.engines.local.containers import ContainerRun
from torchjob.engines.local.state import open_private
from torchjob.pyrunner import pycommand
from torchjob.records import field, record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

    from torchjob.engines.local.preload import Forked
    from torchjob.expand import PodPlan
    from torchjob.lifecycle import JobStatus
    from torchjob.logs import Level

    Forker = Callable[[ContainerRun, Path], Forked | str | None]

RESTART_WAIT = 5.0  # seconds past a restart's time to wait for the previous run's processes to die
FORK_RETRY = 0.05  # seconds until a container the fork server cannot fork yet is tried again


@record
class Processes:
    """A container's processes on this machine, across its runs: the kubelet's ``spec`` and
    ``handle`` of a local container."""

    run: ContainerRun
    forker: Forker | None = None  # a main container forked from the preloading server (preload.py)
    proc: subprocess.Popen[bytes] | Forked | None = None  # its latest run's main process
    tracked: dict[int, psutil.Process] = field(default_factory=dict)  # its descendants, recorded
    warm: prewarm.Warm | None = None  # its interpreter, started while the init containers run
    fork_wait: bool = False  # its next start waits for the fork server's import (FORK_LATER)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


def of(c: Container) -> Processes:
    found: Processes = c.spec
    return found


def exit_code_of(returncode: int) -> int:
    """A signal death (-N from Popen) becomes 128+N, as a container runtime reports it."""
    return 128 - returncode if returncode < 0 else returncode


def _log(c: Container, text: str) -> None:
    """torchjob's own line in a container's log; lost, not fatal, when the disk is full."""
    with contextlib.suppress(OSError), os.fdopen(open_private(c.log), "a") as log:
        log.write(text)


def _finished(p: Processes) -> bool:
    """The runner recorded that the container's program ended with code 0 (warmstart.py)."""
    marker = p.run.env.get(prewarm.FINISHED)
    return marker is not None and not p.run.init and pycommand.finished(marker)


def _forget_finished(p: Processes) -> None:
    """A new run of the container: the previous run's marker does not speak for it."""
    marker = p.run.env.get(prewarm.FINISHED)
    if marker and not p.run.init:
        pycommand.forget(marker)


# ------------------------------------------------------------------ a pod's processes


def child_pids(pod: Pod) -> list[int]:
    """The attempt's processes that the engine started itself (running and warm containers)."""
    pids = [p.proc.pid for p in map(of, pod.containers) if p.alive and p.proc is not None]
    return pids + [p.warm.proc.pid for p in map(of, pod.mains) if p.warm is not None]


def tracked(pod: Pod) -> list[psutil.Process]:
    return [t for c in pod.containers for t in of(c).tracked.values()]


def live_pids(pod: Pod) -> list[int]:
    return child_pids(pod) + [t.pid for t in process.alive(tracked(pod))]


def track(pod: Pod, tree: Mapping[int, list[int]] | None = None) -> None:
    """Record the live descendants of running containers, to stop them even after they leave.
    ``tree`` (:func:`proctree.children_map`) can be shared when many pods are looked at."""
    for p in map(of, pod.containers):
        if p.tracked:
            p.tracked = {t.pid: t for t in process.alive(p.tracked.values())}
    # torchjob's own helpers (wait-for-master) start only short children (sleep, nc, cat) that stay
    # in their process group and end with it: tracking their nap's sleep imported psutil (10 ms of
    # CPU) in the middle of the ranks' start.
    running = [p for p in map(of, pod.containers) if p.alive and p.proc is not None and not p.run.helper]
    if not running:
        return
    tree = proctree.children_map() if tree is None else tree
    for p in running:
        assert p.proc is not None
        new = [pid for pid in proctree.descendants_in(tree, p.proc.pid) if pid not in p.tracked]
        if not new:  # the usual case (a program without children): psutil is not even imported
            continue
        import psutil  # 10 ms of CPU, taken from the job's ranks if done while they start

        for pid in new:
            with contextlib.suppress(psutil.Error):
                p.tracked[pid] = psutil.Process(pid)


class LocalRunner(RuntimeHooks):
    """Starts, polls and signals containers as this machine's processes.

    ``make`` is the pod factory's (creation.py): an attempt with its resolved containers.
    ``on_group`` tells the watchdog and the exit waiter of each process group (True) and its end;
    ``adopt`` gives the job processes this process adopted (orphans of ended main processes);
    ``host`` is the loop around (supervisor.py): what it is told and asked.
    """

    def __init__(
        self,
        make: Callable[[PodPlan, JobStatus], Pod],
        *,
        on_group: Callable[[int, bool], None],
        adopt: Callable[[], list[int]],
        prewarm_modules: tuple[str, ...],
        host: RunnerHost,
    ) -> None:
        self.make = make
        self.on_group = on_group
        self.adopt = adopt
        self.prewarm_modules = prewarm_modules  # empty: no warm processes (prewarm.py)
        self.host = host

    # ------------------------------------------------------------ the kubelet's asks

    def prepare(self, plan: PodPlan, status: JobStatus) -> Pod:
        pod = self.make(plan, status)
        for c in pod.mains:  # where the runner records that the program finished (warmstart.py)
            of(c).run.env[prewarm.FINISHED] = str(pod.log_dir / f"{c.name}.finished")
        self.host.created(pod)
        return pod

    def start(self, pod: Pod, c: Container) -> Processes:
        p = of(c)
        warm, p.warm = p.warm, None
        _forget_finished(p)
        if warm is not None and prewarm.release(warm, p.run.cwd):
            p.proc = warm.proc
            return p
        if warm is not None:  # it ended meanwhile: reaped here, the container starts cold
            prewarm.discard(warm)
            with contextlib.suppress(subprocess.TimeoutExpired):
                warm.proc.wait(1.0)
            self.on_group(warm.proc.pid, False)
        argv = p.run.argv if p.run.init else prewarm.cold_argv(p.run) or p.run.argv
        try:
            with process.ADOPTION:  # until p.proc holds it, the new process is nobody's (cleanup.py)
                forked = p.forker(p.run, c.log) if p.forker is not None and not p.run.init else None
                if isinstance(forked, str):  # preload.FORK_LATER: the server still imports; nothing waits
                    p.proc, p.fork_wait = None, True  # tried again soon, or at once: Supervisor.wake_forks
                    raise StartLater(FORK_RETRY)
                p.fork_wait = False
                p.proc = forked or process.spawn(argv, p.run.env, p.run.cwd, c.log, p.run.before_exec)
        except OSError as err:
            what = f"{p.run.argv[0]}: {err.strerror or err}"
            if p.run.cwd and not os.path.isdir(p.run.cwd):  # the OSError would blame the program
                what = f"its working directory {p.run.cwd} does not exist"
            p.proc = None
            raise CannotStart(127 if err.errno == errno.ENOENT else 126, what) from None
        self.on_group(p.proc.pid, True)
        return p

    def poll(self, pod: Pod, c: Container) -> int | None:
        """The container's exit code once its main process ended; then the rest of its group and
        its recorded descendants (and the orphans this process adopted as it ended) are killed."""
        p = of(c)
        if p.proc is None:
            return None
        if p.proc.returncode is not None:  # reaped by someone else: ended all the same
            return exit_code_of(p.proc.returncode)
        code = p.proc.poll()
        if code is None:
            return None
        code = exit_code_of(code)
        if code == pycommand.TEARDOWN_ABORT and _finished(p):  # counted as pyrunner/pycommand.py says
            code = 0
            _log(c, f"torchjob: {pycommand.TEARDOWN_NOTE}\n")
        # Its orphans (a main process adopts those of its tree) went to the supervisor as it ended:
        # they are this container's, or of another that ended as well; either way they end now.
        orphans = [pid for pid in self.adopt() if pid not in p.tracked]
        if orphans:
            import psutil

            for pid in orphans:
                with contextlib.suppress(psutil.Error):
                    p.tracked[pid] = psutil.Process(pid)
        # The container's main process is gone: its other processes go with it.
        process.signal_group(p.proc.pid, signal.SIGKILL)
        process.signal_processes(process.alive(p.tracked.values()), signal.SIGKILL)
        self.on_group(p.proc.pid, False)
        return code

    def signal(self, pod: Pod, c: Container, signum: int) -> None:
        p = of(c)
        if p.alive and p.proc is not None:
            process.signal_group(p.proc.pid, signum)
        procs = p.tracked.values() if signum == signal.SIGTERM else process.alive(p.tracked.values())
        process.signal_processes(procs, signum)

    # ------------------------------------------------------------ the optional hooks

    def refresh(self, pods: Sequence[Pod]) -> None:
        """Reap warm processes that ended (discarded, or killed by someone), discard stale ones."""
        now = time.monotonic()
        for pod in pods:
            for p in map(of, pod.mains):
                if p.warm is None:
                    continue
                if now - p.warm.since > prewarm.MAX_WAIT:
                    prewarm.discard(p.warm)
                if prewarm.reaped(p.warm):
                    self.on_group(p.warm.proc.pid, False)
                    p.warm = None

    def began(self, pod: Pod) -> None:
        """Main containers whose command is torchjob's python start warm while init containers run."""
        if not pod.inits or not self.prewarm_modules:
            return
        now = time.monotonic()
        for c in pod.mains:
            p = of(c)
            with process.ADOPTION:
                p.warm = prewarm.start(p.run, c.log, self.prewarm_modules, now)
            if p.warm is not None:
                self.on_group(p.warm.proc.pid, True)  # the watchdog stops it if the supervisor dies

    def ready(self, pod: Pod, c: Container, now: float) -> bool:
        """Nothing of the container's previous run is left to hold its ports or files (killed when
        it ended; a process stuck in the kernel is not waited for long)."""
        p = of(c)
        process.reap_adopted(p.tracked)  # the killed ones the supervisor adopted: zombies otherwise
        left = process.alive(p.tracked.values())
        if not left:
            return True
        process.signal_processes(left, signal.SIGKILL)
        return c.next_start is not None and now > c.next_start + RESTART_WAIT

    def finished(self, pod: Pod) -> None:
        for p in map(of, pod.mains):  # an init container failed: the program never runs
            if p.warm is not None:
                prewarm.discard(p.warm)

    def stopping(self, pods: Sequence[Pod], signum: int) -> None:
        """Before the containers are signalled: the descendants recorded (one scan of the process
        table for all the pods), warm processes discarded, strays of ended runs signalled too."""
        tree = proctree.children_map() if signum == signal.SIGTERM and pods else None
        for pod in pods:
            if tree is not None:
                track(pod, tree)
            for c in pod.containers:
                p = of(c)
                if p.warm is not None:
                    prewarm.discard(p.warm)
                if not c.running:
                    self.signal(pod, c, signum)

    def lingering(self, pod: Pod) -> bool:
        return any(of(c).warm is not None or process.alive(of(c).tracked.values()) for c in pod.containers)

    def release(self, pods: Sequence[Pod]) -> None:
        self.host.released(pods)

    def observed(self, pod: Pod, restarted: bool) -> None:
        self.host.observed(pod, restarted)

    def note(self, text: str, level: Level) -> None:
        self.host.note(text, level)

    def record(self, text: str) -> None:
        self.host.record(text)


if TYPE_CHECKING:
    from typing import Protocol

    class RunnerHost(Protocol):
        """The loop around the runner (the supervisor): what it is told."""

        def created(self, pod: Pod) -> None: ...
        def released(self, pods: Iterable[Pod]) -> None: ...
        def observed(self, pod: Pod, restarted: bool) -> None: ...
        def note(self, text: str, level: Level) -> None: ...
        def record(self, text: str) -> None: ...
