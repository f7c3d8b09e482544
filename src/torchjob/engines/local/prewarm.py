"""Pre-warmed containers: a main container's interpreter imports torch while the init containers run.

A pod whose workers wait for the master (the pytorch plugin's wait-for-master init container)
would otherwise start each worker's interpreter, and import torch, only once the master listens:
about a second of CPU in series. Here a main container whose command is torchjob's ``python`` is
started at once as ``warmstart.py`` (see there): it imports the modules, says so (``w``) on a
socket pair whose other end the engine keeps (``nudge.py`` listens), and blocks on it. When
the init containers have succeeded the engine writes ``go`` and the same process runs the program
as a cold start would; when they fail, or the pod is stopped, it is killed and the program never
runs. Until then it is a process of the container like any other: its own session, the job's and
the pod's markers in its environment, its group told to the watchdog.

On by default; ``--no-prewarm`` turns it off for a run, the job annotation ``torchjob.io/prewarm:
"false"`` for a job, and ``"torch,numpy"`` names what to import instead of ``torch``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

from torchjob.engines.local import process
from torchjob.engines.local.containers import ContainerRun
from torchjob.errors import Issue

# The runner (pyrunner/warmstart.py), which commands it starts and how: shared with the Slurm engine.
from torchjob.pyrunner import pycommand
from torchjob.pyrunner.pyrun import BOOT as BOOT
from torchjob.pyrunner.pyrun import FINISHED as FINISHED
from torchjob.pyrunner.pyrun import NO_WAIT, WARM
from torchjob.pyrunner.pyrun import RUNNER as RUNNER
from torchjob.records import record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from torchjob.spec.model import Job

ANNOTATION = "torchjob.io/prewarm"
DEFAULT_MODULES = ("torch",)
MAX_WAIT = 600.0  # seconds a warm process may wait for its init containers; then it is discarded
_MODULE = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"  # compiled only for an annotation


def modules_of(job: Job) -> tuple[str, ...]:
    """What a job's warm processes import; empty when the job turned pre-warming off, or by
    default when more pods would wait warm than this machine has CPUs (see _fits)."""
    value = job.metadata.annotations.get(ANNOTATION)
    if value is None:
        return DEFAULT_MODULES if _fits(job) else ()
    if value.strip().lower() == "true":
        return DEFAULT_MODULES
    if value.strip().lower() == "false":
        return ()
    return tuple(m.strip() for m in value.split(","))


def _fits(job: Job) -> bool:
    """Whether the pods that would import torch while their init containers run are no more than
    the CPUs: more of them take the CPU the master needs to import torch and open its port, so the
    job ends later than cold (measured on 2 cores: 8 ranks 1.22x the bare floor pre-warmed, 1.03x
    cold; 2 ranks 0.93x against 1.50x). An annotation turns it on whatever the count."""
    waiting = sum(t.replicas for t in job.spec.tasks if t.template.spec.get("initContainers"))
    return waiting <= (os.cpu_count() or 1)


def check(job: Job) -> list[Issue]:
    value = job.metadata.annotations.get(ANNOTATION)
    if value is None or value.strip().lower() in ("true", "false"):
        return []
    names = [m.strip() for m in value.split(",")]
    if all(re.fullmatch(_MODULE, m) for m in names):
        return []
    return [
        Issue(
            f"metadata.annotations['{ANNOTATION}']",
            f"expected 'true', 'false' or module names separated by commas (torch,numpy), got {value!r}",
        )
    ]


def warm_argv(run: ContainerRun, fd: int | str, modules: tuple[str, ...], cwd: str) -> list[str] | None:
    """The command of the container's warm process, or None when a cold start is the only sure way
    (pyrunner/pycommand.py's rule, shared with the Slurm engine). ``fd`` ``"-"``: no wait, the
    program runs at once (:func:`cold_argv`)."""
    timeout = f"{MAX_WAIT + 60:g}"  # the engine discards it first; this only covers the engine vanishing
    return pycommand.runner_argv(run.argv, run.env, fd, timeout, modules, cwd)


def cold_argv(run: ContainerRun) -> list[str] | None:
    """A python container started now through the runner, which records how its program ended
    (warmstart.py's marker); None when the runner could not start it as python would."""
    return warm_argv(run, NO_WAIT, (), run.cwd or os.getcwd())


@record
class Warm:
    """A container's interpreter waiting for the word to run the program."""

    proc: subprocess.Popen[bytes]
    go: int  # the engine's end of a socket pair: "go" is written there, "w" read back
    since: float
    heard: bool = False  # it said "w": its imports are done


def start(run: ContainerRun, log: Path, modules: tuple[str, ...], now: float) -> Warm | None:
    """Start ``run``'s warm process, or None (then the container starts cold, as without it)."""
    cwd = run.cwd or os.getcwd()
    ours, theirs = socket.socketpair()
    go = ours.detach()
    os.set_blocking(go, False)  # "w" is read when there (hear); "go" fits an empty buffer
    try:
        argv = warm_argv(run, theirs.fileno(), modules, cwd)
        if argv is None:
            os.close(go)
            return None
        proc = process.spawn(argv, run.env, run.cwd, log, run.before_exec, pass_fds=(theirs.fileno(),))
    except OSError:  # reported by the cold start, in the container's log, as usual
        os.close(go)
        return None
    finally:
        theirs.close()
    return Warm(proc, go, now)


def hear(warm: Warm) -> bool:
    """Whether the warm process has said its imports are done (read without waiting)."""
    if not warm.heard and warm.go >= 0:
        try:
            os.read(warm.go, len(WARM))
        except BlockingIOError:  # nothing yet
            return False
        except OSError:
            pass
        warm.heard = True  # it said so, or it ended (end of file): nothing more to wait for
    return warm.heard


def release(warm: Warm, cwd: str | None) -> bool:
    """Tell the warm process to run the program; False when it cannot (it ended, or its working
    directory went away): the caller discards it and starts the container cold."""
    try:
        if warm.proc.poll() is not None or (cwd is not None and not os.path.isdir(cwd)):
            return False
        os.write(warm.go, b"go")
        return True
    except OSError:
        return False
    finally:
        _close(warm)


def discard(warm: Warm) -> None:
    """Kill the warm process before it runs anything (it is reaped by :func:`reaped`)."""
    _close(warm)  # end of file: it would end by itself
    process.signal_group(warm.proc.pid, signal.SIGKILL)


def _close(warm: Warm) -> None:
    if warm.go >= 0:  # once only: the number may belong to another file afterwards
        with contextlib.suppress(OSError):
            os.close(warm.go)
        warm.go = -1


def reaped(warm: Warm) -> bool:
    """The warm process has ended (and is reaped)."""
    return warm.proc.poll() is not None
