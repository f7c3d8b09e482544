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

_ALL = ("run", "submit", "status", "logs", "wait", "delete", "prune")
_START = ("run", "submit")

ENGINE = EngineInfo(
    factory="torchjob.engines.slurm.engine:SlurmEngine",
    # Pods run the commands of the nodes, which share this filesystem: a script (run -j) is the one
    # here, at its absolute path, not one in an image.
    runs_here=True,
    submits=True,
    location="job directory",
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
}


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


def job_root(settings: SlurmSettings) -> Path:
    """The directory that holds the engine's job directories: the setting, else under $HOME.

    $HOME, not /tmp: on a cluster the home directory is the one filesystem every node is sure to
    share with the login node.
    """
    if settings.job_root:
        return Path(settings.job_root)
    return Path(os.path.expanduser("~")) / ".torchjob" / "slurm"
