"""Running a job inside an allocation that already exists (an ``salloc`` shell, a batch job).

There, as ``srun`` does, the job's pods become steps of that allocation instead of a new job
waiting in the queue behind it: the engine starts the job's controller (the batch script's
``python -m torchjob.engines.slurm.batch JOB_DIR``) as a process of its own on this host, with the
allocation's ``SLURM_*`` variables, and follows the job as it follows a submitted one. The pods go
to the allocation's tasks in order (``SLURM_JOB_NODELIST``, ``SLURM_TASKS_PER_NODE``), one task
per pod, each step sized like its pod; the allocation is the user's, so stopping the job stops its
controller and its steps, never the allocation.

Why not, said in one line before anything starts: a heterogeneous allocation, fewer tasks than
the job has pods, pods that need more CPUs on a node than the allocation has there, or more job
steps than the cluster's MaxStepCount leaves the allocation (:func:`check_steps`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from torchjob.engine_api.base import EngineError
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from torchjob.engines.slurm.plan import SlurmPlan

CONTROLLER_OUT = "controller.out"
STOP_GRACE = 30.0  # seconds the controller has to stop its pods after SIGTERM
COUNT_TIMEOUT = 30.0  # seconds the step that counts the allocation's steps may take
# The count is a step of its own, about 0.2 s before the first pod starts (benchmarks/README.md),
# paid at every start of the salloc loop users iterate in. It is taken for a job of at least this
# part of the limit; a smaller one that still runs into it is ended by the refused step, naming it.
COUNT_FROM = 0.1


def current(environ: Mapping[str, str]) -> str | None:
    """The id of the allocation this process runs in (salloc's shell, a batch script), or None;
    not from inside a job step, whose resources are the step's own."""
    job_id = environ.get("SLURM_JOB_ID", "")
    if not job_id.isdigit() or environ.get("SLURM_STEP_ID", "") not in ("", "interactive"):
        return None
    return job_id


def check_fits(plan: SlurmPlan, environ: Mapping[str, str]) -> None:
    """An EngineError of one line when the job cannot run in this allocation, saying why."""
    from torchjob.engines.slurm.plan import tasks_per_node

    job_id = environ.get("SLURM_JOB_ID", "")
    advice = "ask salloc for one task per pod, or run with --new-allocation"
    if environ.get("SLURM_HET_SIZE"):
        raise EngineError(f"allocation {job_id} is heterogeneous: its pods cannot be placed in it ({advice})")
    counts = environ.get("SLURM_TASKS_PER_NODE", "")
    cpus = environ.get("SLURM_JOB_CPUS_PER_NODE", "")
    try:
        tasks = tasks_per_node(counts)
        cpus_per_node = tasks_per_node(cpus) if cpus else []
    except ValueError:
        raise EngineError(f"allocation {job_id}: SLURM_TASKS_PER_NODE={counts!r} cannot be read") from None
    pods = len(plan.pods)
    if sum(tasks) < pods:
        raise EngineError(
            f"allocation {job_id} has {sum(tasks)} task(s) (SLURM_TASKS_PER_NODE={counts}) and the job "
            f"{pods} pods, one task each: {advice} (salloc -n {pods} ...)"
        )
    node = 0
    left = list(tasks)
    need = [0] * len(tasks)
    for slot in plan.pods:  # pods take the allocation's tasks in order, as place() gives them
        while left[node] == 0:
            node += 1
        left[node] -= 1
        need[node] += plan.component_of(slot.task).resources.cpus
    for index, (wanted, has) in enumerate(zip(need, cpus_per_node, strict=False)):
        if wanted > has:
            raise EngineError(
                f"allocation {job_id}: the pods on its node {index + 1} need {wanted} CPUs and it "
                f"has {has} there (SLURM_JOB_CPUS_PER_NODE={cpus}): {advice}"
            )


def check_steps(plan: SlurmPlan, environ: Mapping[str, str]) -> None:
    """An EngineError of one line when the steps the allocation created already and the job's
    first attempt are more than the cluster's MaxStepCount lets one job create.

    Slurm shows that count to no client (``squeue`` and ``scontrol`` list running steps only,
    ``sacct`` needs accounting storage), but a new step's id is the number of steps before it:
    one step (``srun --overlap``, printing its ``SLURM_STEP_ID``) tells it, and counts itself.
    When that step cannot say, or the job is small next to the limit (COUNT_FROM), the job starts
    uncounted (a refused step then ends it: batch.py). The step that chooses the master's port on
    its node, when that is not this machine (masterport.py), is one of the job's.
    """
    from torchjob import logs
    from torchjob.engines.slurm import clients
    from torchjob.engines.slurm.limits import STEP_LIMIT

    if not counted(plan):
        return
    job_id = environ.get("SLURM_JOB_ID", "")
    limit = plan.step_limit
    advice = "run it in a new allocation (--new-allocation, or another salloc)"
    argv = ["srun", f"--jobid={job_id}", "--nodes=1", "--ntasks=1", "--overlap", "--quiet"]
    argv += ["--job-name=torchjob-steps", "--", "printenv", "SLURM_STEP_ID"]
    try:
        said = clients.run(argv, clients.step_env(environ), COUNT_TIMEOUT).split()
    except clients.SlurmError as err:
        if re.search(STEP_LIMIT, str(err)):
            raise EngineError(
                f"allocation {job_id} has created as many job steps as the cluster lets one job "
                f"create ({limit.count}, {limit.source}): the job's {plan.steps} cannot start; {advice}"
            ) from None
        logs.info("slurm: the steps of allocation %s are not counted: %s", job_id, err)
        return
    if not said or not said[-1].isdigit():
        logs.info("slurm: the steps of allocation %s are not counted: srun said %r", job_id, said)
        return
    made = int(said[-1]) + 1
    logs.info("slurm: allocation %s has created %d job steps", job_id, made)
    probe = port_probe(plan, environ)
    if made + plan.steps + probe > limit.count:
        starts = f"{plan.steps} and one to choose its master's port" if probe else f"{plan.steps}"
        raise EngineError(
            f"allocation {job_id} has created {made} job steps (the last one to count them) and the "
            f"job starts {starts}: more than {limit.count}, {limit.source}; {advice}"
        )


def port_probe(plan: SlurmPlan, environ: Mapping[str, str]) -> int:
    """1 when the controller, here, chooses the master's ports with a step on its node (the
    master's node is another machine: masterport.py), else 0."""
    from torchjob.engines.slurm import steps
    from torchjob.engines.slurm.masterport import on_this_node
    from torchjob.engines.slurm.plan import place, rendezvous_ports

    if plan.master is None or not rendezvous_ports(plan.job):
        return 0
    try:
        master = place(plan, steps.layout_from_env(environ, steps.hostnames)).get(plan.master)
    except (ValueError, steps.SlurmError):
        return 0  # the controller cannot place the pods either: it makes no step at all
    return 0 if master is None or on_this_node(master.host, environ) else 1


def counted(plan: SlurmPlan) -> bool:
    """Whether ``run`` counts the allocation's steps before the job starts (see COUNT_FROM)."""
    return plan.steps >= COUNT_FROM * plan.step_limit.count


def start_controller(job_dir: Path, environ: Mapping[str, str]) -> tuple[int, str | None]:
    """The job's controller as a process of its own (a session of its own: a Ctrl-C at the
    terminal is the engine's to handle); its pid and start time."""
    from torchjob.engines.slurm.view import process_started

    fd = os.open(job_dir / CONTROLLER_OUT, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "torchjob.engines.slurm.batch", str(job_dir)],
            cwd=job_dir,
            env=dict(environ),
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        os.close(fd)
    return process.pid, process_started(process.pid)


def stop_controller(pid: int, started: str | None, timeout: float = STOP_GRACE) -> bool:
    """SIGTERM the controller (it stops its pods and writes the job's final state), SIGKILL it
    after ``timeout``; whether it is gone."""
    from torchjob.engines.slurm.view import process_alive

    if not process_alive(pid, started):
        return True
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process_alive(pid, started):
            _reap(pid)
            return True
        _reap(pid)
        time.sleep(0.1)
    if process_alive(pid, started):
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    _reap(pid)
    return not process_alive(pid, started)


def _reap(pid: int) -> None:
    """Collect the controller's exit status when this process started it (else nothing to do)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
