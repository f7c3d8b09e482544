"""The Slurm engine's settings: where and how its allocations are asked for."""

from __future__ import annotations

import os
from pathlib import Path

from torchjob.records import record


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
