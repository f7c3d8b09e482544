"""Container processes: start each in its own session, stop it and everything it spawned.

Every process of a job carries ``TORCHJOB_JOB_ID=<id>`` in its environment; children inherit it,
even a grandchild that called ``setsid`` to leave its process group. That marker is how the
supervisor (and the watchdog, if the supervisor dies) finds every process of a job, in addition
to process groups, recorded descendants and orphans reparented to the supervisor (a child
subreaper on Linux).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path

from torchjob.engines.local.libc import LIBC
from torchjob.host import procfs
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: 5 ms that would delay the job's first process
    import psutil

# Held from the start of a container's process until its pod records it, and by every scan for
# orphans: until recorded, a new process (forked from the warm pool, or between setsid and exec)
# shows no job's marker, and the scan of another job run by this process (SDK calls in threads)
# would take it for an orphan of its own.
ADOPTION = threading.RLock()
MARKER = "TORCHJOB_JOB_ID"
POD_MARKER = "TORCHJOB_POD_UID"  # one value per pod attempt

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1
LINUX = sys.platform.startswith("linux")


def _prctl(option: int, value: int) -> bool:
    if LIBC is None:
        return False
    try:
        return int(LIBC.prctl(option, value, 0, 0, 0)) == 0
    except AttributeError:
        return False


def set_child_subreaper(on: bool = True) -> bool:
    """Make orphaned descendants of this process reparent to it instead of to init (Linux)."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1 if on else 0)


def die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """SIGKILL this process when the thread that started it ends (kept through exec)."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _keep_orphans() -> None:  # pragma: no cover - runs in the forked child
    # A container's main process adopts the orphans of its own tree, as a container's PID 1 does
    # (the flag survives exec): a daemon that double-forks, calls setsid and clears its env stays
    # its descendant, found by the supervisor's scans and, should the supervisor be killed, by the
    # watchdog's. It reaches the supervisor only when the main process ends, which is when the
    # supervisor stops the orphans it adopted. (No PR_SET_PDEATHSIG: a main process killed with
    # the supervisor would hand its tree to init before the watchdog could see it.)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)


BACKGROUND_NICE = 10  # torchjob's own helper containers, e.g. the wait-for-master probe


def background_priority() -> None:  # pragma: no cover - runs in the forked child
    """Lower this process's CPU priority, for a helper that polls while ranks start on the same cores.

    With autogroup scheduling (most desktop and server kernels), each session is one CPU-share
    group, and a process's own nice value only counts inside its group: a container has a session
    of its own, so its group's nice is lowered too. Refused or missing, either is left as it was."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, BACKGROUND_NICE)
    try:
        fd = os.open("/proc/self/autogroup", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    with contextlib.suppress(OSError):
        os.write(fd, str(BACKGROUND_NICE).encode())
    os.close(fd)


def spawn(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str | None,
    log_path: Path,
    before_exec: Callable[[], None] | None = None,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session with stdout and stderr appended to ``log_path``.

    ``before_exec`` runs in the child before the program (the job's /etc/hosts, see names.py);
    ``pass_fds`` stay open in it (a warm process's pipe, see prewarm.py).
    Raises OSError when the program cannot be started (not found, not executable, bad cwd).
    """
    preexec = _keep_orphans if before_exec is None else _then(before_exec, _keep_orphans)
    # 0600 and never through a symlink: the log holds what the job printed (tokens, too).
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    with open(os.open(log_path, flags, 0o600), "ab", buffering=0) as log:
        try:
            return subprocess.Popen(
                list(argv),
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                pass_fds=tuple(pass_fds),
                preexec_fn=preexec,
            )
        except subprocess.SubprocessError as err:  # before_exec failed in the child
            raise OSError(f"cannot prepare the process: {err}") from None


def _then(first: Callable[[], None], second: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:  # pragma: no cover - runs in the forked child
        first()
        second()

    return both


def processes_with(
    name: str, values: Iterable[str], exclude: Iterable[int] = (), uids: Collection[int] | None = None
) -> list[psutil.Process]:
    """Processes whose environment has ``name`` set to one of ``values`` and whose real uid is
    this user's (or one of ``uids``: a job's own, its containers' ``runAsUser`` when torchjob runs
    as root). A process of another user is never matched, whatever its environment says: anyone
    can set the marker, and root would otherwise kill another user's process that carries it."""
    wanted = set(values)
    if not wanted:
        return []
    owners = {os.getuid()} if uids is None else set(uids)
    skip = {os.getpid(), *exclude}
    if LINUX and os.path.isdir("/proc"):
        skip.update(_ancestors())
        needles = [f"\0{name}={value}\0".encode() for value in wanted]
        pids = []
        for pid in procfs.pids():
            if pid in skip:
                continue
            environ = procfs.environ(pid)
            if environ and any(needle in environ for needle in needles):
                pids.append(pid)
        if not pids:  # the usual answer at the end of a job: psutil is not even imported
            return []
        import psutil

        found: list[psutil.Process] = []
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)  # its owner asked of this very process (not a reused pid)
                if proc.uids().real in owners:
                    found.append(proc)
        return found
    import psutil

    with contextlib.suppress(psutil.Error):
        skip.update(p.pid for p in psutil.Process().parents())
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid in skip or proc.uids().real not in owners:
                continue
            if proc.environ().get(name) in wanted:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def job_owners(job_uids: str) -> frozenset[int]:
    """Whose processes may carry a job's marker (``job_uids``: creation.job_uids' text): this
    user's; as root also the uids the job's containers were switched to, which no other user can
    have asked for. For anyone else those uids are another user's, never the job's."""
    own = {os.getuid()}
    if os.geteuid() == 0:
        own.update(int(uid) for uid in job_uids.split())
    return frozenset(own)


def _ancestors() -> list[int]:
    """This process's parent, its parent and so on (Linux /proc)."""
    found: list[int] = []
    pid = os.getppid()
    while pid > 0 and pid not in found:
        found.append(pid)
        try:
            pid = procfs.ppid(pid)
        except (OSError, ValueError, IndexError):
            break
    return found


def marked_processes(
    job_id: str, exclude: Iterable[int] = (), uids: Collection[int] | None = None
) -> list[psutil.Process]:
    """Processes of this user (or of ``uids``) whose environment carries the job's marker."""
    return processes_with(MARKER, [job_id], exclude, uids)


def sweep(
    name: str, values: Iterable[str], timeout: float = 1.0, uids: Collection[int] | None = None
) -> list[psutil.Process]:
    """SIGKILL every process of this user (or of ``uids``) whose env has ``name`` in ``values``;
    returns those that outlived ``timeout``."""
    procs = alive(processes_with(name, values, uids=uids))
    signal_processes(procs, signal.SIGKILL)
    if not procs:
        return []
    import psutil

    _gone, left = psutil.wait_procs(procs, timeout=timeout)
    return alive(left)


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def signal_processes(procs: Iterable[psutil.Process], sig: int) -> None:
    procs = list(procs)
    if not procs:  # the common case: no import on the way of a pod's next container
        return
    import psutil

    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)


def alive(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    """Those still running; zombies count as gone (they only wait to be reaped)."""
    procs = list(procs)
    if not procs:
        return []
    import psutil

    left: list[psutil.Process] = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc)
        except psutil.Error:
            continue
    return left


def pid_exists(pid: int) -> bool:
    import psutil

    return bool(psutil.pid_exists(pid))


def wait_gone(procs: list[psutil.Process], timeout: float) -> None:
    """Wait up to ``timeout`` s for ``procs`` to end (reaping those that are our children)."""
    if procs:
        import psutil

        psutil.wait_procs(procs, timeout=timeout)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_adopted(job_pids: Iterable[int]) -> None:
    """Wait for exited job processes this process adopted as subreaper.

    Only pids known to belong to the job: in a library call the caller's own children are not
    ours to reap (their ``Popen.wait`` would then see a wrong exit status).
    """
    job_pids = list(job_pids)
    if not job_pids:
        return
    import psutil

    for pid in job_pids:
        try:
            proc = psutil.Process(pid)
            if proc.ppid() == os.getpid() and proc.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError, OSError):
            continue


def kill_now(
    job_id: str,
    pgids: Iterable[int],
    procs: Iterable[psutil.Process],
    grace: float,
    uids: Collection[int] | None = None,
) -> list[psutil.Process]:
    """Stop everything of a job with a short grace: SIGTERM, wait up to ``grace`` s, SIGKILL.
    ``uids``: whose marked processes are the job's (:func:`processes_with`).

    Blocking; used on the way out (watchdog, final sweep), where nothing else must happen.
    """
    import time

    groups = list(pgids)
    targets = {p.pid: p for p in procs}
    for proc in marked_processes(job_id, uids=uids):
        targets.setdefault(proc.pid, proc)
    if not targets and not groups:  # nothing of the job lives, so nothing is left to start more
        return []
    for pgid in groups:
        signal_group(pgid, signal.SIGTERM)
    signal_processes(targets.values(), signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not alive(targets.values()) and not any(group_alive(g) for g in groups):
            break
        time.sleep(0.02)
    for pgid in groups:
        signal_group(pgid, signal.SIGKILL)
    for proc in marked_processes(job_id, uids=uids):  # anything started during the grace period
        targets.setdefault(proc.pid, proc)
    signal_processes(alive(targets.values()), signal.SIGKILL)
    return list(targets.values())
