"""The Slurm engine's settings: where and how its allocations are asked for.

``ENGINE`` is what the registry lists (engine_api/registry.py): the settings as the CLI makes flags
of them, declared without importing the engine. Each may also come from a ``TORCHJOB_SLURM_*``
variable (``ENV``): a task called from Python, or a cluster's own defaults in a login profile.
"""

from __future__ import annotations

import os
from pathlib import Path

from torchjob.engine_api.base import EngineInfo, Setting
from torchjob.engine_api.common_settings import max_restarts
from torchjob.records import record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

_ALL = ("run", "submit", "status", "logs", "wait", "delete", "prune")
_START = ("run", "submit")

ENGINE = EngineInfo(
    factory="torchjob.engines.slurm.engine:SlurmEngine",
    # Pods run the commands of the nodes, which share this filesystem: a script (run -j) is the one
    # here, at its absolute path, not one in an image.
    runs_here=True,
    submits=True,
    location="job directory",
    handle="id",  # several jobs may have one name: submit prints the id
    settings=(
        Setting(
            "partition",
            "slurm: the partition (sbatch -p/--partition)",
            flags=("-p", "--partition"),  # sbatch's own spellings
            metavar="NAME",
            commands=_START,
        ),
        Setting("account", "slurm: the account charged (sbatch --account)", metavar="NAME", commands=_START),
        Setting("qos", "slurm: the quality of service (sbatch --qos)", metavar="NAME", commands=_START),
        Setting(
            "time_limit",
            "slurm: the allocation's time limit, in Slurm's format (30, 2:00:00, 1-00:00:00)",
            metavar="TIME",
            commands=_START,
        ),
        Setting(
            "sbatch_args",
            "slurm: more sbatch arguments, split as a shell would split them (no shell runs them)",
            metavar="ARGS",
            commands=_START,
        ),
        Setting(
            "job_root",
            "slurm: where job directories live, on a filesystem the compute nodes share "
            "(default: ~/.torchjob/slurm)",
            type="path",
            metavar="DIR",
            commands=_ALL,
        ),
        Setting(
            "container_images",
            "slurm: run each pod in its image with pyxis (srun --container-image)",
            type="bool",
            default=False,
            commands=_START,
        ),
        max_restarts(commands=_START),
        Setting(
            "nodes",
            "slurm: the number of nodes the job's pods spread over (sbatch --nodes)",
            type="int",
            metavar="N",
            minimum=1,
            invalid="expected a number of nodes of 1 or more, got {value}",
            commands=_START,
        ),
        Setting(
            "pods_per_node",
            "slurm: at most K pods on one node (sbatch --ntasks-per-node; 1 by default for a "
            "torchrun job of several nodes, such as run -j 2x4)",
            type="int",
            metavar="K",
            minimum=1,
            invalid="expected a number of pods per node of 1 or more, got {value}",
            commands=_START,
        ),
        Setting(
            "gpus_per_node",
            "slurm: GPUs for the job on each node, shared by the pods on it (sbatch --gpus-per-node)",
            type="int",
            metavar="G",
            minimum=1,
            invalid="expected a number of GPUs of 1 or more, got {value}",
            commands=_START,
        ),
        Setting(
            "exclusive",
            "slurm: nodes the job shares with no other job (sbatch --exclusive)",
            type="bool",
            default=False,
            commands=_START,
        ),
        Setting(
            "signal",
            "slurm: a signal every pod gets before the time limit, to checkpoint (sbatch --signal, "
            "such as USR1@120: SIGUSR1 120 s before)",
            metavar="SIG@SECONDS",
            commands=_START,
        ),
        Setting(
            "requeue",
            "slurm: let Slurm requeue the job after a node failure or a preemption (sbatch --requeue): "
            "it goes on from its last attempt, a restart counted against maxRetry",
            type="bool",
            default=False,
            commands=_START,
        ),
        Setting(
            "new_allocation",
            "slurm: inside an allocation (salloc, a batch job), submit a new one all the same "
            "(by default the job's pods run as steps of the allocation torchjob runs in)",
            type="bool",
            default=False,
            commands=_START,
        ),
        Setting(
            "single_component",
            "slurm: every task in one component sized for the largest pod (no heterogeneous job)",
            type="bool",
            default=False,
            commands=_START,
        ),
    ),
)

ENV = {
    "partition": "TORCHJOB_SLURM_PARTITION",
    "account": "TORCHJOB_SLURM_ACCOUNT",
    "qos": "TORCHJOB_SLURM_QOS",
    "time_limit": "TORCHJOB_SLURM_TIME",
    "sbatch_args": "TORCHJOB_SLURM_SBATCH_ARGS",
    "job_root": "TORCHJOB_SLURM_JOB_ROOT",
    "container_images": "TORCHJOB_SLURM_CONTAINER_IMAGES",
    "single_component": "TORCHJOB_SLURM_SINGLE_COMPONENT",
    "nodes": "TORCHJOB_SLURM_NODES",
    "pods_per_node": "TORCHJOB_SLURM_PODS_PER_NODE",
    "gpus_per_node": "TORCHJOB_SLURM_GPUS_PER_NODE",
    "exclusive": "TORCHJOB_SLURM_EXCLUSIVE",
    "signal": "TORCHJOB_SLURM_SIGNAL",
    "new_allocation": "TORCHJOB_SLURM_NEW_ALLOCATION",
    "requeue": "TORCHJOB_SLURM_REQUEUE",
}
BOOLS = ("container_images", "single_component", "exclusive", "new_allocation", "requeue")
INTS = ("nodes", "pods_per_node", "gpus_per_node")


@record(frozen=True)
class SlurmSettings:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str | None = None  # Slurm's own format: minutes, [D-]HH:MM:SS, ...
    sbatch_args: tuple[str, ...] = ()  # passed to sbatch as they are, before the components
    # Job directories: on a filesystem the login node and the compute nodes share.
    job_root: str | None = None
    # Where the cluster has NVIDIA's pyxis, run each pod in its image (srun --container-image).
    container_images: bool = False
    # Every task in one component sized for the largest pod: Slurm gives heterogeneous components
    # distinct nodes, so a job with several kinds of task needs as many nodes without this.
    single_component: bool = False
    # Placement (plan.py): nodes, pods per node, GPUs per node, nodes of the job's own.
    nodes: int | None = None
    pods_per_node: int | None = None
    gpus_per_node: int | None = None
    exclusive: bool = False
    signal: str | None = None  # sbatch --signal: [R:]SIG[@SECONDS], to every step
    new_allocation: bool = False  # inside an allocation, sbatch a new one all the same
    requeue: bool = False  # sbatch --requeue: Slurm runs the batch script again (requeue.py)


def job_root(settings: SlurmSettings) -> Path:
    """The directory that holds the engine's job directories: the setting, else under $HOME.

    $HOME, not /tmp: on a cluster the home directory is the one filesystem every node is sure to
    share with the login node.
    """
    if settings.job_root:
        return Path(settings.job_root)
    return Path(os.path.expanduser("~")) / ".torchjob" / "slurm"


def settings_from(given: dict[str, Any], environ: dict[str, str]) -> SlurmSettings:
    """The engine's settings: those given (flags) first, else ``TORCHJOB_SLURM_*`` variables; a
    variable that holds no such value is an EngineError naming it (exit code 2)."""
    import shlex

    from torchjob.engine_api.base import EngineError

    values: dict[str, Any] = {}
    for name, variable in ENV.items():
        value = given.get(name)
        source = None
        if value is None:
            value = environ.get(variable) or None
            source = variable
        if value is None:
            continue
        if name == "sbatch_args":
            try:
                value = tuple(shlex.split(value) if isinstance(value, str) else value)
            except ValueError as err:  # an unclosed quote
                raise EngineError(f"{source or '--sbatch-args'}: {err}: {value!r}") from None
        elif name in BOOLS:
            value = value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")
        elif name in INTS:
            if not isinstance(value, int):
                text = str(value).strip()
                if not (text.isascii() and text.isdigit() and 0 < int(text) < 1_000_000):
                    raise EngineError(f"{source}: expected a whole number of 1 or more, got {value!r}")
                value = int(text)
        else:
            value = str(value)
        values[name] = value
    return SlurmSettings(**values)
