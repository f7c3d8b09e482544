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
        _stop(server)
        running = False
    if not running:
        server.set_forkserver_preload(PRELOAD)
        _started_with[:] = [now]
    return "forkserver"


STOP_GRACE = 5.0  # seconds a replaced server gets to end once its pipe is closed


def _stop(server: object) -> None:
    """Stop multiprocessing's fork server, never waiting for it unbounded.

    Its own ``_stop`` closes the server's "alive" pipe and waits for the server to end. Any fork
    of this process made since (a user's ``os.fork``, a library's helper) holds that pipe too,
    so the server never sees it close and that wait never ends. After a grace it is killed.
    """
    import contextlib
    import signal
    import time

    pid = getattr(server, "_forkserver_pid", None)
    alive = getattr(server, "_forkserver_alive_fd", None)
    address = getattr(server, "_forkserver_address", None)
    if alive is not None:
        os.close(alive)
    if pid is not None:
        try:
            deadline = time.monotonic() + STOP_GRACE
            while os.waitpid(pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    logger.debug("warm elastic: the old fork server did not end: killed")
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)  # prompt after SIGKILL
                    break
                time.sleep(0.01)
        except (ChildProcessError, ProcessLookupError):
            pass  # already reaped, or not this process's child
    if isinstance(address, str) and address and not address.startswith("\0"):
        with contextlib.suppress(OSError):
            os.unlink(address)
    for name in ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid"):
        setattr(server, name, None)


def serve_from_here(nproc_per_node: int, results: str) -> tuple[str, str | None]:
    """In a pod's elastic agent (a multi-node call): the start method for its workers, and the
    directory of the server's socket, for the agent to remove once the launch is over (made in
    the call's private ``results`` directory, which the caller removes too, when a socket path
    there fits; the agent ends without running multiprocessing's own clean-up).

    The agent has torch imported (forked warm from the caller's pool, or imported for the
    launcher), so a fork of it, made while it is still single-threaded, is registered as
    multiprocessing's fork server: the launcher's ``forkserver`` workers are forked from it, fresh
    each call, without importing torch again. It is forked with the environment the launcher's
    spawned workers would inherit (the two variables the launcher sets first), and ends with the
    agent (its pipe from the agent closes; SIGKILL when the agent dies). ``spawn`` (cold) when
    this process already runs threads, which a fork would copy without their locks' owners.
    """
    import multiprocessing.forkserver as forkserver
    import socket
    import tempfile
    from multiprocessing import resource_tracker

    from torch.distributed.launcher.api import LaunchConfig

    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 0
    if threads != 1:
        logger.debug("warm elastic: the agent runs %d threads: workers spawned cold", threads)
        return "spawn", None
    # What torch's launcher sets before it starts workers (elastic.py sets the first as well).
    if "OMP_NUM_THREADS" not in os.environ and nproc_per_node > 1:
        os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = LaunchConfig.signals_to_handle
    resource_tracker.ensure_running()  # started by the agent, as ensure_running would
    server = forkserver._forkserver
    fits = len(os.path.abspath(results)) < 80  # a socket's path is at most 107 bytes
    directory = tempfile.mkdtemp(prefix="ranks-", dir=results if fits else None)  # 0700
    with socket.socket(socket.AF_UNIX) as listener:
        address = os.path.join(directory, "forkserver")
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        agent = os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the server
            code = 0
            try:
                os.close(alive_w)
                _die_with(agent)
                # A warm pod's os.environ warns of import-time variables set after the preload;
                # the launcher's per-worker ones (set once torch is imported, cold ranks too) are
                # no such thing.
                os.environ.__class__ = os._Environ
                forkserver.main(listener.fileno(), alive_r, [])
            except SystemExit:
                pass
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(alive_r)
    server._forkserver_address = address  # type: ignore[attr-defined]
    server._forkserver_alive_fd = alive_w  # type: ignore[attr-defined]
    server._forkserver_pid = pid  # type: ignore[attr-defined]
    logger.debug("warm elastic: workers forked from the agent's fork server (pid %d)", pid)
    return "forkserver", directory


def _die_with(parent: int) -> None:
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the agent died before the call above
        os._exit(0)
