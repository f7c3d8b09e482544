"""The local engine's view of a job as the typed reports every engine prints (status.json)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from torchjob.engines.base import ContainerReport, FailureReport, JobReport, PodReport, PortReport
from torchjob.engines.local.output import short_name
from torchjob.engines.local.pod import FAILED, SUCCEEDED, LocalPod, RunningContainer
from torchjob.lifecycle import JobStatus
from torchjob.spec.model import Job
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

STOPPED = "Stopped"  # reported phase of a pod the engine stopped before it ended by itself
CRASH_LOOP = "CrashLoopBackOff"  # Kubernetes' reason for a container waiting to be restarted again
LOG_TAIL_LINES = 20  # lines of the first failed pod's log in its report (torchrun's root cause)
_TAIL_BYTES = 16384  # read from the end of that log: enough for 20 lines of a traceback


def pod_report(job: Job, pod: LocalPod, *, current: bool) -> PodReport:
    """One pod's report; ``current`` is False for an attempt the engine has already deleted."""
    containers = [container_report(c, pod.terminating) for c in pod.containers]
    looping = any(c.reason == CRASH_LOOP for c in containers)
    return PodReport(
        name=pod.name,
        short=short_name(job.name, pod.name),
        task=pod.task,
        index=pod.index,
        phase=pod.phase if current else _ended_phase(pod),
        rank=int(pod.rank) if pod.rank is not None and pod.rank.isdigit() else None,
        reason=CRASH_LOOP if looping and current else "",
        attempt=pod.attempt,
        restarts=pod.restarts,
        exit_code=last_exit_code(pod),
        started_at=pod.started_at,
        finished_at=pod.finished_at,
        address=pod.address,
        containers=containers,
        terminating=pod.terminating and not pod.gone,
    )


def last_exit_code(pod: LocalPod) -> int | None:
    """The pod's exit code; for a pod that has none (stopped by the job, or waiting to restart) the
    last one a container of it ended with: a main container's first, then a failed init container's."""
    if pod.exit_code is not None:
        return pod.exit_code
    mains = [c.exit_code for c in pod.mains if c.exit_code is not None]
    failed = sorted(mains, key=lambda code: code == 0)  # a failure says more than a success
    inits = [c.exit_code for c in pod.inits if c.exit_code not in (None, 0)]
    return next(iter(failed + inits), None)


def container_report(c: RunningContainer, terminating: bool) -> ContainerReport:
    """A container waiting out its restart back-off is in CrashLoopBackOff, as Kubernetes says;
    its exit code is then the last run's."""
    if c.running:
        state, reason = "running", ""
    elif c.next_start is not None and not terminating:
        state, reason = "waiting", CRASH_LOOP
    elif c.exit_code is not None:
        state, reason = "terminated", exit_reason(c.exit_code) or "Completed"
    else:
        state, reason = "waiting", ""
    return ContainerReport(
        name=c.run.name,
        init=c.run.init,
        state=state,
        exit_code=c.exit_code,
        reason=reason,
        restarts=c.restarts,
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
    pods = list(pods)
    reports = [pod_report(job, pod, current=current) for pod, current in pods]
    for report in reports:
        if report.phase == STOPPED:  # why, so that a pod CompleteJob stopped does not look failed
            report.reason = _stopped_because(status)
    first = first_failure(job, [pod for pod, _ in pods], crash_loops=status.phase.value == "Failed")
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
        first_failure=first,
        events=list(events),
        name_resolution=name_resolution,
    )


def _ended_phase(pod: LocalPod) -> str:
    """How a pod the engine deleted is reported: ``Stopped`` unless it had finished by itself."""
    return pod.phase if pod.phase in (SUCCEEDED, FAILED) else STOPPED


def _stopped_because(status: JobStatus) -> str:
    phase = status.phase.value
    if phase in ("Completing", "Completed"):
        return "job completed"
    return f"job {phase.lower()}"


def first_failure(job: Job, pods: list[LocalPod], *, crash_loops: bool = False) -> FailureReport | None:
    """The pod that failed first, by the time it ended: the root cause, as torchrun names it.

    Ranks that lose a peer fail later with their own errors (gloo's "connection closed"); the
    earliest failure is the one to read. Its log tail is read only once a pod has failed.
    """
    failed = [p for p in pods if p.phase == FAILED]
    if failed:
        pod = min(failed, key=lambda p: p.finished_at or 0.0)
    elif crash_loops:  # the job failed with no pod ended: one kept failing (--max-restarts)
        looping = [p for p in pods if p.restarts and any(c.exit_code not in (None, 0) for c in p.containers)]
        if not looping:
            return None
        pod = max(looping, key=lambda p: p.restarts)
    else:
        return None
    # The container that failed: an init container that never let the pod run, else a main one.
    bad = [c for c in pod.containers if c.exit_code not in (None, 0)]
    candidates = bad or pod.mains or pod.inits
    container = candidates[0] if candidates else None
    return FailureReport(
        pod=pod.name,
        short=short_name(job.name, pod.name),
        exit_code=pod.exit_code if failed else container.exit_code if container else None,
        rank=int(pod.rank) if pod.rank is not None and pod.rank.isdigit() else None,
        reason=exit_reason(pod.exit_code) if failed else CRASH_LOOP,
        time=pod.finished_at,
        log_tail=[] if container is None else log_tail(container.log),
    )


def exit_reason(code: int | None) -> str:
    """Kubernetes' reason for a terminated container: Error, or the signal that killed it."""
    if code is None or code == 0:
        return ""
    if code > 128:
        import signal

        try:
            return f"Error (killed by {signal.Signals(code - 128).name})"
        except ValueError:
            pass
    return "Error"


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of a log file ([] when it cannot be read)."""
    try:
        with open(path, "rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0, size - _TAIL_BYTES))
            data = log.read(_TAIL_BYTES)
    except OSError:
        return []
    text = data.decode(errors="replace").splitlines()
    if len(data) == _TAIL_BYTES and size > _TAIL_BYTES:
        text = text[1:]  # the first line read may be cut
    return text[-lines:]
