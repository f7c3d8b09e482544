"""A local job's logs as the engine's ``logs`` reads them: per pod, container and attempt, followed
until the job ends.

Each container's output is a file, ``logs/<pod>/attempt-<n>/<container>.log`` in the job
directory (:mod:`.state`): a query picks pods (full name, short name or task), a container and an
attempt (or all of them), init containers first, the pod that failed first before the others. A
job whose status.json cannot be read still shows the logs found on disk, without ranks.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from torchjob.display import first_failed_first, prefix_for
from torchjob.engine_api.base import (
    ContainerReport,
    EngineError,
    JobReport,
    LogLine,
    LogQuery,
    PodReport,
    StreamSink,
)
from torchjob.engines.local.state import JobDir
from torchjob.phases import PodState
from torchjob.records import record

FOLLOW_EVERY = 0.1  # seconds between reads of a followed job's logs and status


@record(frozen=True)
class _LogFile:
    path: Path
    prefix: str
    ordinal: int  # of its pod in the query's pods
    pod: str  # short name


def log_lines(where: JobDir, query: LogQuery) -> Iterator[LogLine]:
    """The job's log lines the query asks for; every check is made before the first line: a
    wrong pod, container or attempt is an EngineError naming those that exist."""
    report, problem = where.read_status_checked()
    if problem is not None:  # the logs on disk are still the job's: shown, without ranks
        report.pods = _pods_on_disk(where, report.name)
        if not report.pods:
            raise EngineError(f"{problem}; no pod of job {where.id} has a log to show")
        StreamSink().notice(f"{problem}; showing the pods' logs found on disk (without ranks)")
    files = _log_files(where, report, query, check=True)
    return _read_logs(where, report, query, files)


def _read_logs(where: JobDir, report: JobReport, query: LogQuery, files: list[_LogFile]) -> Iterator[LogLine]:
    from torchjob.files import LogFollower

    follower = LogFollower()
    known: dict[Path, _LogFile] = {}
    while True:
        for file in files:
            follower.follow(file.path, file.prefix)
            known[file.path] = file
        finished = not query.follow or report.terminal or not where.supervisor_alive()
        if finished:
            for path in list(follower.files):
                follower.close(path)
        for item, text in follower.read():
            file = known[item.path]
            yield LogLine(item.prefix, text, file.ordinal, file.pod)
        if finished and not follower.files:
            return
        if not finished:
            time.sleep(FOLLOW_EVERY)
            report, problem = where.read_status_checked()
            if problem is not None:
                report.pods = _pods_on_disk(where, report.name)
            files = _log_files(where, report, query, check=False)


def _log_files(where: JobDir, report: JobReport, query: LogQuery, *, check: bool) -> list[_LogFile]:
    """Every log file the query asks for, oldest attempt first; with ``check``, a pod,
    container or attempt the job does not have is an EngineError naming those it has."""
    pods = first_failed_first(report, _select_pods(report.pods, query.pod))
    attempts_of = {p.name: _attempts(where, p.name) for p in pods}
    if check:
        _check_pod(where, report, pods, query)
        _check_container(where, pods, query)
        _check_attempt(where, pods, query, attempts_of)
    files: list[_LogFile] = []
    for ordinal, pod in enumerate(pods):
        files += _pod_log_files(where, pod, ordinal, query, attempts_of[pod.name])
    return files


def last_output(log_dir: Path) -> float | None:
    """When the newest log file of a pod attempt was last written (None: no logs yet)."""
    times = []
    for log in log_dir.glob("*.log"):
        with contextlib.suppress(OSError):
            times.append(log.stat().st_mtime)
    return max(times, default=None)


def _select_pods(pods: list[PodReport], wanted: str | None) -> list[PodReport]:
    """All pods, or those ``wanted`` names: a pod's full name, its short name, or its task."""
    if wanted is None:
        return list(pods)
    for hit in ([p for p in pods if p.name == wanted], [p for p in pods if p.short == wanted]):
        if hit:
            return hit
    return [p for p in pods if p.task == wanted]


def _check_pod(where: JobDir, report: JobReport, pods: list[PodReport], query: LogQuery) -> None:
    if query.pod is not None and not pods:
        names = ", ".join(p.short for p in report.pods) or "none yet"
        raise EngineError(f"job {where.id} has no pod {query.pod!r} (pods: {names})")


def _check_container(where: JobDir, pods: list[PodReport], query: LogQuery) -> None:
    if query.container is None:
        return
    known = sorted({c.name for p in pods for c in p.containers})
    if query.container not in known:
        raise EngineError(
            f"job {where.id} has no container {query.container!r} "
            f"(containers: {', '.join(known) or 'none yet'})"
        )


def _check_attempt(
    where: JobDir, pods: list[PodReport], query: LogQuery, attempts_of: dict[str, list[int]]
) -> None:
    wanted = query.attempt
    if wanted is None or query.all_attempts or any(wanted in found for found in attempts_of.values()):
        return
    listed = "; ".join(f"{p.short}: {', '.join(map(str, attempts_of[p.name])) or 'none'}" for p in pods)
    raise EngineError(f"job {where.id} has no attempt {wanted} (attempts: {listed})")


def _pod_log_files(
    where: JobDir, pod: PodReport, ordinal: int, query: LogQuery, found: list[int]
) -> list[_LogFile]:
    """One pod's log files: init containers first, each attempt the query asks for."""
    attempts = found if query.all_attempts else [query.attempt if query.attempt is not None else pod.attempt]
    mains = [c.name for c in pod.containers if not c.init]
    inits = [c.name for c in pod.containers if c.init]
    files = []
    for attempt in attempts:
        for name in [*inits, *mains]:
            if query.container is not None and name != query.container:
                continue
            label = None if (name in mains and len(mains) == 1) else name
            prefix = prefix_for(pod.short or pod.name, pod.rank, label)
            if query.all_attempts:
                prefix += f" #{attempt}"
            path = where.log_dir(pod.name, attempt) / f"{name}.log"
            files.append(_LogFile(path, prefix, ordinal, pod.short or pod.name))
    return files


def _pods_on_disk(where: JobDir, job_name: str) -> list[PodReport]:
    """The pods whose logs are in the job directory (``logs/<pod>/attempt-<n>/<container>.log``),
    for a job whose status.json cannot be read: ranks, phases and init containers are unknown."""
    pods = []
    for name in sorted(p.name for p in where.logs.glob("*") if p.is_dir() and not p.is_symlink()):
        attempts = _attempts(where, name)
        containers = sorted({f.stem for n in attempts for f in where.log_dir(name, n).glob("*.log")})
        if not containers:
            continue
        short = name[len(job_name) + 1 :] if name.startswith(job_name + "-") else name
        task, _, index = short.rpartition("-")
        pod = PodReport(
            name=name,
            short=short,
            task=task or short,
            index=int(index) if index.isascii() and index.isdigit() else 0,
            phase=PodState.UNKNOWN,
            attempt=attempts[-1],
            containers=[ContainerReport(c) for c in containers],
        )
        pods.append(pod)
    return pods


def _attempts(where: JobDir, pod: str) -> list[int]:
    found = (p.name.partition("-")[2] for p in (where.logs / pod).glob("attempt-*"))
    return sorted(int(n) for n in found if n.isdigit())
