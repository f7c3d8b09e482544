"""A small process that stops a job's processes if the supervisor dies without doing it.

The supervisor starts one watchdog per job in its own session and keeps the write end of a pipe
to it. A SIGKILLed supervisor cannot clean up, but the kernel closes its pipe: the watchdog reads
end-of-file and kills every process group and process the supervisor told it about, their
descendants, and every process that carries the job's marker, SIGTERM first, SIGKILL at most
0.75 s later. A supervisor that ends
normally writes ``done`` first and the watchdog just exits.

On Linux a single-threaded supervisor forks its watchdog: the copy has the kill code loaded
already and costs about a millisecond, where a new interpreter importing it cost some 40 ms of
CPU, taken from the job's first processes. It reads ``pgid N`` / ``forget N`` / ``pid N START`` /
``done`` lines on its standard input.

A supervisor with threads (an SDK caller: a notebook's kernel, the call's own watcher) cannot
fork safely. Its process keeps one watchdog for all its jobs instead, started for the first
(``python -m torchjob.engines.local.watchdog``) and ended by the process's exit: a warm call of a
second or less would otherwise pay a new interpreter each time. Its lines name the job:
``job ID [UID...]`` (the uids whose marked processes are the job's) / ``pgid ID N`` /
``forget ID N`` / ``pid ID N START`` / ``done ID``; at end of file it stops every job not yet
done, each as above.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import threading
import time

from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Collection
    from typing import IO

    import psutil

GRACE = 0.75  # seconds between SIGTERM and SIGKILL once the supervisor is gone
CLOSE_TIMEOUT = 5.0  # seconds to wait for a killed watchdog to be reaped


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the pipe decides
    return watch_jobs(sys.stdin.buffer)


def watch(job_id: str, stream: IO[bytes], uids: Collection[int] | None = None) -> int:
    """Follow the supervisor's lines until ``done`` (exit) or end-of-file (stop the job); ``uids``:
    whose processes carrying the job's marker are the job's (process.processes_with)."""
    # psutil is imported by kill_now only if the supervisor dies: importing it here took about
    # 9 ms of CPU from the job's first processes, on every run, for a case that is rare.
    from torchjob.engines.local.process import kill_now

    pgids: set[int] = set()
    pids: dict[int, int] = {}  # pid -> its start time, so that a reused pid is left alone
    while True:
        line = stream.readline()
        if not line:
            break
        word, _, value = line.decode(errors="replace").strip().partition(" ")
        if word == "pgid" and value.isdigit():
            pgids.add(int(value))
        elif word == "forget" and value.isdigit():
            pgids.discard(int(value))
        elif word == "pid" and len(numbers := value.split()) == 2 and all(n.isdigit() for n in numbers):
            pids[int(numbers[0])] = int(numbers[1])
        elif word == "done":
            return 0
    kill_now(job_id, pgids, _job_processes(pgids, pids), GRACE, uids)
    return 0


def watch_jobs(stream: IO[bytes]) -> int:
    """A process's shared watchdog: the same for every job named on the lines, until end of file."""
    from torchjob.engines.local.process import kill_now

    # job id -> its groups, its pids, the uids of its processes (``job ID UID...``)
    jobs: dict[str, tuple[set[int], dict[int, int], set[int]]] = {}
    while True:
        line = stream.readline()
        if not line:
            break
        parts = line.decode(errors="replace").split()
        if len(parts) < 2 or not all(n.isdigit() for n in parts[2:]):
            continue
        word, job_id, numbers = parts[0], parts[1], parts[2:]
        if word == "job":
            jobs[job_id] = (set(), {}, {int(n) for n in numbers})
        elif word == "done":
            jobs.pop(job_id, None)
        elif job_id in jobs:
            pgids, pids, _ = jobs[job_id]
            if word == "pgid" and len(numbers) == 1:
                pgids.add(int(numbers[0]))
            elif word == "forget" and len(numbers) == 1:
                pgids.discard(int(numbers[0]))
            elif word == "pid" and len(numbers) == 2:
                pids[int(numbers[0])] = int(numbers[1])
    for job_id, (pgids, pids, owners) in jobs.items():
        kill_now(job_id, pgids, _job_processes(pgids, pids), GRACE, owners or None)
    return 0


def _job_processes(pgids: set[int], pids: dict[int, int]) -> list[psutil.Process]:
    """The processes the supervisor told of, and every descendant of them and of the groups'
    leaders (the containers' main processes, which adopt their tree's orphans): also those that
    left the session and dropped the job's marker."""
    import psutil

    from torchjob.engines.local.proctree import children_map, descendants_in
    from torchjob.host import procfs

    roots = set()
    for pgid in pgids:  # still leading its group: not a reused pid
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(procfs.stat_fields(pgid)[2]) == pgid:
                roots.add(pgid)
    for pid, started in pids.items():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if procfs.start_ticks(pid) == started:
                roots.add(pid)
    tree = children_map()
    found: list[psutil.Process] = []
    for pid in roots | {d for root in roots for d in descendants_in(tree, root)}:
        with contextlib.suppress(psutil.Error):
            found.append(psutil.Process(pid))
    return found


def _can_fork() -> bool:
    # Forking a process with other threads can copy a lock some thread holds; exec is safe.
    return sys.platform.startswith("linux") and threading.active_count() == 1


def _forked(job_id: str, uids: Collection[int] | None) -> tuple[int, IO[bytes]]:
    """Fork the watchdog; returns its pid and the write end of its pipe."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the forked child, which never returns
        code = 1
        try:
            gc.disable()  # no finalizers of the supervisor's objects run in this copy
            os.setsid()
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            for sig in (signal.SIGTERM, signal.SIGHUP):  # as a new interpreter would have them
                signal.signal(sig, signal.SIG_DFL)
            os.dup2(read_fd, 0)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            # Hold none of the supervisor's files, pipes or sockets open (its caller waits on them).
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))
            code = watch(job_id, os.fdopen(0, "rb", closefd=False), uids)
        finally:
            os._exit(code)
    os.close(read_fd)
    return pid, os.fdopen(write_fd, "wb")


class Shared:
    """This process's watchdog for the jobs of a supervisor with threads (see above)."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env.pop("TORCHJOB_JOB_ID", None)  # the watchdog must never match its own job's marker
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torchjob.engines.local.watchdog"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
        self.pid = self.proc.pid

    @classmethod
    def get(cls) -> Shared:
        """The running one, or a new one (the first job, or the last one died)."""
        with _SHARED_LOCK[0]:
            if _SHARED and _SHARED[0].proc.poll() is None and _SHARED[0].proc.stdin is not None:
                return _SHARED[0]
            if _SHARED:
                _SHARED.pop().proc.wait(CLOSE_TIMEOUT)  # it ended: reaped
            _SHARED.append(cls())
            return _SHARED[0]

    def send(self, text: str) -> None:
        with _SHARED_LOCK[0], contextlib.suppress(OSError, ValueError, AttributeError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(text.encode() + b"\n")
            self.proc.stdin.flush()


_SHARED: list[Shared] = []  # this process's, once started
_SHARED_LOCK = [threading.Lock()]  # (a list: a fork's child gets a new one)


def _forget_in_child() -> None:
    """A fork of this process (``preexec_fn``'s child too) does not use the parent's watchdog.
    Nothing here may take a lock (another thread may have held it at the fork): the handle is
    kept aside untouched, never closed nor collected (which would flush its pipe's buffer)."""
    _PARENTS.extend(_SHARED)
    _SHARED.clear()
    _SHARED_LOCK[0] = threading.Lock()


_PARENTS: list[Shared] = []  # in a fork's child: the parent's, left alone


os.register_at_fork(after_in_child=_forget_in_child)


class Watchdog:
    """The supervisor's handle on its job's watchdog: a forked one of its own, or its part of
    this process's shared one."""

    def __init__(self, job_id: str, uids: Collection[int] | None = None) -> None:
        """``uids``: whose processes carrying the job's marker it stops (None: this user's)."""
        self.job_id = job_id
        self._shared: Shared | None = None
        self._pipe: IO[bytes] | None = None
        if _can_fork():
            self.pid, self._pipe = _forked(job_id, uids)
        else:
            self._shared = Shared.get()
            self.pid = self._shared.pid
            self._shared.send(" ".join(["job", job_id, *map(str, sorted(uids or ()))]))

    def _send(self, text: str) -> None:
        if self._shared is not None:
            word, _, rest = text.partition(" ")
            self._shared.send(f"{word} {self.job_id} {rest}".rstrip())
            return
        if self._pipe is None:
            return
        with contextlib.suppress(OSError, ValueError):
            self._pipe.write(text.encode() + b"\n")
            self._pipe.flush()

    def watch(self, pgid: int) -> None:
        self._send(f"pgid {pgid}")

    def watch_pid(self, pid: int, started: int) -> None:
        """A process of the job (``started``: its start time in clock ticks since boot)."""
        self._send(f"pid {pid} {started}")

    def forget(self, pgid: int) -> None:
        self._send(f"forget {pgid}")

    def close(self) -> None:
        """The supervisor has cleaned up itself: the watchdog has nothing left to do."""
        self.stop()
        self.reap()

    def stop(self) -> None:
        """Tell the watchdog to exit (a shared one: to forget the job); :meth:`reap` waits for it.
        (Telling it is cheaper than SIGKILL: the supervisor's kill call took a millisecond, the
        watchdog exits on its own CPU.)"""
        if self._shared is not None:
            self._send("done")
            self._shared = None
            return
        self._send("done")
        if self._pipe is not None:
            with contextlib.suppress(OSError):
                self._pipe.close()
            self._pipe = None

    def reap(self) -> None:
        """Wait for the watchdog's exit; kill it if it has not exited within a second. (A shared
        one goes on: nothing to wait for.)"""
        if self._shared is not None or self.pid in (k.pid for k in _SHARED):
            return
        deadline = time.monotonic() + 1.0
        killed = False
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(self.pid, os.WNOHANG)[0] == 0:
                if time.monotonic() > deadline:
                    if killed:
                        raise TimeoutError(f"the watchdog {self.pid} does not exit")
                    with contextlib.suppress(OSError):
                        os.kill(self.pid, signal.SIGKILL)
                    killed, deadline = True, time.monotonic() + CLOSE_TIMEOUT
                time.sleep(0.001)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
