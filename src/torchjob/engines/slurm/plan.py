"""A job as a Slurm plan: one allocation, its components, and each pod as a job step (pure).

``plan_job`` decides what is known before submission: the components of the allocation (tasks
whose pods need the same resources share one; tasks that differ become heterogeneous
components), the ``sbatch`` arguments and the batch script, and which component each pod's step
runs in. Which node a pod lands on is Slurm's choice, known once the allocation runs:
``place`` takes each component's nodes (``SLURM_JOB_NODELIST_HET_GROUP_<k>`` and
``SLURM_TASKS_PER_NODE_HET_GROUP_<k>``, or the same without the suffix) and gives each pod its
node and its slot on that node; ``launches`` then expands the job with those addresses into each
pod's argv and environment, as Volcano's plugins set it.

Nothing a user wrote reaches a shell unquoted: ``sbatch`` and ``srun`` are run with argument
lists, and the batch script quotes every value with ``shlex.quote``.
"""

from __future__ import annotations

import re
import shlex

from torchjob.engines.slurm.errors import PlanError as PlanError
from torchjob.engines.slurm.limits import DEFAULT, StepLimit
from torchjob.engines.slurm.limits import MAX_STEP_COUNT as MAX_STEP_COUNT
from torchjob.engines.slurm.podenv import configmaps_of as configmaps_of
from torchjob.engines.slurm.podenv import container_env, expand_refs
from torchjob.engines.slurm.resources import Resources as Resources
from torchjob.engines.slurm.resources import placement, task_resources
from torchjob.engines.slurm.sbatch import check_sbatch_args, check_signal, sbatch_args
from torchjob.engines.slurm.settings import SlurmSettings
from torchjob.expand import expand
from torchjob.plugins import build_plugins
from torchjob.records import field, record
from torchjob.spec.model import Job, Task, pod_name
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from torchjob.expand import PodPlan

# The batch script's exit code when its host does not see the job directory (EX_NOINPUT).
NOT_SHARED = 66
Key = tuple[str, int]  # (task name, index)


@record
class Component:
    """One component of the allocation: ``ntasks`` Slurm tasks, one per pod of its tasks."""

    index: int
    tasks: list[str]
    ntasks: int
    resources: Resources
    nodes: int | None = None  # --nodes, where the job's placement says
    pods_per_node: int | None = None  # --ntasks-per-node, where the job's placement says

    def sbatch_args(self) -> list[str]:
        from torchjob.engines.slurm.sbatch import component_args

        return component_args(self)


@record(frozen=True)
class PodSlot:
    """Where a pod runs, as far as known before submission."""

    task: str
    index: int
    name: str
    component: int
    ordinal: int  # its number among the component's Slurm tasks (which node it gets)


@record(frozen=True)
class Placement:
    """Where a pod runs once the allocation is known: its node and its slot on that node.
    (How the job spreads over nodes before that is ``resources.Placement``.)"""

    component: int
    host: str
    slot: int  # 0, 1, ... among the job's pods on this host; the master pod has 0
    port_offset: int


@record
class PodLaunch:
    """One container of a pod as a step: what to run, with which environment, on which node."""

    pod: str
    task: str
    index: int
    container: str
    init: bool
    argv: list[str]
    env: dict[str, str]
    working_dir: str | None
    placement: Placement


@record
class SlurmPlan:
    job: Job
    settings: SlurmSettings
    job_dir: str
    components: list[Component]
    pods: list[PodSlot]
    ports: list[int]  # the ports the job declares for its pods
    master: Key | None  # the pod of rank 0, whose node is MASTER_ADDR
    sbatch_args: list[str] = field(default_factory=list)  # without "sbatch" and the script
    script: str = ""
    # In an allocation that exists (salloc): every pod takes the allocation's tasks in order
    # (one placement group, component 0), each step sized by its own component's resources.
    in_allocation: bool = False
    steps: int = 0  # the job steps its first attempt starts: a step per container, init containers too
    step_limit: StepLimit = DEFAULT  # the most steps one job may create on the cluster

    @property
    def heterogeneous(self) -> bool:
        """Submitted as a heterogeneous job (its steps then name their component's --het-group)."""
        return len(self.components) > 1 and not self.in_allocation

    def sbatch_argv(self, script_path: str, sbatch: str = "sbatch") -> list[str]:
        return [sbatch, *self.sbatch_args, script_path]

    def command_line(self, script_path: str) -> str:
        """The submission as a person would type it (for ``--dry-run``)."""
        return shlex.join(self.sbatch_argv(script_path))

    def component_of(self, task: str) -> Component:
        return next(c for c in self.components if task in c.tasks)


def components_of(job: Job, settings: SlurmSettings) -> list[Component]:
    """Tasks with the same per-pod resources share a component, in the order they first appear.

    With ``settings.single_component`` every task shares one component sized for the largest
    pod: Slurm places heterogeneous components on distinct nodes, so a cluster of one node (or a
    job that must fit on fewer nodes than it has kinds of task) needs that.
    """
    where = placement(job, settings)
    components: list[Component] = []
    by_resources: dict[Resources, Component] = {}
    wanted = [(task, task_resources(task, i, settings, where)) for i, task in enumerate(job.spec.tasks)]
    if settings.single_component and wanted:
        largest = Resources(
            cpus=max(r.cpus for _, r in wanted),
            memory_mib=max((r.memory_mib or 0 for _, r in wanted), default=0) or None,
            gpus=max(r.gpus for _, r in wanted),
            image=wanted[0][1].image,
        )
        if len({r.image for _, r in wanted}) > 1:
            raise PlanError("spec.tasks", "one component runs one image; the tasks' images differ")
        wanted = [(task, largest) for task, _ in wanted]
    for task, resources in wanted:
        if task.replicas == 0:
            continue
        component = by_resources.get(resources)
        if component is None:
            component = Component(index=len(components), tasks=[], ntasks=0, resources=resources)
            components.append(component)
            by_resources[resources] = component
        component.tasks.append(task.name)
        component.ntasks += task.replicas
    if where.nodes is not None and len(components) > 1:
        raise PlanError(
            "--nodes",
            f"the job's tasks make {len(components)} components of a heterogeneous job, each on "
            "nodes of its own: --nodes applies to a job of one component (--single-component)",
        )
    for component in components:
        component.nodes = where.nodes
        component.pods_per_node = where.pods_per_node
    return components


def master_pod(job: Job) -> Key | None:
    """The pod a plugin ranks 0 (the pytorch master), whose node other pods connect to; where no
    pod is ranked 0 but a plugin hands out a port (an elastic PyTorchJob's rendezvous, hosted by
    worker 0), the job's first pod."""
    plugins = build_plugins(job)
    for task in job.spec.tasks:
        for index in range(min(task.replicas, 1)):
            if any(plugin.rank(job, task, index) == 0 for plugin in plugins):
                return (task.name, index)
    if any(plugin.ports(job) for plugin in plugins):
        return next(((task.name, 0) for task in job.spec.tasks if task.replicas), None)
    return None


def rendezvous_ports(job: Job) -> list[int]:
    """The plugins' ports (``MASTER_PORT``, a rendezvous endpoint's): the master's, handed to every pod."""
    return list(dict.fromkeys(int(port) for plugin in build_plugins(job) for port in plugin.ports(job)))


def declared_ports(job: Job) -> list[int]:
    ports = set(rendezvous_ports(job))
    for task in job.spec.tasks:
        for container in task.template.containers:
            for entry in container.ports:
                number = entry.get("containerPort")
                if isinstance(number, int):
                    ports.add(number)
    return sorted(ports)


def job_steps(job: Job) -> int:
    """The job steps the job's first attempt starts, from its counts (no pod is built): each pod
    container is a step, its init containers (a plugin's too) as well as its containers."""
    plugins = build_plugins(job)
    steps = 0
    for task in job.spec.tasks:
        per_pod = len(task.template.init_containers) + len(task.template.containers)
        per_pod += sum(plugin.added_init_containers(job, task) for plugin in plugins)
        steps += task.replicas * per_pod
    return steps


def check_steps(job: Job, limit: StepLimit) -> int:
    """The job's steps (:func:`job_steps`); a PlanError when they are more than ``limit``."""
    steps = job_steps(job)
    if steps <= limit.count:
        return steps
    pods = job.total_replicas
    what = (
        f"the job has {pods} pods, each a job step"
        if steps == pods
        else f"the job's {pods} pods start {steps} job steps (a step per container, init containers too)"
    )
    raise PlanError("spec.tasks", f"{what}; expected at most {limit.count}, {limit.source}")


def plan_job(
    job: Job,
    settings: SlurmSettings,
    job_dir: str,
    controller: list[str],
    *,
    in_allocation: bool = False,
    step_limit: StepLimit = DEFAULT,
) -> SlurmPlan:
    """The allocation for ``job`` and the batch script that runs ``controller`` in it; with
    ``in_allocation``, the job's pods as steps of an allocation that exists. A job whose first
    attempt needs more job steps than ``step_limit`` is refused from its counts, first."""
    steps = check_steps(job, step_limit)
    components = components_of(job, settings)
    if not components:
        raise PlanError("spec.tasks", "the job has no pods to run (every task has 0 replicas)")
    pods: list[PodSlot] = []
    ordinal = 0
    for component in components:
        ordinal = ordinal if in_allocation else 0
        for task in job.spec.tasks:
            if task.name not in component.tasks:
                continue
            for index in range(task.replicas):
                group = 0 if in_allocation else component.index
                pods.append(PodSlot(task.name, index, pod_name(job.name, task.name, index), group, ordinal))
                ordinal += 1
    plan = SlurmPlan(
        job=job,
        settings=settings,
        job_dir=job_dir,
        components=components,
        pods=pods,
        ports=declared_ports(job),
        master=master_pod(job),
        in_allocation=in_allocation,
        steps=steps,
        step_limit=step_limit,
    )
    check_sbatch_args(settings.sbatch_args)
    check_signal(settings.signal)
    plan.sbatch_args = sbatch_args(plan)
    plan.script = batch_script(plan, controller)
    return plan


def batch_script(plan: SlurmPlan, controller: list[str]) -> str:
    """The batch script: the job's markers as variables, then the controller in its place.

    It holds no ``#SBATCH`` lines: the options travel as ``sbatch`` arguments, so no value is
    parsed twice, and a value with a newline cannot end a comment and become a command. Before
    anything else it checks that the job directory is the one written on the login node (its
    ``batch.sh`` is there): if not, the job root is not shared with this host, and the script
    exits with :data:`NOT_SHARED`, which Slurm reports as the job's exit code.
    """
    if not controller:
        raise ValueError("the batch script needs a controller command")
    lines = [
        "#!/bin/sh",
        "# torchjob: runs the job's controller on the batch host; pods run as job steps.",
        f"TORCHJOB_JOB_DIR={shlex.quote(plan.job_dir)}",
        f"TORCHJOB_JOB_NAME={shlex.quote(plan.job.name)}",
        "export TORCHJOB_JOB_DIR TORCHJOB_JOB_NAME",
        f'[ -f "$TORCHJOB_JOB_DIR/batch.sh" ] || exit {NOT_SHARED}',
        "umask 077",
        'exec >>"$TORCHJOB_JOB_DIR/slurm-$SLURM_JOB_ID.out" 2>&1',
        f"exec {shlex.join(controller)}",
    ]
    return "\n".join(lines) + "\n"


# -- once the allocation runs ---------------------------------------------------------------

# Patterns are compiled (and cached by re) on first use: the CLI plans a job without them.
_TASKS_PER_NODE = r"^(\d+)(?:\(x(\d+)\))?$"


def tasks_per_node(text: str) -> list[int]:
    """Slurm's ``SLURM_TASKS_PER_NODE`` (``2(x3),1``) as a count per node: ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for part in text.split(","):
        match = re.match(_TASKS_PER_NODE, part.strip())
        if match is None:
            raise ValueError(f"not a tasks-per-node list: {text!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def place(plan: SlurmPlan, layouts: Mapping[int, list[tuple[str, int]]]) -> dict[Key, Placement]:
    """Each pod's node and slot, from each component's nodes and tasks per node (in order).

    Slurm gives a component's tasks to its nodes in order (block distribution), so a pod's
    ordinal picks its node. Pods on the same node get distinct slots, the master first, and each
    slot its own range of ports: ``port + slot * stride`` never meets another pod's.
    """
    hosts: dict[Key, tuple[int, str]] = {}
    for slot in plan.pods:
        layout = layouts.get(slot.component)
        if layout is None:
            raise ValueError(f"no nodes given for component {slot.component}")
        remaining = slot.ordinal
        for host, count in layout:
            if remaining < count:
                hosts[(slot.task, slot.index)] = (slot.component, host)
                break
            remaining -= count
        else:
            raise ValueError(f"component {slot.component} has fewer tasks than its pods")
    order = list(hosts)
    if plan.master is not None and plan.master in hosts:
        order.remove(plan.master)
        order.insert(0, plan.master)
    stride = port_stride(plan.ports)
    taken: dict[str, int] = {}
    placements: dict[Key, Placement] = {}
    for key in order:
        component, host = hosts[key]
        slot_number = taken.get(host, 0)
        taken[host] = slot_number + 1
        placements[key] = Placement(component, host, slot_number, slot_number * stride)
    return placements


def port_stride(ports: list[int]) -> int:
    """The distance between two slots' ports: the span of the job's declared ports."""
    return (max(ports) - min(ports) + 1) if ports else 1


class SlurmAddressing:
    """Implements :class:`torchjob.addressing.Addressing`: a pod is reached at its node's name.

    Ports are the master's: the only port a plugin hands to other pods is the master's
    (``MASTER_PORT``); each pod's own ports are in ``TORCHJOB_PORT_<declared>``. ``moved`` holds
    the plugins' ports that the master's node had taken, each with the one the master got instead
    (masterport.py).
    """

    def __init__(
        self, placements: Mapping[Key, Placement], master: Key | None, moved: Mapping[int, int] | None = None
    ) -> None:
        self.placements = placements
        self.master = master
        self.moved = dict(moved or {})

    def host(self, job: Job, task: Task, index: int) -> str:
        if task.template.hostname:  # one name for the whole task on a cluster: pod 0 stands for it
            index = 0
        return self.placements[(task.name, index)].host

    def port(self, job: Job, port: int) -> int:
        if self.master is None or self.master not in self.placements:
            return port
        if port in self.moved:
            return self.moved[port]
        return port + self.placements[self.master].port_offset

    def service(self, job: Job, task: Task, index: int) -> str:
        return self.host(job, task, index)  # no Service here: the pod's node, by its name

    def master_ports(self, ports: list[int]) -> dict[int, int]:
        """Each of the job's declared ports as the master's pod has it."""
        return {p: self.port_of(self.master, p) for p in ports}

    def port_of(self, key: Key | None, port: int) -> int:
        """A declared port as the pod ``key`` has it (``TORCHJOB_PORT_<port>``)."""
        if key is not None and key == self.master and port in self.moved:
            return self.moved[port]
        placement = self.placements.get(key) if key is not None else None
        return port + (placement.port_offset if placement is not None else 0)


def launches(plan: SlurmPlan, placements: Mapping[Key, Placement]) -> list[PodLaunch]:
    """Every container of every pod of the job's first attempt as a step to start: init containers
    first, in order."""
    addressing = SlurmAddressing(placements, plan.master)
    state = expand(plan.job, addressing)
    configmaps = configmaps_of(state)
    return [launch for pod in state.pods for launch in pod_launches(plan, pod, addressing, configmaps)]


def pod_launches(
    plan: SlurmPlan,
    pod: PodPlan,
    addressing: SlurmAddressing,
    configmaps: Mapping[str, dict[str, str]],
) -> list[PodLaunch]:
    """The containers of one pod attempt as steps, init containers first: built from that attempt's
    pod (its retry count and job version), so a restart's steps see the restart's; its ports are
    those of ``addressing``, the attempt's."""
    key = (pod.task.name, pod.index)
    placement = addressing.placements[key]
    spec = pod.manifest["spec"]
    engine_env = {
        "TORCHJOB_JOB_DIR": plan.job_dir,
        "TORCHJOB_POD_NAME": pod.name,
        "TORCHJOB_POD_IP": placement.host,
        "TORCHJOB_PORT_OFFSET": str(placement.port_offset),
        "PYTHONUNBUFFERED": "1",
        **{f"TORCHJOB_PORT_{p}": str(addressing.port_of(key, p)) for p in plan.ports},
    }
    result: list[PodLaunch] = []
    for kind, init in (("initContainers", True), ("containers", False)):
        for i, container in enumerate(spec.get(kind) or []):
            where = f"{pod.name}.{kind}[{i}]"
            env = container_env(container, pod.manifest, placement.host, configmaps, engine_env, where)
            argv = [
                expand_refs(a, env)
                for a in [*(container.get("command") or []), *(container.get("args") or [])]
            ]
            if not argv:
                raise PlanError(where, "a container needs a command on Slurm (there is no image entrypoint)")
            result.append(
                PodLaunch(
                    pod=pod.name,
                    task=pod.task.name,
                    index=pod.index,
                    container=str(container.get("name") or ""),
                    init=init,
                    argv=argv,
                    env=env,
                    working_dir=container.get("workingDir") or None,
                    placement=placement,
                )
            )
    return result
