"""The local engine's view of a job as the typed reports every engine prints (status.json)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from torchjob.engine_api.base import ContainerReport, FailureReport, JobReport, PodReport, PortReport
from torchjob.engine_api.reasons import exit_reason, stopped_because
from torchjob.engines.local.output import short_name
from torchjob.engines.local.pod import FAILED, SUCCEEDED, LocalPod, RunningContainer
from torchjob.lifecycle import JobPhase, JobStatus
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
    network: str = "",
) -> JobReport:
    """The whole job: ``pods`` is the newest attempt of every pod, each with whether it still exists."""
    pods = list(pods)
    reports = [pod_report(job, pod, current=current) for pod, current in pods]
    for report in reports:
        if report.phase == STOPPED:  # why, so that a pod CompleteJob stopped does not look failed
            report.reason = _stopped_because(status)
    first = first_failure(job, [pod for pod, _ in pods], crash_loops=status.phase is JobPhase.FAILED)
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
        network=network,
    )


def _ended_phase(pod: LocalPod) -> str:
    """How a pod the engine deleted is reported: ``Stopped`` unless it had finished by itself."""
    return pod.phase if pod.phase in (SUCCEEDED, FAILED) else STOPPED


def _stopped_because(status: JobStatus) -> str:
    return stopped_because(status.phase)


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
    failure = FailureReport(
        pod=pod.name,
        short=short_name(job.name, pod.name),
        exit_code=pod.exit_code if failed else container.exit_code if container else None,
        rank=int(pod.rank) if pod.rank is not None and pod.rank.isdigit() else None,
        reason=exit_reason(pod.exit_code) if failed else CRASH_LOOP,
        time=pod.finished_at,
        log_tail=[] if container is None else log_tail(container.log),
    )
    if container is not None and failed and any(line.strip() == ROOT_CAUSE for line in failure.log_tail):
        found = torchrun_root_cause(log_tail(container.log, None, _TORCHRUN_BYTES))
        if found is not None:  # the rank that failed under the pod's torchrun, not the node
            failure.rank, failure.exit_code, failure.log_tail = found
            failure.reason = exit_reason(failure.exit_code)
    return failure


ROOT_CAUSE = "Root Cause (first observed failure):"  # in torchrun's report of a failed rank
_TORCHRUN_BYTES = 65536  # read for torchrun's report and the rank's lines before it
# torchrun's own log lines: "E1126 16:19:13.695000 9050 torch/distributed/elastic/...] ..."
_TORCHRUN_LOG = r"[DIWEF]\d{4} [\d:.]+ \d+ torch/distributed/"


def torchrun_root_cause(lines: list[str]) -> tuple[int, int | None, list[str]] | None:
    """From the log of a pod whose torchrun reported a failed rank: that rank (global), its exit
    code (a signal as 128+N, as for a pod) and its own last lines instead of torchrun's report:
    those torch prefixes with ``[rankN]:`` (a traceback after init_process_group), else the
    lines before torchrun's report without torchrun's own log lines; None without a report."""
    import re

    starts = [i for i, line in enumerate(lines) if line.strip() == ROOT_CAUSE]
    if not starts:
        return None
    fields: dict[str, int] = {}
    for line in lines[starts[-1] + 1 : starts[-1] + 10]:
        key, _, value = line.partition(":")
        match = re.match(r"\s*(-?\d+)", value)
        if match:
            fields.setdefault(key.strip(), int(match[1]))
    if "rank" not in fields:
        return None
    rank, code = fields["rank"], fields.get("exitcode")
    prefix = f"[rank{rank}]:"
    own = [line[len(prefix) :].removeprefix(" ") for line in lines if line.startswith(prefix)]
    if not own:
        log = re.compile(_TORCHRUN_LOG)
        ends = [i for i, line in enumerate(lines) if log.match(line) and "failed (exitcode" in line]
        own = [line for line in lines[: ends[0] if ends else starts[-1]] if not log.match(line)]
        while own and not own[-1].strip():
            own.pop()
    return rank, (None if code is None else 128 - code if code < 0 else code), own[-LOG_TAIL_LINES:]


def log_tail(path: Path, lines: int | None = LOG_TAIL_LINES, nbytes: int = _TAIL_BYTES) -> list[str]:
    """The last ``lines`` lines (None: all) of the last ``nbytes`` of a log file ([] when it
    cannot be read)."""
    try:
        with open(path, "rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0, size - nbytes))
            data = log.read(nbytes)
    except OSError:
        return []
    text = data.decode(errors="replace").splitlines()
    if len(data) == nbytes and size > nbytes:
        text = text[1:]  # the first line read may be cut
    return text if lines is None else text[-lines:]
