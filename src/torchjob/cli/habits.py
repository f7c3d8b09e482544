"""torchrun's habits on torchjob's command line, answered in one line with what torchjob takes.

``torchjob run --nproc-per-node=2 train.py`` and ``torchjob run python train.py`` are how torchrun
and python are called; argparse answered them with its whole usage. :func:`torchrun_habit` finds
torchrun's common flags before the script (``--nproc-per-node``, ``--nnodes``, ``--standalone``,
``--rdzv-*``, ``--master-addr``, ``--master-port``, ``--node-rank``, with ``-`` or ``_``) and a
launcher given as the FILE (``python``, ``python3.11``, ``torchrun``, ``python -m
torch.distributed.run``), and names the torchjob command that does the same: torchjob takes the
shape as ``-j NODESxPROCS`` and sets the rendezvous (address, port, node ranks) itself. After the
script every argument is the script's, as with torchrun: nothing there is looked at.
"""

from __future__ import annotations

import os
import re

from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Collection

# torchrun's flags that take a value, and the one that takes none (underscores or dashes alike).
TAKES_VALUE = frozenset(
    {
        "nproc-per-node",
        "nnodes",
        "node-rank",
        "master-addr",
        "master-port",
        "rdzv-backend",
        "rdzv-endpoint",
        "rdzv-id",
        "rdzv-conf",
        "rdzv-timeout",
    }
)
BARE = frozenset({"standalone"})
SHAPE = ("nnodes", "nproc-per-node")  # what -j says; the rest (--standalone too) is the rendezvous
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_PYTHON = re.compile(r"python[0-9.]*")
_JOB_FILE = (".yaml", ".yml", ".json")


def _flag(arg: str) -> str | None:
    """torchrun's flag name in ``arg`` (``--nproc_per_node=2`` -> ``nproc-per-node``), or None."""
    if not arg.startswith("--"):
        return None
    name = arg[2:].split("=", 1)[0].replace("_", "-")
    return name if name in TAKES_VALUE or name in BARE else None


def _take_flag(args: list[str], found: dict[str, str]) -> list[str]:
    """Record the torchrun flag ``args[0]`` (and its value); the arguments after it."""
    name = _flag(args[0])
    assert name is not None
    if name in BARE:
        found[name] = ""
    elif "=" in args[0]:
        found[name] = args[0].split("=", 1)[1]
    else:
        found[name] = args[1] if args[1:] else ""
        return args[2:]
    return args[1:]


def _is_launcher(arg: str) -> bool:
    name = os.path.basename(arg)
    if not (_PYTHON.fullmatch(name) or name == "torchrun"):
        return False
    if os.path.isfile(arg):  # a script of that name is a script
        from torchjob.quick import is_script

        return not is_script(arg)
    return True


def torchrun_habit(
    command: str, argv: list[str], options: Collection[str], takes_value: Collection[str]
) -> tuple[str, str] | None:
    """(the flag or word at fault, a one-line message naming torchjob's equivalent) for torchrun's
    habits in ``argv``, the arguments after ``command``; None when there are none.

    ``options``: torchjob's own option strings for the command; ``takes_value``: those of them
    that take a value (skipped with it, and kept in the suggested command).
    """
    own: list[str] = []
    found: dict[str, str] = {}  # torchrun's flag -> its value
    first = ""
    rest = list(argv)
    while rest and rest[0] != "--":
        arg = rest[0]
        if _flag(arg) is not None and arg.split("=", 1)[0] not in options:
            first = first or arg.split("=", 1)[0]
            rest = _take_flag(rest, found)
        elif arg.startswith("-") and arg != "-":
            own.append(arg)
            taken = 2 if arg in takes_value and rest[1:] else 1
            own += rest[1:taken]
            rest = rest[taken:]
        else:
            break
    if rest[:1] == ["--"]:
        rest = rest[1:]
    launcher = ""
    if rest and _is_launcher(rest[0]):
        launcher, rest = rest[0], rest[1:]
        torchrun = os.path.basename(launcher) == "torchrun"
        while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c") and not torchrun:
            rest = rest[1:]  # python's own options (-u, -O): the engine's python is used
        if rest[:1] == ["-m"] and rest[1:2] and rest[1] in LAUNCHER_MODULES:
            rest, torchrun = rest[2:], True
        while torchrun and rest and _flag(rest[0]) is not None:
            rest = _take_flag(rest, found)
        if not rest or rest[0].startswith("-"):  # python -m MODULE, python -c CODE, python alone
            shown = " ".join([os.path.basename(launcher), *rest[:2]])
            return launcher, (
                f"torchjob {command} takes a script file, not {shown!r}: torchjob {command} "
                f"{' '.join([*own, 'SCRIPT.py'])} (a job file's containers can run any command)"
            )
    if not (launcher or found):
        return None
    script = rest or ["SCRIPT.py"]
    return (launcher or first), _message(command, own, found, script, launcher)


def _message(command: str, own: list[str], found: dict[str, str], script: list[str], launcher: str) -> str:
    if launcher:  # the problem names the launcher; torchrun's flags after it are said below
        head = f"torchjob {command} runs the script itself, with no {os.path.basename(launcher)} before it"
    elif len(found) == 1:  # the problem names the flag
        head = "torchrun's flag"
    else:
        head = f"torchrun's flags {', '.join(f'--{n}' for n in found)}"
    notes = []
    rendezvous = [f"--{n}" for n in found if n not in SHAPE]
    if rendezvous:
        notes.append(f"torchjob sets the rendezvous itself: {', '.join(rendezvous)} left out")
    job_file = script[0] == "-" or script[0].lower().endswith(_JOB_FILE) or ".py:" in script[0]
    if job_file and any(n in found for n in SHAPE):  # -j is for scripts
        head += "; a job file sets its own pods (--set TASK.replicas=N changes them)"
        return f"{head}: torchjob {command} {' '.join([*own, *script])}" + (f" ({notes[0]})" if notes else "")
    nodes = found.get("nnodes", "")
    if ":" in nodes:
        notes.append(f"-j takes a number of nodes, not torchrun's range {nodes}: the SDK's Elastic takes one")
    procs = found.get("nproc-per-node", "")
    if procs and not procs.isdigit():
        notes.append(f"N processes per node: torchrun's {procs!r} has no counterpart")
    shape = _shape(own, found)
    if any(n in found for n in SHAPE):
        head += "; torchjob takes -j NODESxPROCS"
    words = ["torchjob", command, *_without_shape(own), *([f"-j {shape}"] if shape else []), *script]
    return f"{head}: {' '.join(words)}" + (f" ({'; '.join(notes)})" if notes else "")


def _shape(own: list[str], found: dict[str, str]) -> str:
    """NODESxPROCS from torchrun's --nnodes, --nproc-per-node, --standalone and a -j given too;
    "" for one process on one node (no -j needed)."""
    given = ""
    for i, arg in enumerate(own):
        if arg == "-j" and i + 1 < len(own):
            given = own[i + 1]
        elif arg.startswith("-j") and len(arg) > 2:
            given = arg[2:].lstrip("=")
    nodes, _, procs = given.partition("x")
    if "nnodes" in found:
        nodes = found["nnodes"].rpartition(":")[2]
    if "standalone" in found:
        nodes = "1"
    if "nproc-per-node" in found:
        procs = found["nproc-per-node"] if found["nproc-per-node"].isdigit() else "N"
    nodes, procs = nodes or "1", procs or "1"
    return "" if (nodes, procs) == ("1", "1") else f"{nodes}x{procs}"


def _without_shape(own: list[str]) -> list[str]:
    """torchjob's options without -j (the suggestion has its own)."""
    out: list[str] = []
    skip = False
    for arg in own:
        if skip or arg.startswith("-j"):
            skip = arg == "-j"
            continue
        out.append(arg)
    return out
