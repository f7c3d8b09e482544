"""When pods may start (Volcano's ``dependsOn``) and when a job has run out of time.

Pure: the engine passes in the pods as reported and the seconds elapsed; nothing here reads a
clock or a process.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchjob.lifecycle.types import JobPhase, PodPhase, PodStatus
from torchjob.spec.model import Job

_UP = (PodPhase.RUNNING, PodPhase.SUCCEEDED)


def task_ready(job: Job, name: str, pods: Sequence[PodStatus], *, complete: bool = False) -> bool:
    """A task other tasks may depend on is ready once minAvailable of its pods run or succeeded;
    ``complete`` (JobSet's ``status: Complete``): once every one of its pods succeeded.

    A pod being stopped does not count: it is about to go. An unknown task never holds anything up.
    """
    task = job.task(name)
    if task is None:
        return True
    if complete:
        done = sum(1 for p in pods if p.task == name and p.phase is PodPhase.SUCCEEDED and not p.terminating)
        return done >= task.replicas
    need = task.min_available if task.min_available is not None else task.replicas
    up = sum(1 for p in pods if p.task == name and p.phase in _UP and not p.terminating)
    return up >= need


def dependencies_ready(job: Job, name: str, pods: Sequence[PodStatus]) -> bool:
    """Volcano's dependsOn: pods of a task start once any (or all) of the named tasks are ready
    (or completed, for those the dependency names so)."""
    task = job.task(name)
    if task is None or task.depends_on is None or not task.depends_on.names:
        return True
    complete = task.depends_on.complete
    ready = [task_ready(job, dep, pods, complete=dep in complete) for dep in task.depends_on.names]
    return all(ready) if task.depends_on.iteration == "all" else any(ready)


def never_ready(job: Job, name: str, pods: Sequence[PodStatus]) -> PodStatus | None:
    """A failed pod of a task that ``name`` waits for to complete: unless something restarts it,
    the dependency can never be met (JobSet: the Job failed, and its failure policy acts)."""
    task = job.task(name)
    if task is None or task.depends_on is None:
        return None
    waits = set(task.depends_on.complete)
    return next(
        (p for p in pods if p.task in waits and p.phase is PodPhase.FAILED and not p.terminating), None
    )


def active_deadline(job: Job, timeout: float | None) -> float | None:
    """Seconds the job may run: the shorter of the caller's timeout and the job's
    ``runPolicy.activeDeadlineSeconds``; unset or 0 means no limit."""
    own = job.run_policy.active_deadline_seconds if job.run_policy is not None else None
    limits = [t for t in (timeout, own) if t]
    return float(min(limits)) if limits else None


def deadline_passed(deadline: float | None, phase: JobPhase, elapsed: float) -> bool:
    """Whether a job that has run ``elapsed`` seconds must be stopped for its deadline.

    A job that is already ending (Terminating or final) is not stopped again.
    """
    if deadline is None or phase.final or phase is JobPhase.TERMINATING:
        return False
    return elapsed > deadline
