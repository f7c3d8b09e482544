"""The local engine's view of a job as the typed reports every engine prints (status.json)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from torchjob.engines.base import ContainerReport, FailureReport, JobReport, PodReport, PortReport
from torchjob.engines.local.output import short_name
from torchjob.engines.local.pod import FAILED, SUCCEEDED, LocalPod
from torchjob.lifecycle import JobStatus
from torchjob.spec.model import Job

STOPPED = "Stopped"  # reported phase of a pod the engine stopped before it ended by itself


def pod_report(job: Job, pod: LocalPod, *, current: bool) -> PodReport:
    """One pod's report; ``current`` is False for an attempt the engine has already deleted."""
    containers = [
        ContainerReport(
            name=c.run.name,
            init=c.run.init,
            state="running" if c.running else ("terminated" if c.exit_code is not None else "waiting"),
            exit_code=c.exit_code,
            restarts=c.restarts,
        )
        for c in pod.containers
    ]
    return PodReport(
        name=pod.name,
        short=short_name(job.name, pod.name),
        task=pod.task,
        index=pod.index,
        phase=pod.phase if current else _ended_phase(pod),
        rank=int(pod.rank) if pod.rank is not None and pod.rank.isdigit() else None,
        attempt=pod.attempt,
        restarts=pod.restarts,
        exit_code=pod.exit_code,
        started_at=pod.started_at,
        finished_at=pod.finished_at,
        address=pod.address,
        containers=containers,
        terminating=pod.terminating and not pod.gone,
    )


def job_report(
    job: Job,
    *,
    id: str,
    location: str,
    status: JobStatus,
    pods: Iterable[tuple[LocalPod, bool]],
    ports: Mapping[int, int],
    started: float,
    finished: float | None,
    events: list[dict[str, Any]],
    name_resolution: str,
) -> JobReport:
    """The whole job: ``pods`` is the newest attempt of every pod, each with whether it still exists."""
    reports = [pod_report(job, pod, current=current) for pod, current in pods]
    failed = [p for p in reports if p.phase == FAILED]
    first = min(failed, key=lambda p: p.finished_at or 0.0) if failed else None
    return JobReport(
        engine="local",
        id=id,
        name=job.name,
        phase=status.phase.value,
        reason=status.reason,
        namespace=job.metadata.namespace,
        location=location,
        retry_count=status.retry_count,
        max_retry=job.spec.max_retry,
        started_at=started,
        finished_at=finished,
        pods=reports,
        ports=[PortReport(d, h) for d, h in ports.items()],
        first_failure=None
        if first is None
        else FailureReport(first.name, first.short, first.exit_code, first.rank, "Error", first.finished_at),
        events=list(events),
        name_resolution=name_resolution,
    )


def _ended_phase(pod: LocalPod) -> str:
    """How a pod the engine deleted is reported: ``Stopped`` unless it had finished by itself."""
    return pod.phase if pod.phase in (SUCCEEDED, FAILED) else STOPPED
