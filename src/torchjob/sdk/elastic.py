"""Running a call under torch's elastic launcher (what ``torchrun`` does), on one node or many.

Used in two places: by the caller for a single-node ``Elastic`` task with several processes, and
by the in-pod entrypoint for multi-node tasks. Each worker process runs :func:`elastic_child`,
which records its own exception for the caller before the launcher tears the group down.

The rendezvous progress a caller is shown (``2/4 nodes joined``) is read from the results
directory, where each node and the first worker say they are there: never from the c10d store,
whose values are pickles anyone who reaches its port could have written.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cloudpickle

from torchjob.logs import get_logger
from torchjob.sdk.leftovers import stopped_after, worker_here
from torchjob.sdk.quick_exit import exit_now
from torchjob.sdk.results import PROGRESS_FILE, run_call, write_error, write_failure

logger = get_logger()

NODES = "nodes"  # in the results directory: a file per node whose agent joins, and COMPLETE
COMPLETE = ".complete"  # written by the first worker to start: the rendezvous is complete


class LaunchFailed(Exception):
    """One or more worker processes failed; their records are in the results directory."""


class DeadlinePassed(Exception):
    """The launch ran longer than its deadline; the launcher stopped every worker."""


@dataclass
class LaunchSettings:
    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    run_id: str
    rdzv_endpoint: str
    rdzv_configs: dict[str, Any] = field(default_factory=dict)
    max_restarts: int = 0
    monitor_interval: float = 0.1
    start_method: str = "spawn"
    deadline: float | None = None  # seconds for the whole launch (RunPolicy.active_deadline_seconds)
    warm: bool = False  # spawn's workers forked from this process's fork server (warm_elastic.py)
    caller: bool = False  # launched by a single-node call's caller: its strays are stopped (leftovers.py)


def elastic_child(payload: bytes, results: str) -> bytes | None:
    """The body of every worker process: run the call, report rank 0's value or this rank's error."""
    worker_here(results)  # first: a worker its launcher never learned of is found (leftovers.py)
    rank = int(os.environ.get("RANK", "0"))
    _whole_lines()
    _mark(results, COMPLETE)  # workers start once the rendezvous is complete
    try:  # loading, running and pickling the value: any failure is this rank's error
        value = run_call(payload)
        # Only rank 0's value is returned to the caller; the others are not worth pickling.
        data = cloudpickle.dumps(value) if rank == 0 else None
    except BaseException as err:
        write_error(results, rank, err)
        if isinstance(err, KeyboardInterrupt):
            # torch's process wrapper takes a KeyboardInterrupt for its parent's doing and ends the
            # process with code 0 and no value, which its launcher then waits for without end.
            exit_now(130)
        raise
    # torch's wrapper hands the value to the launcher and waits until it has been read; the
    # worker process then exits normally. Registered last, this runs first at exit and ends the
    # process before the interpreter finalizes (see torchjob.sdk.quick_exit). Code 0 is right:
    # the task has succeeded, and all that is left is torch passing on bytes already pickled.
    atexit.register(exit_now, 0)
    return data


def _whole_lines() -> None:
    """This worker's stdout and stderr write each line in one piece.

    The workers of a node share its output. Unbuffered (PYTHONUNBUFFERED, as pods run), ``print``
    writes the text and the newline apart; block-buffered, it writes 8 KiB chunks that cut lines.
    Either way two workers printing at once could share a line. Line buffering keeps each line
    whole (up to the pipe's atomic size); a partial line shows at its newline or at an explicit
    flush. torchrun's ranks get the same from the rank guard.
    """
    for stream in (sys.stdout, sys.stderr):
        if stream is not None and hasattr(stream, "reconfigure"):
            with contextlib.suppress(Exception):  # a replaced stream keeps its own buffering
                stream.reconfigure(write_through=False, line_buffering=True)


@contextlib.contextmanager
def _quiet_torch() -> Iterator[None]:
    """Hide the launcher's own failure dumps: the caller gets the rank's error, with its traceback."""
    if logger.isEnabledFor(logging.DEBUG):
        yield
        return
    loggers = [logging.getLogger(n) for n in ("torch.distributed.elastic", "torch.multiprocessing")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)


@contextlib.contextmanager
def _main_not_reimported() -> Iterator[None]:
    """Keep spawned workers from re-running the caller's script.

    multiprocessing's spawn imports the parent's ``__main__`` in every child (by path or module
    name), which re-runs a script's top-level code, and a top-level task call would launch again.
    The workers get the function by value from the payload, so they do not need ``__main__``.
    """
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved: dict[str, Any] = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


@contextlib.contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    """Raise :class:`DeadlinePassed` in this thread after ``seconds``, wherever it is then.

    The launcher runs in the caller's thread and has no timeout of its own. An exception raised
    into its monitoring loop takes the same way out as any other error: the agent stops every
    worker in its ``finally``. (A signal would reach only the main thread, and would be the
    caller's.) Not while the agent starts its workers, though: raised between the fork server's
    fork of a worker and the agent's note of its pid, it left that worker running unseen (a
    sleeping rank outlived the call); the exception waits until the start is over. The lock makes
    sure nothing is raised once the launch has returned.
    """
    if seconds is None:
        yield
        return
    target = threading.get_ident()
    lock = threading.Lock()
    finished = False
    timers: list[threading.Timer] = []

    def expire() -> None:
        with lock:
            if finished:
                return
            if len(timers) < START_RECHECKS and _starting_workers(sys._current_frames().get(target)):
                _arm(START_RECHECK)  # once the workers are known to the agent (a stuck start: not)
                return
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(target), ctypes.py_object(DeadlinePassed)
            )

    def _arm(delay: float) -> None:
        timer = threading.Timer(delay, expire)
        timer.daemon = True
        timers.append(timer)
        timer.start()

    _arm(seconds)
    try:
        yield
    finally:
        with lock:
            finished = True
        for timer in timers:
            timer.cancel()


START_RECHECK = 0.05  # seconds between looks at a launcher that is starting its workers
START_RECHECKS = 200  # 10 s: a start that takes longer is stuck, and the deadline is raised into it


def _starting_workers(frame: Any) -> bool:
    """Whether the launcher's thread is inside torch's agent starting its workers."""
    while frame is not None:
        if frame.f_code.co_name == "_start_workers" and "torch" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


# The signals torch's launcher takes over while its workers run (LaunchConfig.signals_to_handle).
_LAUNCHER_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


@contextlib.contextmanager
def _own_signal_handlers() -> Iterator[dict[signal.Signals, Any]]:
    """Give the caller's signal handlers back after the launch (torch never restores them).

    Without this, Ctrl-C anywhere in the caller's program after an elastic call would raise
    torch's ``SignalException`` instead of ``KeyboardInterrupt``.
    """
    saved: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for name in _LAUNCHER_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                saved[sig] = signal.getsignal(sig)
    try:
        yield saved
    finally:
        for sig, handler in saved.items():
            if handler is not None:  # None: set outside Python, cannot be put back
                signal.signal(sig, handler)


def _answer_signal(sigval: signal.Signals, saved: dict[signal.Signals, Any]) -> None:
    """Handle a signal the launcher caught as this process would have without it.

    The workers are stopped by now. Ctrl-C with Python's own handler becomes KeyboardInterrupt;
    otherwise the signal is raised again under the caller's handler (SIGTERM's default ends the
    process, as it would have).
    """
    handler = saved.get(sigval, signal.default_int_handler if sigval == signal.SIGINT else None)
    if sigval == signal.SIGINT and handler is signal.default_int_handler:
        raise KeyboardInterrupt
    if handler is not None:
        signal.signal(sigval, handler)
        signal.raise_signal(sigval)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold the launcher's signals while torch is imported, and deliver them once it is.

    A Ctrl-C that came while torch was being imported was sometimes lost without a trace (about
    one in fifteen, measured on torch 2.13: the KeyboardInterrupt raised inside native code that
    the import runs does not always come out of it), and the call went on as if nothing had been
    pressed. Held, the signal is handled by Python once the import is done.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {getattr(signal, name) for name in _LAUNCHER_SIGNALS if hasattr(signal, name)}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)  # what came meanwhile is handled now


def launch(payload: bytes, results: str, settings: LaunchSettings) -> tuple[bool, Any]:
    """Run the call on this node's ``nproc_per_node`` workers; (True, value) if rank 0 is here."""
    # For the workers only (ours, and torch's launcher's): the caller's environment is left as it
    # was, so that the next call, and a warm server's check, see the same one.
    saved = {name: os.environ.get(name) for name in ("OMP_NUM_THREADS", "TORCHELASTIC_SIGNALS_TO_HANDLE")}
    try:
        return _launch(payload, results, settings)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _launch(payload: bytes, results: str, settings: LaunchSettings) -> tuple[bool, Any]:
    with _signals_held():  # a Ctrl-C during torch's import is not lost (see there)
        from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    if "OMP_NUM_THREADS" not in os.environ and settings.nproc_per_node > 1:
        # As torchrun does: N processes each using every core would oversubscribe the machine.
        os.environ["OMP_NUM_THREADS"] = "1"
    start_method = settings.start_method
    if settings.warm and start_method == "spawn":  # the default; a start method asked for is kept
        from torchjob.sdk.warm_elastic import prepare

        start_method = prepare()
    config = LaunchConfig(
        min_nodes=settings.min_nodes,
        max_nodes=settings.max_nodes,
        nproc_per_node=settings.nproc_per_node,
        run_id=settings.run_id,
        rdzv_endpoint=settings.rdzv_endpoint,
        rdzv_backend="c10d",
        rdzv_configs=dict(settings.rdzv_configs),  # LaunchConfig adds keys in place
        max_restarts=settings.max_restarts,
        monitor_interval=settings.monitor_interval,
        start_method=start_method,
        logs_specs=DefaultLogsSpecs(log_dir=str(Path(results) / "elastic-logs")),
    )
    logger.debug(
        "elastic launch: nodes %d:%d, %d process(es) per node, rendezvous c10d at %s (run id %s), "
        "max_restarts=%d, start_method=%s",
        settings.min_nodes, settings.max_nodes, settings.nproc_per_node, settings.rdzv_endpoint,
        settings.run_id, settings.max_restarts, start_method,
    )  # fmt: skip
    try:
        with _quiet_torch(), _main_not_reimported(), _own_signal_handlers() as handlers:
            stopped_by: signal.Signals | None = None
            try:
                # The workers its launcher never learned of, and what the ranks started themselves,
                # daemons included (leftovers.py).
                rest = (
                    stopped_after(results, settings.run_id, _fork_server)
                    if settings.caller
                    else contextlib.nullcontext()
                )
                with rest, _deadline(settings.deadline):
                    out = elastic_launch(config, elastic_child)(payload, results)
            except SignalException as err:
                stopped_by = err.sigval
            if stopped_by is not None:  # outside the except: torch's exception is no context of ours
                _answer_signal(stopped_by, handlers)
                raise LaunchFailed(f"the launch was stopped by {stopped_by.name}")
    except ChildFailedError as err:
        for rank, failure in err.failures.items():
            # Ranks killed before they could write their own record (signals, os._exit).
            how = f"exit code {failure.exitcode}"
            if failure.signal_name() != "<N/A>":
                how = f"signal {failure.signal_name()}"
            # ChildFailedError comes once the launcher's restarts are used up: its last attempt.
            when = float(failure.timestamp)
            write_failure(
                results, rank, "ProcessExited", f"worker process died with {how}", when, settings.max_restarts
            )
        raise LaunchFailed(str(err)) from None
    if 0 in out:
        return True, cloudpickle.loads(out[0])
    return False, None


def _fork_server() -> set[int]:
    import multiprocessing.forkserver as forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    return {pid} if isinstance(pid, int) else set()


def _mark(results: str, name: str) -> None:
    """Create ``<results>/nodes/<name>`` (empty): plain data that only this user can write."""
    folder = os.path.join(results, NODES)
    with contextlib.suppress(OSError):
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.close(
            os.open(
                os.path.join(folder, name), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
        )


def node_joins(results: str) -> None:
    """Say, for the caller's progress, that this node's agent goes to the rendezvous (a node is
    named by its pod, so a restarted pod counts once)."""
    _mark(results, os.environ.get("TORCHJOB_POD_NAME") or os.environ.get("HOSTNAME") or str(os.getpid()))


def rendezvous_progress(results: str) -> tuple[int, bool]:
    """(nodes joined, whether the rendezvous is complete), as the nodes and workers said it."""
    try:
        names = os.listdir(os.path.join(results, NODES))
    except OSError:
        return 0, False
    return len([n for n in names if n != COMPLETE]), COMPLETE in names


def watch_rendezvous(results: str, max_nodes: int, stop: threading.Event) -> None:
    """Write "k/N nodes joined" lines to the results directory as nodes join (until complete)."""
    with contextlib.suppress(OSError):  # a restarted job's: its workers have not started yet
        os.unlink(os.path.join(results, NODES, COMPLETE))
    path = Path(results) / PROGRESS_FILE
    last = ""
    while not stop.wait(0.2):
        joined, complete = rendezvous_progress(results)
        if not joined:
            continue
        line = f"{joined}/{max_nodes} nodes joined" + (", rendezvous complete" if complete else "")
        if line != last:
            with path.open("a") as handle:
                handle.write(line + "\n")
            last = line
        if complete:
            return
