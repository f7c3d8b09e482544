"""Warm single-node ``Elastic`` calls: the workers of torch's launcher forked from a server.

A single-node call runs torch's elastic launcher in the caller, which starts each worker with
multiprocessing's ``spawn``: a new interpreter that imports torch. Warm, the launcher uses
``forkserver`` instead: Python's fork server, one per process, started by the first call with
torch and this package imported, forks each worker of later calls (fresh processes, nothing of
a previous call in them). It ends with the caller (its pipe from the caller closes).

A forked worker gets the server's environment, working directory and ``sys.path`` updated with
the launcher's per-worker variables, not replaced: so the server is used only while the caller's
environment, directory and path are those it started with; otherwise it is stopped and the
call starts a new one (debug log says why).
"""

from __future__ import annotations

import os
import sys

from torchjob.logs import get_logger

logger = get_logger()

PRELOAD = ["torch", "torch.distributed", "torchjob.sdk.elastic", "torchjob.sdk.results"]
_started_with: list[tuple[object, ...]] = []  # what the running server was started with


def _now() -> tuple[object, ...]:
    return (sorted(os.environ.items()), os.getcwd(), tuple(sys.path))


def _what_changed(then: tuple[object, ...], now: tuple[object, ...]) -> str:
    if then[1] != now[1]:
        return "the working directory"
    if then[2] != now[2]:
        return "sys.path"
    before, after = dict(then[0]), dict(now[0])  # type: ignore[call-overload]
    names = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return "the environment (" + ", ".join(names[:5]) + ")"


def prepare() -> str:
    """The start method for this call's workers: ``forkserver``, the server made fit first."""
    import multiprocessing.forkserver as forkserver

    server = forkserver._forkserver
    now = _now()
    running = getattr(server, "_forkserver_pid", None) is not None
    if running and _started_with and _started_with[0] != now:
        logger.debug("warm elastic: %s changed: a new fork server", _what_changed(_started_with[0], now))
        server._stop()  # type: ignore[attr-defined]
        running = False
    if not running:
        server.set_forkserver_preload(PRELOAD)
        _started_with[:] = [now]
    return "forkserver"
