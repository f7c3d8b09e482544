"""What is checked before a job is submitted, so that a mistake is one line at once, not a job that
fails late or waits for ever: the Slurm clients and their configuration, a slurmctld that
answers, enough nodes for the job's placement, and the pod fields Slurm cannot honour."""

from __future__ import annotations

import math
import os

from torchjob import logs
from torchjob.engine_api.base import EngineError
from torchjob.engines.slurm import clients
from torchjob.errors import Issue
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from torchjob.engine_api.base import Sink
    from torchjob.engines.slurm.plan import SlurmPlan
    from torchjob.engines.slurm.settings import SlurmSettings
    from torchjob.spec.model import Job

# Pod template fields a scheduler places pods by, which Slurm cannot honour.
_PLACEMENT_FIELDS = ("nodeSelector", "affinity", "tolerations", "topologySpreadConstraints", "nodeName")


def placement_warnings(job: Job) -> list[Issue]:
    """Pod fields by which a cluster places pods and Slurm does not, and the probes no kubelet runs
    here: ignored, and said so."""
    from torchjob.controller.probes import probe_warnings

    found = probe_warnings(job)
    for position, task in enumerate(job.spec.tasks):
        for name in _PLACEMENT_FIELDS:
            if task.template.spec.get(name):
                found.append(
                    Issue(
                        f"spec.tasks[{position}].template.spec.{name}",
                        f"Slurm does not place pods by {name}: ignored (choose nodes with "
                        "--sbatch-args='--constraint=FEATURE' or '--nodelist=NODES', or -p PARTITION)",
                        "warning",
                    )
                )
    return found


def placement_notices(job: Job, source: Callable[[str, str], str] | None = None) -> list[str]:
    """The placement warnings as a run says them, at the fields the user wrote (a PyTorchJob's,
    TrainJob's or JobSet's own): with the file's line where the caller knows it (``source``:
    StartOptions.source), else at the path alone."""
    from torchjob.spec.model import own_path

    lines = []
    for issue in placement_warnings(job):
        told = source(issue.path, f"warning: {issue.message}") if source is not None else None
        lines.append(told or f"warning: {own_path(job, issue.path)}: {issue.message}")
    return lines


def slurm_answers(allocation: str | None, answered: bool = False) -> None:
    """What stops any job here, in one line and at once: no Slurm clients, a configuration no
    client can read, a slurmctld that does not answer (clients would retry for a while first).
    ``answered``: slurmctld answered this command a moment ago (its configuration was read), so
    it is not pinged again."""
    try:
        clients.client("srun" if allocation else "sbatch")
        clients.check_config(os.environ)
        said = None if answered else clients.ping()
    except clients.SlurmError as err:
        raise EngineError(str(err)) from None
    if said is not None:
        raise EngineError(f"{clients.unreachable_message(said)} Nothing was submitted")


def queue_partition(job: Job, settings: SlurmSettings, sink: Sink) -> SlurmSettings:
    """A Volcano queue (``spec.queue``) is the partition of that name when the cluster has one
    and no partition was given; otherwise it is said to be ignored."""
    queue = job.spec.queue
    if settings.partition or queue in ("", "default"):
        return settings
    from torchjob.records import replace

    try:
        found = clients.partition(queue)
    except clients.SlurmError:
        found = None
    if found is None:
        sink.notice(
            f"warning: spec.queue {queue!r}: the cluster has no partition of that name; the job "
            "goes to the default partition (-p/--partition chooses one)"
        )
        return settings
    logs.info("slurm: spec.queue %s is the partition %s", queue, queue)
    return replace(settings, partition=queue)


def fits_nodes(plan: SlurmPlan) -> None:
    """A job that needs more nodes than its partition has would be refused by sbatch with
    "Requested node configuration is not available", or stay pending for ever (a heterogeneous
    job: Slurm starts one only with each component on nodes of its own): say why at once."""
    needed = [
        c.nodes or (math.ceil(c.ntasks / c.pods_per_node) if c.pods_per_node else 1) for c in plan.components
    ]
    total = sum(needed) if plan.heterogeneous else needed[0]
    if total <= 1:
        return
    partition = plan.settings.partition
    try:
        nodes = clients.partition_nodes(partition)
    except clients.SlurmError as err:
        raise EngineError(str(err)) from None
    if nodes is None or nodes >= total:
        return
    where = f"partition {partition}" if partition else "the default partition"
    if plan.heterogeneous:
        kinds = "; ".join(", ".join(c.tasks) for c in plan.components)
        raise EngineError(
            f"the job's tasks ask for {len(plan.components)} kinds of pod ({kinds}), each a component "
            f"of a heterogeneous job on nodes of its own ({total} in all), and {where} has {nodes} "
            "node(s): give the tasks the same resources, or use --single-component"
        )
    first = plan.components[0]
    why = (
        f"--nodes {first.nodes}"
        if first.nodes
        else f"{first.ntasks} pods, at most {first.pods_per_node} per node"
    )
    hint = ""
    if plan.settings.pods_per_node is None and first.pods_per_node == 1:
        hint = " (one pod per node: a torchrun job of several nodes; --pods-per-node K puts K on one)"
    raise EngineError(f"the job needs {total} nodes ({why}){hint} and {where} has {nodes}")
