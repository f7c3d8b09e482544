"""The local engine's plan of a job: expanded once, checked, and told (``run --dry-run``).

The plan's expansion gives every pod its loopback address and the ports as declared: it is what
the checks read (``check_job``), what ``validate --local`` warns about and what a dry run prints.
The ports are mapped to free host ports, and whether pod names resolve is decided, only once the
job's turn comes (a job waiting in the local queue holds no port); then these very pods are
readdressed (``expand.readdress``, creation.py), not built again: a run expands its job once.
"""

from __future__ import annotations

from torchjob.errors import Issue
from torchjob.records import record
from torchjob.spec.model import Job
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.engines.local.gpus import Inventory
    from torchjob.expand import DesiredState, PodPlan

Key = tuple[str, int]
Issues = list[Issue]


@record
class LocalPlan:
    """What running a job here means, decided before anything is made."""

    state: DesiredState | None  # the pods in creation order, addresses only (None: taken)
    problems: Issues  # what stops the job running here (empty: it can run)

    def take(self) -> DesiredState | None:
        """The expansion, handed to the run that uses it: the plan keeps no reference, so that
        a large job's pods are not held twice (about 30 KB each) once they are addressed."""
        state, self.state = self.state, None
        return state


def plan_job(job: Job) -> LocalPlan:
    """Expand ``job`` once and check it; an empty job expands to nothing."""
    from torchjob.engines.local.addressing import LocalAddressing
    from torchjob.engines.local.localcheck import check_size
    from torchjob.expand import expand

    too_large = check_size(job)  # from the counts: a job too large is not expanded
    if too_large:
        return LocalPlan(None, too_large)
    state = expand(job, LocalAddressing(job))
    return LocalPlan(state, check_job(job, state))


def check_job(job: Job, state: DesiredState) -> Issues:
    """What stops ``job`` (expanded as ``state``) from running locally, as issues."""
    from torchjob.engines.local import gpus, prewarm
    from torchjob.engines.local.localcheck import check_pods
    from torchjob.spec.model import here_issues

    if job.total_replicas == 0:  # Volcano keeps such a job Running for ever, with nothing to run
        return [Issue("spec.tasks", "every task has 0 replicas: there is no pod to run")]
    kind = here_issues(job, errors=True)  # a PyTorchJob's, TrainJob's or JobSet's own
    return kind + check_pods(state) + gpus.check(job, declared_gpus) + prewarm.check(job)


def declared_gpus() -> Inventory | None:
    """The GPUs declared (``TORCHJOB_CAPACITY``, the queue settings' ``capacity``), which replace
    the machine's; None when none are. Asked only of a job that wants GPUs."""
    from torchjob.engines.local.admission.capacity import declared_gpus

    return declared_gpus()


def plan_text(job: Job, plan: LocalPlan) -> str:
    """The plan for a person: pods in creation order with their ranks and resolved commands."""
    from torchjob.engines.local.ports import declared_ports

    lines = [f"local job {job.name}: {job.total_replicas} pod(s) on this machine"]
    declared = declared_ports(job)
    if declared:
        ports = ", ".join(map(str, declared))
        lines.append(f"ports to reserve: {ports} (each mapped to a free host port when the job starts)")
    lines.append("addresses: each pod its own loopback address (pod names, where they resolve, name them)")
    for pod in plan.state.pods if plan.state is not None else []:
        spec = pod.manifest["spec"]
        env = {e.get("name"): e.get("value") for c in spec["containers"] for e in c.get("env") or []}
        rank = f" (rank {env['RANK']})" if env.get("RANK") is not None else ""
        lines.append(f"pod {pod.name}{rank}")
        own = pod.task.template.init_container_names
        for container in spec.get("initContainers") or []:
            name = str(container.get("name"))
            text = command_text(pod, container, init=True)
            if name not in own:  # added by a plugin: its script is the plugin's, not the job's
                text = _plugin_init_summary(name, env, container)
            lines.append(f"  init {name}: {text}")
        for container in spec["containers"]:
            lines.append(f"  {container.get('name')}: {command_text(pod, container, init=False)}")
    return "\n".join(lines)


def command_text(pod: PodPlan, container: dict[str, Any], *, init: bool) -> str:
    """The container's command as it will run here: $(VAR) references expanded, ``python`` the
    interpreter torchjob runs in, paths of mounted volumes rewritten (as the checks resolve them)."""
    import shlex

    from torchjob.engines.local.containers import PodSetup, ResolveError
    from torchjob.engines.local.localcheck import CHECK_ROOT
    from torchjob.engines.local.resolve import resolve_container

    if not container.get("command"):
        return "(no command: the image's entrypoint, which does not run here)"
    ctx = PodSetup(
        plan=pod,
        address="",
        uid="plan",
        configmaps={},
        configmap_dir=CHECK_ROOT,
        pod_dir=CHECK_ROOT / "plan" / pod.name,
    )
    try:
        run = resolve_container(ctx, container, init=init, errors=[])
    except ResolveError as err:  # the checks say it, with its field
        return f"(cannot be resolved: {err.message})"
    return shlex.join(run.argv)


def _plugin_init_summary(name: str, env: dict[Any, Any], container: dict[str, Any]) -> str:
    from torchjob.plugins.pytorch import WAIT_CONTAINER

    if name == WAIT_CONTAINER and env.get("MASTER_ADDR"):
        return (
            f"waits until the master listens on {env['MASTER_ADDR']}:{env.get('MASTER_PORT')} "
            "(added by the pytorch plugin)"
        )
    words = [str(w) for w in [*(container.get("command") or []), *(container.get("args") or [])]]
    lines = sum(w.count("\n") + 1 for w in words)
    return f"{words[0] if words else 'sh'} script of {lines} line(s), added by a plugin"
