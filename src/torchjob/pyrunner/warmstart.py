"""torchjob's runner: a program run as Python would, its end recorded; pre-warmed; a rank's guard.

This file is not imported by torchjob; engines start it as ``pyrunner/pyrun.py`` says. The
local engine starts a main container's interpreter while the pod's init containers still run,
as ``python [its options] -c BOOT <this file> <fd> <timeout> <modules> <cwd> <the container's
arguments after the options>`` (see ``engines/local/prewarm.py``). ``BOOT``
loads this file into a private namespace and calls :func:`main`, which

1. sets ``sys.argv`` and ``sys.path[0]`` as a cold start would have them, and imports the modules
   (torch) with stdout and stderr set aside: when anything is printed or warned, or an import
   fails, the program will be started cold instead, in this same process (``execv``);
2. says ``w`` on ``fd`` (a socket the engine listens on: the imports are done), then blocks
   until the engine writes ``go`` on ``fd`` (its init containers succeeded), or ends
   without running anything on end of file (the engine discarded it, or died) or after
   ``timeout`` seconds;
3. runs the script, ``-m module`` or ``-c code`` in a clean ``__main__`` with the same
   ``sys.argv``, ``sys.path[0]``, ``sys.orig_argv``, working directory, stdio, signal handlers and
   exit status as ``python ...`` started then; an uncaught exception's traceback shows no frame of
   this file.

``fd`` ``-`` runs the program at once (a cold start through this runner, so that the marker below
is written); ``fd`` ``guard`` makes this process a rank's guard (:func:`_guard`), which runs the
rank itself with ``fd`` ``rank``: at once, and with whole-line output (:func:`_whole_lines`).
The guard is what ``$PYTHON_EXEC`` runs for torchrun's ranks on the local and the Slurm engine.

A torchrun agent (``-m torch.distributed.run``) gets ``agentbarrier.py``'s exit barrier first.

The program's end is recorded before the interpreter's teardown: when it returned or called
``sys.exit(0)``, ``0`` is written to ``$TORCHJOB_FINISHED`` (a file, or ``fd:N``), a variable taken
out of the environment before the program starts. torch 2.13 can abort (SIGABRT, "terminate called
without an active exception") in that teardown, after all the work is done; whoever waits for the
process (the engine for a pod, the guard for a torchrun rank) then counts it as a success, with a
note, because the marker says the program itself had finished. An abort without the marker (during
the program, or after a failure) stays a failure.

Standard library only, and only what the interpreter has loaded anyway (os, sys) before the program
runs: the modules a program finds in ``sys.modules`` are those a cold start has, plus the warmed ones.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # for mypy only: typing would load re, enum and more before every rank's start
    from types import CodeType, TracebackType
    from typing import Any, NoReturn

GO = b"go"
WARM = b"w"  # said back on the fd once the modules are imported
FINISHED = "TORCHJOB_FINISHED"  # where the program's successful end is recorded (see above)
NO_WAIT = "-"  # the fd argument of a cold start through the runner
GUARD = "guard"  # the fd argument of a rank's guard
RANK = "rank"  # the fd argument of a rank the guard runs: NO_WAIT, with whole-line output


def main() -> None:
    boot = sys._getframe(1).f_code
    here, fd_text, timeout_text, modules_text, cwd = sys.argv[1:6]
    tail = sys.argv[6:]  # the container's argv after the interpreter and its options
    if fd_text == GUARD:
        _guard(tail)
    if fd_text == RANK:
        _whole_lines()
    fd = -1 if fd_text in (NO_WAIT, RANK) else int(fd_text)
    # orig_argv is [python, *options, "-c", BOOT, *sys.argv[1:]]: the cold command is python,
    # its options and the tail.
    cold = sys.orig_argv[: len(sys.orig_argv) - len(sys.argv) - 1] + tail
    mode, target, args = _parse(tail)
    try:
        sys.argv[:] = [target if mode == "script" else f"-{mode}", *args]
        sys.path[0] = _path0(mode, target)
        warm = _warm([m for m in modules_text.split(",") if m])
        if fd >= 0:
            _tell_warm(fd)
        go = fd < 0 or _wait(fd, float(timeout_text))
    except Exception:  # not a word in the container's log: the engine starts it cold instead
        os._exit(0)
    if not go:
        os._exit(0)  # discarded: the program never runs
    if fd >= 0:
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


def _whole_lines() -> None:
    """A rank's stdout and stderr write each line in one piece.

    The ranks of a pod share its output pipe. ``print`` unbuffered (PYTHONUNBUFFERED, as pods
    have it) writes the text and the newline separately, and block-buffered it writes chunks
    that cut lines, so two ranks printing at once could mix into one line. Line buffering keeps
    each line (up to the pipe's atomic size) whole; a partial line shows at its newline or at an
    explicit flush, as tqdm and ``print(flush=True)`` do.
    """
    for stream in (sys.stdout, sys.stderr):
        if stream is not None and hasattr(stream, "reconfigure"):
            stream.reconfigure(write_through=False, line_buffering=True)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()


def _tell_warm(fd: int) -> None:
    """Say on ``fd`` (a socket: the engine's end reads it) that the imports are done: the master,
    importing the same modules, is likely about to listen (engines/local/nudge.py)."""
    try:  # noqa: SIM105 - contextlib is not loaded before the program runs (see above)
        os.write(fd, WARM)
    except OSError:  # a one-way pipe: the engine does not listen
        pass


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
    marker = os.environ.pop(FINISHED, None)  # the program's own children do not inherit it
    if marker and marker.startswith("fd:") and marker[3:].isdigit():
        try:
            os.set_inheritable(int(marker[3:]), False)  # nor that pipe, through exec
        except OSError:
            marker = None
    watch = _beside("mainguard.py", files).get("watch")  # a doomed spawn refused in the rank
    if watch is not None:
        watch()
    if mode == "m":
        import runpy

        if target in AGENTS:  # its exit barrier never outlives the store it waits on
            patch = _beside("agentbarrier.py", files).get("store_owner_leaves_last")
            if patch is not None:
                patch()
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
    except SystemExit as err:
        if err.code is None or (isinstance(err.code, int) and err.code == 0):
            _finished(marker)
        raise
    except BaseException as err:
        _report(err, files, boot)
    else:
        _finished(marker)


AGENTS = ("torch.distributed.run", "torch.distributed.launch")  # torchrun's agent, run as -m


def _beside(name: str, files: set[str]) -> dict[str, Any]:
    """The names of ``name``, a file beside this one, run in a namespace of its own (torchjob
    itself may not be importable here); added to ``files``, whose frames a traceback leaves out.
    Empty when it cannot be read. (This file is found by its code's name: it is loaded from its
    path by BOOT or the fork server, never as a module with a ``__file__`` of its own.)"""
    path = os.path.join(os.path.dirname(_beside.__code__.co_filename), name)
    namespace: dict[str, Any] = {"__name__": "torchjob_" + name.removesuffix(".py")}
    try:  # through the source loader, as BOOT loads this file: its cached bytecode when current
        loader = sys.modules["_frozen_importlib_external"].SourceFileLoader(namespace["__name__"], path)
        exec(loader.get_code(namespace["__name__"]), namespace)
    except Exception:
        return {}
    files.add(path)
    return namespace


def _finished(marker: str | None) -> None:
    """Record that the program ended with code 0, before the interpreter's teardown."""
    if not marker:
        return
    try:
        if marker.startswith("fd:"):
            fd = int(marker[3:])
        else:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(marker, flags, 0o600)
        os.write(fd, b"0")
        os.close(fd)
    except (OSError, ValueError):
        pass  # no marker: an abort in the teardown then counts as the failure it looks like


_FLAGS = frozenset("uOBsEbq")  # interpreter options a guard passes on to its rank unchanged


def _split_options(tail: list[str]) -> tuple[list[str], list[str]] | None:
    """``[options..., script or -m/-c ..., args...]`` as (options, rest); None for a form the
    runner does not reproduce."""
    i = 0
    while i < len(tail) and tail[i].startswith("-") and tail[i] not in ("-c", "-m"):
        arg = tail[i]
        if arg in ("-W", "-X") and i + 1 < len(tail):
            i += 2
            continue
        if not (arg.startswith(("-W", "-X")) and len(arg) > 2) and (
            arg.startswith("--") or not arg[1:] or not set(arg[1:]) <= _FLAGS
        ):
            return None
        i += 1
    rest = tail[i:]
    if not rest or (rest[0] in ("-c", "-m") and len(rest) < 2):
        return None
    return tail[:i], rest


def _guard(tail: list[str]) -> NoReturn:
    """A torchrun rank's process, as ``$PYTHON_EXEC [options] SCRIPT ARGS`` (torchrun starts its
    ranks with the interpreter that variable names): runs the rank through this runner as a child
    and ends as it ended, except that a rank whose program finished (the marker) and then aborted
    in the interpreter's teardown ends with 0 and one note. torchrun would otherwise count that
    rank as failed, stop the node's other ranks and fail the whole job after the work was done.

    Signals: torchrun stops a rank by signalling its process group, which holds both; the guard
    waits for the rank and then dies of the same signal, so torchrun sees what it would have seen.
    """
    import signal

    python = sys.orig_argv[0]
    split = _split_options(tail)
    if split is None:
        os.execv(python, [python, *tail])  # not a form the runner reproduces: the rank unguarded
    options, rest = split
    boot = sys.orig_argv[len(sys.orig_argv) - len(sys.argv)]  # [python, *opts, -c, BOOT, *argv[1:]]
    argv = [python, *options, "-c", boot, sys.argv[1], RANK, "0", "", os.getcwd(), *rest]
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)
    env = dict(os.environ)
    env[FINISHED] = f"fd:{write_end}"
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            os.execve(python, argv, env)
        finally:
            os._exit(127)
    os.close(write_end)
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)  # the rank has them; it ends first
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    os.set_blocking(read_end, False)  # a child of the rank may hold the pipe open still
    try:
        finished = os.read(read_end, 1) == b"0"
    except OSError:
        finished = False
    if code == -signal.SIGABRT and finished:
        rank = os.environ.get("RANK", "?")
        sys.stderr.write(
            f"torchjob: rank {rank}: the program finished (exit code 0), then the interpreter "
            "aborted (SIGABRT) while shutting down, as torch 2.13 can at exit; counted as success\n"
        )
        sys.stderr.flush()
        os._exit(0)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        os._exit(128 - code)
    os._exit(code)


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
