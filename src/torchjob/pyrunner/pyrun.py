"""Starting a python program through torchjob's runner (``warmstart.py`` beside this file).

The runner runs a program as ``python ...`` would, and records that it ended with code 0 before
the interpreter's teardown. Engines start it with :data:`BOOT`; the local and Slurm engines for
every python main container (``pycommand.py``: at once, or pre-warmed locally), and for torchrun's ranks: a
torchrun agent starts each rank with the interpreter ``$PYTHON_EXEC`` names, and
:func:`guard_shim` is that interpreter, a script that makes the rank's process a guard
(``warmstart._guard``). The guard runs the rank through the runner with whole-line output (the
ranks of a pod share its output) and counts a rank that finished and then aborted in the
interpreter's teardown (SIGABRT, as torch 2.13 can) as a success.

Light on purpose: it is imported when an engine starts a job, never by the CLI's own start.
"""

from __future__ import annotations

import os

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warmstart.py")
BESIDE = ("agentbarrier.py", "mainguard.py")  # what the runner loads beside it: a copy needs them
FINISHED = "TORCHJOB_FINISHED"  # warmstart.py's marker of a program that ended with code 0
WARM = b"w"  # what warmstart.py says back on its fd once its modules are imported
NO_WAIT, GUARD = "-", "guard"  # warmstart.py's fd argument: run at once; be a torchrun rank's guard
RANK_SHIM = "torchjob-rank"  # in a job's bin: $PYTHON_EXEC, the interpreter torchrun starts ranks with
PYTHON_EXEC = "PYTHON_EXEC"  # the variable torchrun reads it from
# Loads the runner into a namespace of its own, so that __main__ can be handed to the program clean.
# Its code comes through the interpreter's own source loader (already loaded at start), which reads
# the cached bytecode in __pycache__ when it is current and compiles (and caches, where allowed)
# otherwise, as an import would: compiling it anew cost each process some 2 ms.
# Should that fail (a runAsUser that cannot read torchjob's files, an install removed under a
# running job), a process that runs its program at once (``-``, a rank's ``guard`` or ``rank``)
# becomes that program started cold (``python [its options] <its arguments>``; a rank's guard with
# none of its own ``-I -S``): ending with 0 unrun would be a success that never ran. A warm process
# (a pipe's fd) or the fork server ends without a word; the engine then starts the container cold.
BOOT = (
    "import os,sys\n"
    "try:\n"
    " n={'__name__':'torchjob_prewarm','__builtins__':__builtins__}\n"
    " l=sys.modules['_frozen_importlib_external'].SourceFileLoader(n['__name__'],sys.argv[1])\n"
    " exec(l.get_code(n['__name__']),n)\n"
    "except BaseException:\n"
    " a,o=sys.argv,sys.orig_argv\n"
    " if a[2] not in('-','guard','rank'):os._exit(0)\n"
    " os.execv(o[0],(o[:1] if a[2]=='guard' else o[:len(o)-len(a)-1])+a[6:])\n"
    "n['main']()\n"
)


def guard_shim(python: str, runner: str = RUNNER) -> str:
    """The script torchrun starts each rank with (``$PYTHON_EXEC``): the guard of ``runner`` (this
    warmstart.py, or a copy of it), in ``python``. Every word is quoted: paths with spaces or
    quotes reach no shell as code."""
    words = [python, "-I", "-S", "-c", BOOT, runner, GUARD, "0", "", "."]
    quoted = ("'" + w.replace("'", "'\\''") + "'" for w in words)  # shlex.quote, without importing re
    return "#!/bin/sh\nexec " + " ".join(quoted) + ' "$@"\n'
