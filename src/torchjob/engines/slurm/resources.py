"""What each pod asks Slurm for, and how the job's pods spread over nodes (pure).

A pod's resources come from its template as Kubernetes counts them (main containers added up, or
the largest init container if it needs more): CPUs rounded up (at least 1), memory in MiB, whole
GPUs. A pod whose main container runs PyTorch's launcher (``torchrun``/``torch.distributed.run``,
``run -j NxM``'s pods, an SDK ``Elastic`` task) with ``--nproc-per-node=M`` runs M processes: it
gets at least M CPUs.

Placement (:func:`placement`): ``--pods-per-node K`` puts at most K pods on a node, ``--nodes N``
spreads the job over N nodes, ``--gpus-per-node G`` gives each node G GPUs, G/K to each of its K
pods. A job whose pods all run the launcher and that has more than one pod is a multi-node
torchrun job: one pod per node unless ``--pods-per-node`` says otherwise, as torchrun expects
one agent per machine.
"""

from __future__ import annotations

import math

from torchjob.engines.slurm.errors import PlanError
from torchjob.records import record
from torchjob.spec.units import parse_quantity
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.engines.slurm.settings import SlurmSettings
    from torchjob.spec.model import Job, Task

GPU = "nvidia.com/gpu"
MIB = 2.0**20
_LAUNCHERS = (
    ("torchrun",),
    ("python", "-m", "torch.distributed.run"),
    ("python3", "-m", "torch.distributed.run"),
)
_NPROC = ("--nproc-per-node", "--nproc_per_node")


@record(frozen=True)
class Resources:
    """What one pod of a task asks Slurm for, per Slurm task."""

    cpus: int = 1
    memory_mib: int | None = None
    gpus: int = 0
    image: str | None = None  # the pod's image, when pyxis runs it

    def step_args(self) -> list[str]:
        """Per-task options, the same for the allocation's component and for a pod's step."""
        args = [f"--cpus-per-task={self.cpus}"]
        if self.memory_mib is not None:
            # Per CPU, not --mem: --mem is per node, and a node may hold several pods of the job.
            args.append(f"--mem-per-cpu={math.ceil(self.memory_mib / self.cpus)}M")
        if self.gpus:
            args.append(f"--gpus-per-task={self.gpus}")
        return args


@record(frozen=True)
class Placement:
    """How the job's pods spread over nodes: None where Slurm chooses."""

    nodes: int | None = None
    pods_per_node: int | None = None
    gpus_per_pod: int | None = None  # from --gpus-per-node, for pods that ask for none themselves


def _quantity(value: object, path: str) -> float:
    try:
        return parse_quantity(value)
    except ValueError as err:
        raise PlanError(path, str(err)) from None


def _container_amount(container: dict[str, Any], resource: str, path: str) -> float:
    """A container's limit for a resource, else its request; 0 when it gives neither."""
    resources = container.get("resources") or {}
    for kind in ("limits", "requests"):
        values = resources.get(kind) or {}
        if resource in values:
            return _quantity(values[resource], f"{path}.resources.{kind}.{resource}")
    return 0.0


def _pod_amount(spec: dict[str, Any], resource: str, path: str) -> float:
    """What a pod needs, as Kubernetes counts it: the sum of its containers, or its largest init
    container if that is more (init containers run one at a time, before the others)."""
    mains = sum(
        _container_amount(c, resource, f"{path}.containers[{i}]")
        for i, c in enumerate(spec.get("containers") or [])
    )
    inits = [
        _container_amount(c, resource, f"{path}.initContainers[{i}]")
        for i, c in enumerate(spec.get("initContainers") or [])
    ]
    return max([mains, *inits])


def launcher_procs(task: Task) -> int | None:
    """How many processes each pod of ``task`` runs when its main container is PyTorch's launcher
    (``--nproc-per-node=M`` among the launcher's own arguments, before the script); else None."""
    for container in task.template.containers:
        argv = [str(a) for a in [*container.command, *container.args]]
        launcher = next((p for p in _LAUNCHERS if tuple(argv[: len(p)]) == p), None)
        if launcher is None and argv and argv[0].endswith("/torchrun"):
            launcher = ("torchrun",)
        if launcher is None:
            continue
        rest = argv[len(launcher) :]
        for i, arg in enumerate(rest):
            if not arg.startswith("-"):
                break  # the script: its own arguments are not the launcher's
            name, _, value = arg.partition("=")
            if name in _NPROC:
                value = value or (rest[i + 1] if i + 1 < len(rest) else "")
                return int(value) if value.isascii() and value.isdigit() and int(value) > 0 else None
    return None


def placement(job: Job, settings: SlurmSettings) -> Placement:
    """The settings' placement, with one pod per node for a multi-node torchrun job by default."""
    tasks = [t for t in job.spec.tasks if t.replicas]
    pods = sum(t.replicas for t in tasks)
    per_node = settings.pods_per_node
    if per_node is None and pods > 1 and all(launcher_procs(t) for t in tasks):
        per_node = 1
    gpus_per_pod = None
    if settings.gpus_per_node is not None:
        if per_node is None:
            raise PlanError(
                "--gpus-per-node",
                "how many pods share a node's GPUs is not known: give --pods-per-node too (or each "
                f"pod its GPUs: resources.limits {GPU})",
            )
        if settings.gpus_per_node % per_node:
            raise PlanError(
                "--gpus-per-node",
                f"{settings.gpus_per_node} GPUs do not divide among {per_node} pods per node",
            )
        gpus_per_pod = settings.gpus_per_node // per_node
    if settings.nodes is not None and per_node is not None and settings.nodes * per_node < pods:
        raise PlanError(
            "--nodes",
            f"{settings.nodes} node(s) of at most {per_node} pod(s) each cannot hold the job's {pods} pods",
        )
    if settings.nodes is not None and settings.nodes > pods:
        raise PlanError("--nodes", f"{settings.nodes} nodes for {pods} pod(s): a node would have no pod")
    return Placement(nodes=settings.nodes, pods_per_node=per_node, gpus_per_pod=gpus_per_pod)


def task_resources(task: Task, position: int, settings: SlurmSettings, where: Placement) -> Resources:
    """A task's per-pod request: CPUs rounded up (at least 1, at least its launcher's processes),
    memory in MiB, whole GPUs (its own, or its share of --gpus-per-node)."""
    path = f"spec.tasks[{position}].template.spec"
    spec = task.template.spec
    cpus = max(1, math.ceil(_pod_amount(spec, "cpu", path) - 1e-9), launcher_procs(task) or 0)
    memory = _pod_amount(spec, "memory", path)
    gpus = _pod_amount(spec, GPU, path)
    if gpus != int(gpus):
        raise PlanError(f"{path}.containers", f"{GPU} must be a whole number, got {gpus:g}")
    if where.gpus_per_pod is not None:
        if gpus:
            raise PlanError(
                f"{path}.containers",
                f"asks for {GPU} itself and --gpus-per-node gives GPUs too: give one of them",
            )
        gpus = where.gpus_per_pod
    image = None
    if settings.container_images:
        images = {c.image for c in task.template.containers if c.image}
        if len(images) > 1:
            listed = ", ".join(sorted(images))
            raise PlanError(f"{path}.containers", f"pyxis runs a pod in one image; this pod has {listed}")
        image = next(iter(images), None)
    return Resources(
        cpus=cpus,
        memory_mib=math.ceil(memory / MIB) if memory else None,
        gpus=int(gpus),
        image=image,
    )
