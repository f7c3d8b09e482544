"""A container that runs torchrun, read and rewritten: what a conversion between stacks needs.

Kubeflow's training operator and Kubeflow Trainer tell torchrun its rendezvous through ``PET_*``
variables; Volcano's pytorch plugin and the JobSet target give ``RANK``, ``MASTER_ADDR`` and
``MASTER_PORT`` instead. A command that runs torchrun with the ``PET_*`` of one stack therefore
needs, on a stack that sets none, the same settings as torchrun's flags: ``--nnodes``,
``--nproc-per-node``, ``--node-rank=$(RANK)``, ``--master-addr=$(MASTER_ADDR)`` and
``--master-port=$(MASTER_PORT)`` (Kubernetes expands ``$(VAR)`` in a container's command from its
env). And a TrainJob runs its own torchrun: there the command is the program torchrun starts.
"""

from __future__ import annotations

from torchjob.records import record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

# torchrun's flags that take no value (the others take one, as --flag=value or --flag value).
_SWITCHES = {
    "no-python", "no_python", "standalone", "module", "m", "run-path", "run_path", "help", "h",
}  # fmt: skip
# What the PET_* variables of a stack stand for, as torchrun's flags (dashes; torchrun also takes _).
RENDEZVOUS = ("nnodes", "nproc-per-node", "node-rank", "master-addr", "master-port")
ELASTIC = (
    "nnodes",
    "nproc-per-node",
    "rdzv-backend",
    "rdzv-endpoint",
    "max-restarts",
    "rdzv-id",
    "rdzv-conf",
)


@record
class Torchrun:
    """A torchrun invocation in a container: where it is and what it is given."""

    launcher: list[str]  # ["torchrun"] or ["python", "-m", "torch.distributed.run"]
    flags: list[str]  # torchrun's own options, as written
    program: list[str]  # what torchrun starts, and its arguments
    in_command: int  # how many of launcher + flags + program are the container's command

    def given(self) -> set[str]:
        """The flags given, by their dashed names."""
        names = set()
        for flag in self.flags:
            if flag.startswith("-"):
                names.add(flag.lstrip("-").partition("=")[0].replace("_", "-"))
        return names

    def value(self, name: str) -> str | None:
        """The value given to flag ``name`` (dashed), or None."""
        for i, flag in enumerate(self.flags):
            key, eq, value = flag.lstrip("-").partition("=")
            if key.replace("_", "-") == name and flag.startswith("-"):
                if eq:
                    return value
                return self.flags[i + 1] if i + 1 < len(self.flags) else None
        return None

    @property
    def no_python(self) -> bool:
        return "no-python" in self.given()

    def tokens(self) -> list[str]:
        return [*self.launcher, *self.flags, *self.program]


def find(container: dict[str, Any]) -> Torchrun | None:
    """The torchrun a container runs directly (not through a shell), or None."""
    command = [str(c) for c in container.get("command") or []]
    args = [str(a) for a in container.get("args") or []]
    tokens = command + args
    if not tokens:
        return None
    if tokens[0] == "torchrun" or tokens[0].endswith("/torchrun"):
        size = 1
    elif tokens[0].rsplit("/", 1)[-1].startswith("python") and tokens[1:3] == ["-m", "torch.distributed.run"]:
        size = 3
    else:
        return None
    i = size
    while i < len(tokens) and tokens[i].startswith("-"):
        name, eq, _ = tokens[i].lstrip("-").partition("=")
        i += 1
        if not eq and name not in _SWITCHES and i < len(tokens):
            i += 1  # --flag value
    return Torchrun(tokens[:size], tokens[size:i], tokens[i:], len(command))


def put(container: dict[str, Any], tokens: list[str], in_command: int) -> None:
    """The container's command and args as ``tokens``, the first ``in_command`` of them the command."""
    command, args = tokens[:in_command], tokens[in_command:]
    container["command"] = command
    if args:
        container["args"] = args
    else:
        container.pop("args", None)


def with_flags(run: Torchrun, wanted: dict[str, str]) -> Torchrun:
    """``run`` with each wanted flag torchrun is not given already, right after the launcher."""
    given = run.given()
    added = [f"--{name}={value}" for name, value in wanted.items() if name not in given]
    in_command = run.in_command + (len(added) if run.in_command > len(run.launcher) - 1 else 0)
    return Torchrun(run.launcher, [*added, *run.flags], run.program, in_command)


def program(run: Torchrun) -> list[str]:
    """What torchrun starts, as a command of its own: ``python SCRIPT`` unless ``--no-python``."""
    given = run.given()
    if "no-python" in given:
        return list(run.program)
    if given & {"module", "m"}:
        return ["python", "-m", *run.program]
    return ["python", *run.program]


def other_flags(run: Torchrun, known: tuple[str, ...]) -> list[str]:
    """The flags beyond ``known`` and the way the program is started (they need torchrun itself)."""
    skip = {*known, "no-python", "module", "m"}
    out, i = [], 0
    while i < len(run.flags):
        flag = run.flags[i]
        name, eq, _ = flag.lstrip("-").partition("=")
        takes = not eq and name not in _SWITCHES and i + 1 < len(run.flags)
        if name.replace("_", "-") not in skip:
            out.append(flag + (f" {run.flags[i + 1]}" if takes else ""))
        i += 2 if takes else 1
    return out


def under_runtime(run: Torchrun) -> tuple[list[str], str | None, str | None]:
    """A container's torchrun as a TrainJob runs it, under the runtime's own torchrun: the program
    it starts, the processes per node it asks for, and a note of the flags that are dropped (the
    runtime's torchrun is told its rendezvous through ``PET_*``), if any."""
    extra = other_flags(run, RENDEZVOUS + ELASTIC)
    note = f"torchrun's {', '.join(extra)} are dropped: a TrainJob runs torchrun itself" if extra else None
    return program(run), run.value("nproc-per-node"), note
