"""The workers of one single-node elastic launch that its launcher never learned of, stopped.

torch's launcher stops the workers of its process context when the launch returns or raises. The
context exists only once ``start_processes`` has started every worker, and multiprocessing knows
a worker only once ``start`` has read its pid back: an exception that reaches the launcher's
thread before (the call's deadline, raised into that thread; a Ctrl-C) leaves the workers started
so far unknown to both. The longest such window is the first start of a warm call: the caller
waits there for the fork server to import torch (seconds under load) and then fork the worker. A
warm call's workers are children of that server, which outlives the call, so nothing else ended
them: they waited in the rendezvous for minutes after the call had failed.

So each worker says it is there, first thing, in ``<results>/workers/<pid>``; when the launch is
over the caller writes ``<results>/workers/over``, then stops every worker listed that is still
alive (SIGTERM, SIGKILL after a grace). A worker that lists itself after that finds ``over`` and
exits at once; one that starts after the results directory is gone cannot list itself, and exits.
Only the single-node caller writes ``over``: in a pod the agent's own teardown and the pod's end
stop its workers.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

from torchjob.logs import get_logger
from torchjob.sdk.leftovers import alive, terminate

logger = get_logger()

WORKERS = "workers"  # in the results directory
OVER = "over"
GRACE = 2.0  # seconds a stray gets between SIGTERM and SIGKILL


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
    terminate(strays, GRACE)  # then SIGKILL, waited for (leftovers.GONE_WITHIN)
    return strays


@contextlib.contextmanager
def strays_stopped(results: str) -> Iterator[None]:
    """Around one launch by the caller: afterwards, however it ended, its workers are stopped."""
    since = time.time()
    try:
        yield
    finally:
        stop_strays(results, since)
