"""The ``sbatch`` command line of a plan (pure): job-wide options in every component, and what the
user may not set through ``--sbatch-args`` because torchjob sets it itself.

Slurm carries some options of a heterogeneous job's first component into the next ones and resets
the others (``--partition`` and ``--constraint`` were seen to reach the first component only), so
every job-wide option is given in every component: a worker component lands in the partition, on
the nodes and under the limits the user asked for, as the master's does.

``--sbatch-args`` passes any other option on, but an option torchjob decides itself (the job's
name and output, each component's tasks and resources, where pods go, requeueing) or one it has a
setting for (``-p``, ``--time``, ``--signal``, ...) would silently fight with torchjob's own:
it is refused, in one line naming what to use instead.
"""

from __future__ import annotations

import re

from torchjob.engines.slurm.errors import PlanError
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from torchjob.engines.slurm.plan import Component, SlurmPlan
    from torchjob.engines.slurm.settings import SlurmSettings

FIELD = "--sbatch-args"
_OUTPUT = "the controller's output goes to slurm-<id>.out and each pod's to its logs, in the job directory"
_RESOURCES = "torchjob asks for each pod's resources from its template (cpu, memory, nvidia.com/gpu)"
_PLACEMENT = "use --nodes, --pods-per-node and --gpus-per-node"
# sbatch's long options that torchjob sets itself: why, and what to use instead.
RESERVED = {
    "output": _OUTPUT,
    "error": _OUTPUT,
    "input": "the batch script is torchjob's controller, which reads nothing",
    "chdir": "the batch script runs in the job directory; a container's workingDir says where its pod runs",
    "job-name": "the allocation is named after the job",
    "parsable": "torchjob reads sbatch's answer itself",
    "wait": "torchjob run follows the job itself (torchjob submit returns at once)",
    "array": "one job is one allocation (an array would run the whole job once per index)",
    "hetjob": "torchjob makes the components of a heterogeneous job from the tasks' resources",
    "packjob": "torchjob makes the components of a heterogeneous job from the tasks' resources",
    "wrap": "the batch script is torchjob's controller",
    "export": "the controller and the pods need the environment torchjob runs in",
    "export-file": "the controller and the pods need the environment torchjob runs in",
    "requeue": "use --requeue (TORCHJOB_SLURM_REQUEUE=1)",
    "no-requeue": "torchjob gives --no-requeue itself unless --requeue is given",
    "test-only": "torchjob needs a job id back (use torchjob run --dry-run to see the submission)",
    "ntasks": _RESOURCES + " and one Slurm task per pod",
    "ntasks-per-node": _PLACEMENT,
    "ntasks-per-core": _PLACEMENT,
    "ntasks-per-socket": _PLACEMENT,
    "ntasks-per-gpu": _PLACEMENT,
    "nodes": _PLACEMENT,
    "cpus-per-task": _RESOURCES,
    "cpus-per-gpu": _RESOURCES,
    "mem": _RESOURCES + " (memory per CPU)",
    "mem-per-cpu": _RESOURCES,
    "mem-per-gpu": _RESOURCES,
    "gpus": _PLACEMENT,
    "gpus-per-node": _PLACEMENT,
    "gpus-per-task": _PLACEMENT,
    "gpus-per-socket": _PLACEMENT,
    "gres": _PLACEMENT + " for GPUs (nvidia.com/gpu in a pod's resources)",
    "partition": "use -p/--partition (TORCHJOB_SLURM_PARTITION)",
    "account": "use --account (TORCHJOB_SLURM_ACCOUNT)",
    "qos": "use --qos (TORCHJOB_SLURM_QOS)",
    "time": "use --time-limit (TORCHJOB_SLURM_TIME)",
    "exclusive": "use --exclusive (TORCHJOB_SLURM_EXCLUSIVE=1)",
    "signal": "use --signal (TORCHJOB_SLURM_SIGNAL)",
}
# sbatch's short options and their long names (those of RESERVED, and those taking no value).
_SHORT = {
    "o": "output", "e": "error", "i": "input", "D": "chdir", "J": "job-name", "W": "wait",
    "a": "array", "n": "ntasks", "N": "nodes", "c": "cpus-per-task", "G": "gpus",
    "p": "partition", "A": "account", "q": "qos", "t": "time",
}  # fmt: skip
_NO_VALUE = frozenset("vQHOsWkh")  # short options that take no value (one token may join several)
# [R:]SIG[@SECONDS]: B: (the batch shell only) would reach the controller, not the pods
_SIGNAL = r"(R:)?(SIG)?[A-Z0-9]{2,7}(@[0-9]{1,9})?"


def _long_name(token: str) -> str | None:
    """The reserved long option a ``--name[=value]`` token is (sbatch takes an unambiguous
    prefix of a long option too: ``--out=x`` is ``--output=x``), else None."""
    name = token[2:].split("=", 1)[0]
    if name in RESERVED:
        return name
    prefixed = [known for known in RESERVED if known.startswith(name)]
    return prefixed[0] if len(name) >= 3 and len(prefixed) == 1 else None


def _short_names(token: str) -> list[tuple[str, str]]:
    """(``-X``, long name) of a ``-X[value]`` token's reserved options (``-Qp main`` holds ``-p``)."""
    found = []
    for letter in token[1:]:
        if letter in _SHORT and _SHORT[letter] in RESERVED:
            found.append((f"-{letter}", _SHORT[letter]))
        if letter not in _NO_VALUE:
            break  # the rest of the token is this option's value
    return found


def check_sbatch_args(args: tuple[str, ...]) -> None:
    """A PlanError for the first option of ``args`` that torchjob sets itself."""
    for token in args:
        if token == ":":
            raise PlanError(FIELD, f"':' starts a component: {RESERVED['hetjob']}")
        if token.startswith("--"):
            name = _long_name(token)
            found = [(token.split("=", 1)[0], name)] if name else []
        elif token.startswith("-") and len(token) > 1:
            found = _short_names(token)
        else:
            continue
        for shown, name in found:
            within = f" (in {token})" if not token.startswith("--") and token != shown else ""
            raise PlanError(FIELD, f"{shown}{within} is not passed on: {RESERVED[name]}")


def check_signal(value: str | None) -> None:
    if value is None:
        return
    if value.upper().startswith("B:"):
        raise PlanError(
            "--signal",
            f"{value!r}: B: signals the batch shell, which is torchjob's controller, not the pods; "
            "give the signal without B: (every pod's step gets it)",
        )
    if re.fullmatch(_SIGNAL, value) is None:
        expected = f"expected SIG[@SECONDS] such as USR1@120 (sbatch --signal), got {value!r}"
        raise PlanError("--signal", expected)


def job_wide(plan: SlurmPlan) -> list[str]:
    """The options every component gets: the job's, the user's settings and --sbatch-args."""
    settings: SlurmSettings = plan.settings
    common = [
        "--parsable",
        f"--job-name={plan.job.name}",
        # Not the job directory: a batch host that does not see it could not open the file and
        # Slurm would fail the launch with nothing said; the script redirects once it checked.
        "--output=/dev/null",
        f"--chdir={plan.job_dir}",
        # Retries are the controller's (maxRetry); with --requeue a requeue is one (requeue.py).
        "--requeue" if settings.requeue else "--no-requeue",
    ]
    for option, value in (
        ("--partition", settings.partition),
        ("--account", settings.account),
        ("--qos", settings.qos),
        ("--time", settings.time_limit),
        ("--signal", settings.signal),
    ):
        if value:
            common.append(f"{option}={value}")
    if settings.exclusive:
        common.append("--exclusive")
    common.extend(settings.sbatch_args)
    return common


def component_args(component: Component) -> list[str]:
    """One component's own options: its tasks (one per pod), their resources and placement."""
    args = [f"--ntasks={component.ntasks}", *component.resources.step_args()]
    if component.nodes is not None:
        args.append(f"--nodes={component.nodes}")
    if component.pods_per_node is not None:
        args.append(f"--ntasks-per-node={component.pods_per_node}")
    return args


def sbatch_args(plan: SlurmPlan) -> list[str]:
    """The job-wide options then each component's, components separated by ``:``."""
    common = job_wide(plan)
    args: list[str] = []
    for component in plan.components:
        if component.index:
            args.append(":")
        args.extend(common)
        args.extend(component_args(component))
    return args
