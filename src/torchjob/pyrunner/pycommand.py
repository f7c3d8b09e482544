"""Which container commands are torchjob's python, and such a command as the runner starts it.

One rule for every engine that runs a job's containers itself (local, Slurm), so that a job
behaves alike on both:

- a command ``python``, ``python3`` or ``python3.N`` is the interpreter torchjob runs in
  (:data:`PYTHON`; the engine puts ``sys.executable`` in its place);
- a main container whose command is that interpreter starts through torchjob's runner
  (``pyrun.py``, ``warmstart.py``) when the runner can start it exactly as ``python ...`` would
  (:func:`runner_argv`: a script, ``-m`` or ``-c``, with options that change nothing but flags);
  the runner records in ``$TORCHJOB_FINISHED`` that the program ended with code 0, before the
  interpreter's teardown;
- such a container that then aborted in that teardown (SIGABRT, exit code 134, as torch 2.13 can)
  is counted as a success with :data:`TEARDOWN_NOTE` in its log (:func:`finished`); an abort
  without the marker stays the failure it looks like.

Imported when an engine starts a job, never by the CLI's own start.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
from collections.abc import Mapping, Sequence

from torchjob.pyrunner.pyrun import BOOT, RUNNER

PYTHON = re.compile(r"python(3(\.\d+)?)?")  # a command that runs this interpreter (sys.executable)
TEARDOWN_ABORT = 128 + signal.SIGABRT  # a container's exit code when SIGABRT ended it
TEARDOWN_NOTE = (
    "the program finished (exit code 0), then the interpreter aborted (SIGABRT) while shutting "
    "down, as torch 2.13 can at exit; counted as success"
)
_LINUX = sys.platform.startswith("linux")  # the runner sets a warm start's output aside in a memfd
_FLAGS = frozenset("uOBsEbq")  # interpreter options passed on unchanged: sys.flags stay the same


def runner_argv(
    argv: Sequence[str],
    env: Mapping[str, str],
    fd: int | str,
    timeout: str,
    modules: Sequence[str],
    cwd: str,
    runner: str = RUNNER,
) -> list[str] | None:
    """``argv`` (a container's command, its python already ``sys.executable``) started through the
    runner ``runner``, or None when a cold start is the only sure way (not torchjob's python, or
    an interpreter option or form whose effect could not be the same). ``fd`` is the runner's
    pipe to wait on, ``"-"`` (pyrun.NO_WAIT) to run at once; ``modules`` what it imports while it
    waits, ``timeout`` how long it may, ``cwd`` the working directory the program starts in."""
    if not argv or not _LINUX or argv[0] != sys.executable or env.get("PYTHONINSPECT"):
        return None
    options: list[str] = []
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("-c", "-m"):
            if i + 1 >= len(argv):
                return None
            break
        if not arg.startswith("-"):
            break  # the script
        if arg in ("-W", "-X") and i + 1 < len(argv):
            options += argv[i : i + 2]
            i += 2
            continue
        if arg.startswith(("-W", "-X")) and len(arg) > 2:
            options.append(arg)
        elif arg.startswith("--") or not arg[1:] or not set(arg[1:]) <= _FLAGS:
            return None  # -i, -I, -P, -x, -d, -, --help: not reproduced; cold
        else:
            options.append(arg)
        i += 1
    if i >= len(argv):
        return None  # an interactive interpreter
    return [argv[0], *options, "-c", BOOT, runner, str(fd), timeout, ",".join(modules), cwd, *argv[i:]]


def finished(marker: str) -> bool:
    """The runner recorded in ``marker`` (a container run's ``$TORCHJOB_FINISHED``) that the
    program ended with code 0."""
    try:
        with open(marker, "rb") as handle:
            return handle.read(1) == b"0"
    except OSError:
        return False


def forget(marker: str) -> None:
    """Before a new run of the container: the last run's marker does not speak for it."""
    with contextlib.suppress(OSError):
        os.unlink(marker)
