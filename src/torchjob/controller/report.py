"""The report of a job an engine runs through the kubelet: job, pods, containers, the root cause.

The same for every engine that runs pods itself (local, Slurm, ...): :func:`job_report` turns the
controller's state and the kubelet's attempts into the :class:`~torchjob.reports.JobReport` that
``status -o json`` prints and :mod:`torchjob.display` shows. The reasons are Kubernetes' words
(``Error``, ``Completed``, ``CrashLoopBackOff``); a pod the engine stopped is ``Stopped`` with its
job's phase as the reason; the first failure is the root cause :mod:`.rootcause` finds.
"""

from __future__ import annotations

from torchjob.controller.kubelet import ENDED, Container, Pod
from torchjob.controller.reasons import CRASH_LOOP, exit_reason, short_name, stopped_because
from torchjob.controller.rootcause import first_failure
from torchjob.phases import ContainerState, JobPhase, PodState
from torchjob.reports import ContainerReport, JobReport, PodReport, PortReport
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from torchjob.lifecycle import JobStatus
    from torchjob.reports import Event
    from torchjob.spec.model import Job


def pod_ranks(job: Job) -> dict[tuple[str, int], int | None]:
    """Each pod's rank, as the job's plugins give it (None: a pod without one, or several)."""
    from torchjob.plugins import build_plugins

    plugins = build_plugins(job)
    ranks: dict[tuple[str, int], int | None] = {}
    for task in job.spec.tasks:
        for index in range(task.replicas):
            found = [r for r in (p.rank(job, task, index) for p in plugins) if r is not None]
            ranks[(task.name, index)] = found[0] if found else None
    return ranks


def container_report(c: Container, terminating: bool) -> ContainerReport:
    """A container waiting out its restart back-off is in CrashLoopBackOff, as Kubernetes says;
    its exit code is then the last run's."""
    reason = ""
    if c.running:
        state = ContainerState.RUNNING
    elif c.next_start is not None and c.exit_code is not None and not terminating:
        state, reason = ContainerState.WAITING, CRASH_LOOP
    elif c.exit_code is not None:
        state, reason = ContainerState.TERMINATED, exit_reason(c.exit_code) or "Completed"
    else:
        state = ContainerState.WAITING
    return ContainerReport(c.name, c.init, state, c.exit_code, reason, c.restarts)


def last_exit_code(pod: Pod) -> int | None:
    """The pod's exit code; for a pod that has none (stopped by the job, or waiting to restart) the
    last one a container of it ended with: a main container's first, then a failed init container's."""
    if pod.exit_code is not None:
        return pod.exit_code
    mains = [c.exit_code for c in pod.mains if c.exit_code is not None]
    failed = sorted(mains, key=lambda code: code == 0)  # a failure says more than a success
    inits = [c.exit_code for c in pod.inits if c.exit_code not in (None, 0)]
    return next(iter(failed + inits), None)


def pod_report(job: Job, pod: Pod, *, current: bool, status: JobStatus) -> PodReport:
    """One attempt's report; ``current`` is False for an attempt that is gone (stopped, deleted)."""
    containers = [container_report(c, pod.terminating) for c in pod.containers]
    if current or pod.phase in ENDED:
        phase, reason = PodState(pod.phase), ""
        if current and any(c.reason == CRASH_LOOP for c in containers):
            reason = CRASH_LOOP
    else:  # stopped before it ended by itself: why, so that a pod CompleteJob stopped does not look failed
        phase, reason = PodState.STOPPED, stopped_because(status.phase)
    return PodReport(
        name=pod.name,
        short=short_name(job.name, pod.name),
        task=pod.task,
        index=pod.index,
        phase=phase,
        rank=pod.rank,
        reason=reason,
        attempt=pod.attempt,
        restarts=pod.restarts,
        exit_code=last_exit_code(pod),
        started_at=pod.started_at,
        finished_at=pod.finished_at,
        address=pod.address,
        containers=containers,
        terminating=pod.terminating and not pod.gone,
    )


def job_report(
    job: Job,
    *,
    engine: str,
    id: str,
    location: str,
    status: JobStatus,
    latest: Mapping[tuple[str, int], Pod],
    current: Mapping[tuple[str, int], Pod],
    started: float | None,
    finished: float | None,
    events: Iterable[Event],
    ports: Mapping[int, int] | None = None,
    name_resolution: str = "",
) -> JobReport:
    """The whole job: its pods in task order, each as its newest attempt (``latest``) stands; an
    attempt not in ``current`` (the attempts that exist) is gone. A pod not created yet (its task
    waits for another, or the job its turn in a queue) is not there, as on a cluster."""
    pods = []
    for task in job.spec.tasks:
        for index in range(task.replicas):
            pod = latest.get((task.name, index))
            if pod is not None:
                now = current.get((task.name, index)) is pod and not pod.gone
                pods.append(pod_report(job, pod, current=now, status=status))
    attempts = list(latest.values())
    return JobReport(
        engine=engine,
        id=id,
        name=job.name,
        phase=status.phase.value,
        reason=status.reason,
        namespace=job.metadata.namespace or "default",
        location=location,
        retry_count=status.retry_count,
        max_retry=job.spec.max_retry,
        started_at=started,
        finished_at=finished,
        pods=pods,
        ports=[PortReport(d, h) for d, h in (ports or {}).items()],
        first_failure=first_failure(job, attempts, crash_loops=status.phase is JobPhase.FAILED),
        events=list(events),
        name_resolution=name_resolution,
    )
