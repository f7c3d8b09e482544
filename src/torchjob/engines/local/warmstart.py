"""The pre-warmed interpreter of a container: import torch early, then run the program as Python would.

This file is not imported by torchjob. The engine starts a main container's interpreter while the
pod's init containers still run, as ``python [its options] -c BOOT <this file> <fd> <timeout>
<modules> <cwd> <the container's arguments after the options>`` (see ``prewarm.py``). ``BOOT``
loads this file into a private namespace and calls :func:`main`, which

1. sets ``sys.argv`` and ``sys.path[0]`` as a cold start would have them, and imports the modules
   (torch) with stdout and stderr set aside: when anything is printed or warned, or an import
   fails, the program will be started cold instead, in this same process (``execv``);
2. blocks until the engine writes ``go`` on ``fd`` (its init containers succeeded), or ends
   without running anything on end of file (the engine discarded it, or died) or after
   ``timeout`` seconds;
3. runs the script, ``-m module`` or ``-c code`` in a clean ``__main__`` with the same
   ``sys.argv``, ``sys.path[0]``, ``sys.orig_argv``, working directory, stdio, signal handlers and
   exit status as ``python ...`` started then; an uncaught exception's traceback shows no frame of
   this file.

Standard library only, and only what the interpreter has loaded anyway (os, sys) before the program
runs: the modules a program finds in ``sys.modules`` are those a cold start has, plus the warmed ones.
"""

from __future__ import annotations

import os
import sys
from types import CodeType, TracebackType
from typing import Any, NoReturn

GO = b"go"


def main() -> None:
    boot = sys._getframe(1).f_code
    here, fd_text, timeout_text, modules_text, cwd = sys.argv[1:6]
    tail = sys.argv[6:]  # the container's argv after the interpreter and its options
    fd = int(fd_text)
    # orig_argv is [python, *options, "-c", BOOT, *sys.argv[1:]]: the cold command is python,
    # its options and the tail.
    cold = sys.orig_argv[: len(sys.orig_argv) - len(sys.argv) - 1] + tail
    mode, target, args = _parse(tail)
    try:
        sys.argv[:] = [target if mode == "script" else f"-{mode}", *args]
        sys.path[0] = _path0(mode, target)
        warm = _warm([m for m in modules_text.split(",") if m])
        go = _wait(fd, float(timeout_text))
    except Exception:  # not a word in the container's log: the engine starts it cold instead
        os._exit(0)
    if not go:
        os._exit(0)  # discarded: the program never runs
    os.close(fd)
    try:
        os.chdir(cwd)  # the same directory, or one an init container made anew at that path
    except OSError:
        os._exit(127)
    sys.path[0] = _path0(mode, target)  # an init container may have replaced a symlink
    sys.orig_argv[:] = cold
    if not warm:
        _exec(cold)
    _run(mode, target, cold, {here}, boot)


def _parse(tail: list[str]) -> tuple[str, str, list[str]]:
    if tail[0] in ("-c", "-m"):
        return tail[0][1], tail[1], tail[2:]
    return "script", tail[0], tail[1:]


def _path0(mode: str, target: str) -> str:
    """What Python 3.11 puts first on sys.path: '' for -c, the working directory for -m, and the
    directory of the script with symlinks resolved."""
    if mode == "c":
        return ""
    if mode == "m":
        return os.getcwd()
    return os.path.dirname(os.path.realpath(target))


def _warm(modules: list[str]) -> bool:
    """Import ``modules`` as the program would; False when that was not silent or failed."""
    if not modules:
        return True
    _flush()
    saved = [os.dup(1), os.dup(2)]
    aside = os.memfd_create("torchjob-prewarm", 0)
    os.dup2(aside, 1)
    os.dup2(aside, 2)
    ok = True
    try:
        for name in modules:
            __import__(name)
    except BaseException:
        ok = False
    finally:
        _flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
    quiet = os.fstat(aside).st_size == 0
    os.close(aside)
    return ok and quiet


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()


def _wait(fd: int, timeout: float) -> bool:
    import select  # loaded by torch already; only the wait needs it

    ready, _, _ = select.select([fd], [], [], timeout)
    return bool(ready) and os.read(fd, len(GO)) == GO


def _exec(argv: list[str]) -> NoReturn:
    """Start the command cold in this process (same pid, session, fds)."""
    import signal

    for name in ("SIGPIPE", "SIGXFSZ"):  # as the engine's Popen leaves them for a cold start
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    os.execv(argv[0], argv)


def _fresh_main(extra: dict[str, Any]) -> dict[str, Any]:
    """``__main__``'s namespace emptied to what the interpreter gives it at start."""
    import builtins

    main = sys.modules["__main__"].__dict__
    loader = main.get("__loader__")
    main.clear()
    main.update(
        __name__="__main__",
        __doc__=None,
        __package__=None,
        __loader__=loader,
        __spec__=None,
        __annotations__={},
        __builtins__=builtins,
    )
    main.update(extra)
    return main


def _run(mode: str, target: str, cold: list[str], files: set[str], boot: CodeType) -> None:
    if mode == "m":
        import runpy

        _fresh_main({})
        sys.argv[0] = "-m"
        code = None
    else:
        if mode == "c":
            source: bytes | str = target
            filename = "<string>"
            extra: dict[str, Any] = {}
        else:
            filename = target if os.path.isabs(target) else os.path.join(os.getcwd(), target)
            try:
                if target.endswith((".pyc", ".pyo")) or not os.path.isfile(target):
                    raise OSError  # a zip, a directory, bytecode: the interpreter's own way
                with open(target, "rb") as handle:
                    source = handle.read()
            except OSError:
                _exec(cold)
            # The class python itself gives a script's __main__ (importlib.machinery's, unimported).
            loader = sys.modules["_frozen_importlib_external"].SourceFileLoader
            extra = {"__file__": filename, "__cached__": None, "__loader__": loader("__main__", filename)}
        try:
            code = compile(source, filename, "exec", dont_inherit=True)
        except (SyntaxError, ValueError):
            _exec(cold)  # reported exactly as python reports it
        main = _fresh_main(extra)
    try:
        if code is None:
            run_module_as_main = getattr(runpy, "_run_module_as_main")  # noqa: B009 - what `python -m` calls
            run_module_as_main(target, alter_argv=True)
        else:
            exec(code, main)
    except SystemExit:
        raise
    except BaseException as err:
        _report(err, files, boot)


def _report(err: BaseException, files: set[str], boot: CodeType) -> NoReturn:
    tb: TracebackType | None = err.__traceback__
    while tb is not None and (tb.tb_frame.f_code is boot or tb.tb_frame.f_code.co_filename in files):
        tb = tb.tb_next
    err.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = type(err), err, tb
    sys.excepthook(type(err), err, tb)
    if not isinstance(err, KeyboardInterrupt):
        raise SystemExit(1) from None
    # Python ends a program that a Ctrl-C stopped by SIGINT, once it has cleaned up.
    import atexit
    import signal

    threading = sys.modules.get("threading")
    if threading is not None:
        threading._shutdown()
    atexit._run_exitfuncs()
    _flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    os._exit(130)
