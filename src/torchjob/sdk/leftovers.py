"""What a launch of torch's elastic launcher leaves behind, found and stopped once it is over.

The launcher stops the workers it knows of when it returns or raises. It knows them only once
all of them have started: an exception that reaches it while ``start_processes`` is still
starting them (the call's deadline, raised into the launcher's thread; a Ctrl-C) leaves the
workers started so far unknown to it, and they run on (a warm call's are children of the fork
server, which outlives the call). The longest such window is the first start of a warm call: the
caller waits there for the fork server to import torch (seconds under load) and then fork the
worker. Nor does the launcher stop what a worker starts itself (a subprocess, a daemon that left
the worker's session): stopping a worker with SIGTERM leaves those running.

So, around a single-node caller's launch (:func:`stopped_after`), three nets, each stopping what
it finds with SIGTERM, SIGKILL after a grace, waited for:

1. Each worker says it is there, first thing (:func:`worker_here`), in ``<results>/workers/<pid>``;
   when the launch is over the caller writes ``<results>/workers/over``, then stops every worker
   listed that is still alive. A worker that lists itself after that finds ``over`` and exits at
   once; one that starts after the results directory is gone cannot list itself, and exits. In a
   pod the agent's own teardown and the pod's end stop its workers: nothing writes ``over`` there.
2. Every worker started since the launch began (a child of the fork server, or one
   multiprocessing spawned from this process), and all it started, found in ``/proc`` by parent
   and told from an older process by its start time, but for the fork server and
   multiprocessing's resource tracker, which outlast calls by design.
3. A daemon that left them (reparented away) still carries the launch's ``TORCHELASTIC_RUN_ID``,
   unique per call, in the environment it was started with: every process of this user that
   carries it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

from torchjob.host import procfs
from torchjob.logs import get_logger

logger = get_logger()

GRACE = 1.0  # seconds a leftover gets between SIGTERM and SIGKILL
STRAY_GRACE = 2.0  # ... and a listed worker
GONE_WITHIN = 5.0  # seconds a SIGKILLed process gets to vanish before the call goes on
WORKERS = "workers"  # in the results directory: the workers listed, and "over"
OVER = "over"


def _touch(path: str) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))


def worker_here(results: str) -> None:
    """In a worker, before anything else: list this process; exit if its launch is already over."""
    folder = os.path.join(results, WORKERS)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        _touch(os.path.join(folder, str(os.getpid())))
    except FileNotFoundError:  # the results directory is gone: the call is over
        os._exit(1)
    except OSError:  # not ours to write (a pod's read-only results): nothing to list, run on
        return
    if os.path.exists(os.path.join(folder, OVER)):
        os._exit(1)


def _listed(folder: str) -> list[int]:
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [int(name) for name in names if name.isdigit()]


def _started_since(pid: int, since: float) -> bool:
    """A listed pid is still the worker that listed itself: started after the launch began."""
    import psutil

    try:
        return bool(psutil.Process(pid).create_time() >= since - 1.0)
    except psutil.Error:
        return False


def stop_strays(results: str, since: float) -> list[int]:
    """Mark the launch over and stop its workers still alive; the pids that had to be stopped."""
    folder = os.path.join(results, WORKERS)
    with contextlib.suppress(FileExistsError, FileNotFoundError):
        os.mkdir(folder, 0o700)
    with contextlib.suppress(OSError):
        _touch(os.path.join(folder, OVER))
    strays = [pid for pid in alive(_listed(folder)) if _started_since(pid, since)]
    if not strays:
        return []
    logger.debug("elastic launch: %d worker(s) its launcher did not stop: stopping them", len(strays))
    terminate(strays, STRAY_GRACE)  # then SIGKILL, waited for (GONE_WITHIN)
    return strays


def _carrying(marker: bytes, spared: set[int]) -> list[int]:
    """This user's processes whose environment holds ``marker`` (a whole ``NAME=value`` entry)."""
    uid = os.getuid()
    found = []
    for pid in procfs.pids():
        if pid in spared:
            continue
        try:
            if procfs.uid(pid) != uid:
                continue
        except OSError:  # gone meanwhile
            continue
        environ = procfs.environ(pid)  # empty when gone meanwhile, or not ours to read
        if b"\0" + marker + b"\0" in environ or environ.endswith(b"\0" + marker):
            found.append(pid)
    return found


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def _reap(pids: list[int]) -> None:
    """Collect those that are this process's children (spawned workers), so none stays a zombie."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` that still run (neither gone nor a zombie)."""
    alive = []
    for pid in pids:
        try:
            state = procfs.stat_fields(pid)[0]
        except (OSError, ValueError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            alive.append(pid)
    return alive


def stop_leftovers(run_id: str, spared: set[int] | None = None) -> list[int]:
    """Stop every process of this user still carrying ``TORCHELASTIC_RUN_ID=run_id``, other than
    this process and ``spared`` (a fork server); the pids found. Bounded: at most about
    ``GRACE + GONE_WITHIN`` seconds."""
    if not os.path.isdir("/proc"):
        return []
    keep = {os.getpid(), *(spared or set())}
    marker = f"TORCHELASTIC_RUN_ID={run_id}".encode()
    pids = _carrying(marker, keep)
    if not pids:
        return []
    logger.debug("elastic launch %s: %d process(es) outlived the launch: stopped", run_id, len(pids))
    terminate(pids, more=lambda: _carrying(marker, keep | set(pids)))  # and any started meanwhile
    return pids


def terminate(pids: list[int], grace: float = GRACE, more: Callable[[], list[int]] = list) -> None:
    """SIGTERM ``pids``; after ``grace`` seconds SIGKILL those left (and what ``more`` finds
    meanwhile), waited for at most ``GONE_WITHIN`` more. Those that are this process's children
    are reaped on the way."""
    _signal(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while True:
        _reap(pids)
        left = alive(pids) + more()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    if left:
        _signal(left, signal.SIGKILL)
        deadline = time.monotonic() + GONE_WITHIN
        while alive(left) and time.monotonic() < deadline:
            _reap(left)
            time.sleep(0.02)
        _reap(left)


def _descendants() -> dict[int, tuple[int, int]]:
    """This process's descendants now: pid -> (start time in clock ticks, parent pid)."""
    parents: dict[int, list[tuple[int, int]]] = {}
    for pid in procfs.pids():
        try:
            fields = procfs.stat_fields(pid)
        except (OSError, ValueError):
            continue
        parents.setdefault(int(fields[1]), []).append((pid, int(fields[19])))
    found: dict[int, tuple[int, int]] = {}
    todo = [os.getpid()]
    while todo:
        parent = todo.pop()
        for pid, started in parents.get(parent, []):
            if pid not in found:
                found[pid] = (started, parent)
                todo.append(pid)
    return found


def _worker_branch(pid: int, tree: dict[int, tuple[int, int]], server: set[int]) -> bool:
    """Whether ``pid`` is, or descends from, a worker: a child of the fork server, or a child of
    this process started by multiprocessing's spawn (other children of this process, a local
    job's pods run from another thread, are not the launch's)."""
    me = os.getpid()
    while pid in tree:
        parent = tree[pid][1]
        if parent in server:
            return True
        if parent == me:
            try:
                return b"spawn_main" in procfs.read(f"/proc/{pid}/cmdline")
            except OSError:
                return False
        pid = parent
    return False


_running: list[str] = []  # the launches in progress in this process (threads), by run id
_lock = threading.Lock()


def _stop_new(before: dict[int, tuple[int, int]], spared: set[int], server: set[int]) -> list[int]:
    """Stop this process's descendants that were not there before the launch (by pid and start
    time), but for ``spared`` (the fork server, multiprocessing's resource tracker) and what
    they were (the fork server's children are the workers: they are not spared)."""
    now = _descendants()
    new = [
        pid
        for pid, (started, _) in now.items()
        if before.get(pid, (None,))[0] != started and pid not in spared and _worker_branch(pid, now, server)
    ]
    if not new:
        return []
    terminate(new)
    with contextlib.suppress(Exception):
        multiprocessing.active_children()  # multiprocessing's own records of them reaped
    return new


def _tracker() -> set[int]:
    from multiprocessing import resource_tracker

    pid = getattr(resource_tracker._resource_tracker, "_pid", None)
    return {pid} if isinstance(pid, int) else set()


@contextlib.contextmanager
def stopped_after(results: str, run_id: str, spared: Callable[[], set[int]]) -> Iterator[None]:
    """Around a launch by the single-node caller: once it is over, however it ended, stop whatever
    of it still runs: the workers listed in ``results`` (1), the processes started under this
    process since it began (2: the workers, known to torch's launcher or not, and theirs), then
    every process carrying the run id (3). ``spared()`` names processes to leave (the fork
    server). While another thread's launch runs beside it, the processes started meanwhile may be
    that one's: only the run id tells them apart then."""
    with _lock:
        alone = not _running
        _running.append(run_id)
    before = _descendants() if alone else {}
    since = time.time()
    try:
        yield
    finally:
        try:
            stop_strays(results, since)
        finally:
            with _lock:
                _running.remove(run_id)
                alone = alone and not _running
            if alone:
                stopped = _stop_new(before, spared() | _tracker(), spared())
                if stopped:
                    logger.debug(
                        "elastic launch %s: processes %s outlived the launch: stopped", run_id, stopped
                    )
            stop_leftovers(run_id, spared())
