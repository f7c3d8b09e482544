"""The ``torchjob`` command line; its commands are in ``app.py``.

``main`` is the program's entry point. It lives apart from the commands so that the program sets
its garbage collector up before importing them, and so that it can end without tearing the
interpreter down.
"""

from __future__ import annotations

import gc
import os
import sys

from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

# Starting a job (imports, loading the job, starting its pods) makes about 25,000 objects that
# live as long as the program and almost no garbage; with Python's threshold of 700 new objects
# the collector ran about 40 times on the way, 3.3 ms of a 57 ms `torchjob run`
# (benchmarks/README.md). Past this many new objects it still runs, so a supervisor that lives
# for days frees its reference cycles as usual.
PROGRAM_GC_THRESHOLD = 50_000


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``torchjob`` with ``argv`` (the program's arguments when None); give its exit code."""
    program = argv is None  # the torchjob program itself, not a caller in Python
    try:
        if program:
            sys.unraisablehook = _ctrl_c_kept
            gc.set_threshold(PROGRAM_GC_THRESHOLD, *gc.get_threshold()[1:])
            from torchjob.spec import prefetch

            prefetch.start(sys.argv[1:])  # the job file, read on another core while the rest imports
        from torchjob.cli.app import dispatch
        from torchjob.engine_api.base import ThisProcess

        ThisProcess.ends_with_command = program
        code = dispatch(argv)
        if program:
            _leave(code)
    except (KeyboardInterrupt, Exception) as err:  # a Ctrl-C before the command's own handling
        if not _from_ctrl_c(err):  # (imports, parsing), or after it; anything else goes on up
            raise
        code = _interrupted()
        if program:
            _leave(code)
    return code


def _from_ctrl_c(err: BaseException) -> bool:
    """Whether ``err`` stands for a Ctrl-C: it is one, or Python wrapped one in it (a Ctrl-C that
    lands in a class's creation, a descriptor's ``__set_name__`` while a module is imported,
    becomes a RuntimeError)."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def _ctrl_c_kept(unraisable: sys.UnraisableHookArgs) -> None:
    """A Ctrl-C that lands where Python cannot raise it (a weakref callback of the import system,
    a finalizer) would be printed as "Exception ignored" with a traceback and then lost, the
    command going on as if no one had pressed it. Deliver it again from another thread, which
    lands once this hook has returned (raised here, it would be lost the same way)."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        import _thread

        _thread.start_new_thread(_thread.interrupt_main, ())
        return
    sys.__unraisablehook__(unraisable)


EXIT_INTERRUPTED = 130  # as torchjob.errors says; not imported: this runs before any import


def _interrupted() -> int:
    """One line and exit code 130 for a Ctrl-C that came before the command could handle it (or as
    it ended); a second Ctrl-C while it is said is ignored, as the program is ending anyway."""
    import contextlib
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError, ValueError):
        print("torchjob: interrupted", file=sys.stderr, flush=True)
    return EXIT_INTERRUPTED


def _leave(code: int) -> None:
    """End the program with ``code`` now, without the interpreter's teardown, when nothing needs it.

    The teardown frees every object one by one, memory the exit frees anyway: about 2 ms of every
    command (benchmarks/README.md). What it is for still happens here: the exit handlers run and
    standard output and error are flushed. It is kept when another thread still runs (the
    teardown waits for it), when the SDK ran the user's Python in this process (its objects may
    count on their finalizers), and when the output cannot be flushed (the interpreter reports it).
    """
    gc.freeze()  # if the teardown happens, its final collection skips what lived this long
    threading = sys.modules.get("threading")
    if "torchjob.sdk" in sys.modules or (threading is not None and threading.active_count() > 1):
        return
    import atexit

    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        return
    os._exit(code)
