"""``torchjob run --engine slurm --dry-run``: what the engine would submit and run, as text."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from torchjob.engines.slurm.plan import SlurmPlan
    from torchjob.spec.model import Job


def step_lines(job: Job, plan: SlurmPlan) -> list[str]:
    """Each pod's steps as they will run, a plugin's init container in one line."""
    from torchjob.engines.slurm.plan import PlanError, launches, place
    from torchjob.pyrunner.pycommand import PYTHON

    if plan.in_allocation:
        layout = {0: [("NODE", len(plan.pods))]}
    else:
        layout = {c.index: [("NODE", c.ntasks)] for c in plan.components}
    try:
        steps_of = launches(plan, place(plan, layout))
    except PlanError as err:  # check() refuses such a job before it starts
        return [f"#   (cannot plan the steps: {err})"]
    declared = {(task.name, name) for task in job.spec.tasks for name in task.template.init_container_names}
    lines: list[str] = []
    for launch in steps_of:
        resources = plan.component_of(launch.task).resources
        header = f"#   {launch.pod}: on NODE, srun {' '.join(resources.step_args())}"
        if header not in lines:
            lines.append(header)
        argv = [sys.executable if PYTHON.fullmatch(launch.argv[0]) else launch.argv[0], *launch.argv[1:]]
        if launch.init and (launch.task, launch.container) not in declared:
            text = f"init {launch.container}: added by a plugin ({argv[0]} ...)"
        else:
            text = f"{'init ' if launch.init else ''}{launch.container}: {shlex.join(argv)}"
        lines.append(f"#     {text}")
    return lines


def port_lines(job: Job, plan: SlurmPlan) -> list[str]:
    """What the master's ports shown are: the declared ones, which the controller claims on the
    master's node when the job runs and replaces there when taken (masterport.py)."""
    from torchjob.engines.slurm.plan import rendezvous_ports

    ports = rendezvous_ports(job) if plan.master is not None else []
    if not ports:
        return []
    head = "# the master's port"
    if len(ports) == 1:
        first = f"{head} {ports[0]} (MASTER_PORT) as declared: claimed on the master's node"
        then = f"another free port there if {ports[0]} is taken (status shows the one it got)"
    else:
        first = f"{head}s {', '.join(map(str, ports))} as declared: claimed on the master's node"
        then = "another free port there for each one taken (status shows those it got)"
    return [first, f"# when the job runs, {then}"]


def step_line(plan: SlurmPlan) -> str:
    """How many job steps the job starts and how many the cluster allows one job, and whence."""
    limit = plan.step_limit
    line = (
        f"# job steps: {plan.steps} in the first attempt (one per container, init containers too; "
        f"each restart one more); at most {limit.count} per job: {limit.source}"
    )
    if plan.in_allocation:  # Slurm tells that count only to a new step, which a dry run makes not
        from torchjob.engines.slurm.allocation import counted

        line += (
            "\n# the steps the allocation made count too: counted when the job starts (one step more)"
            if counted(plan)
            else "\n# the steps the allocation made count too: not counted before the start (a small job"
            " next to the limit); a step Slurm refuses ends the job, naming the limit"
        )
    return line


def plan_text(job: Job, plan: SlurmPlan, job_id: str, job_dir: Path, allocation: str | None) -> str:
    script = job_dir / "batch.sh"
    lines = [f"# slurm engine: job {job_id} in {job_dir}"]
    queue = job.spec.queue
    if queue not in ("", "default") and plan.settings.partition is None:
        lines.append(f"# spec.queue {queue}: the partition of that name, if the cluster has one")
    if allocation is not None:
        lines += [
            f"# inside allocation {allocation}: no sbatch; the controller runs here and starts each",
            "# pod as a step of it, on the allocation's tasks in order:",
            f"#   {shlex.join(['python', '-m', 'torchjob.engines.slurm.batch', str(job_dir)])}",
        ]
    else:
        lines += [
            f"# submit: {plan.command_line(str(script))}",
            "# batch script:",
            *[f"#   {line}" for line in plan.script.splitlines()],
            "# components of the allocation:",
        ]
        for component in plan.components:
            args = " ".join(component.sbatch_args())
            lines.append(f"#   {component.index}: tasks {', '.join(component.tasks)}: {args}")
    lines += port_lines(job, plan)
    lines.append(step_line(plan))
    lines.append("# pods, each container a job step on the pod's node (init containers first, in order);")
    lines.append("# NODE is the node Slurm gives the pod, known once the allocation runs:")
    lines += step_lines(job, plan)
    return "\n".join(lines)
