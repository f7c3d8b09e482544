"""The local engine behind :class:`torchjob.engine_api.base.Engine`: jobs as processes of this machine.

Each job lives in its own directory under the state root (layout: :mod:`.state`); this module
finds jobs by reference, tells a job whose supervisor died (phase ``Unknown``), reads their logs and
stops them. Running a job is :func:`torchjob.engines.local.run_job`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from torchjob.display import first_failed_first, prefix_for
from torchjob.engine_api.base import (
    ContainerReport,
    EngineError,
    JobNotFound,
    JobReport,
    LogLine,
    LogQuery,
    Plan,
    PodReport,
    QueueListing,
    StartOptions,
    StreamSink,
)
from torchjob.engines.local.settings import ENGINE
from torchjob.engines.local.state import (
    ROOT_MARKER,
    JobDir,
    collect_expired,
    is_state_root,
    list_jobs,
    state_root,
)
from torchjob.phases import UNKNOWN, PodState
from torchjob.records import record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.engine_api.base import Engine, QueueingEngine, Sink
    from torchjob.engines.local.planning import LocalPlan
    from torchjob.errors import Issue
    from torchjob.spec.model import Job

MIN_DELETE_PREFIX = 4  # shorter id prefixes match too easily to delete by
STOP_GRACE = 15.0  # seconds a supervisor has to stop its job after SIGTERM, before SIGKILL
WATCHDOG_GRACE = 1.5  # after SIGKILL, the supervisor's watchdog needs about a second to stop the pods
FOLLOW_EVERY = 0.1  # seconds between reads of a followed job's logs and status


@record(frozen=True)
class _LogFile:
    path: Path
    prefix: str
    ordinal: int  # of its pod in the query's pods
    pod: str  # short name


class LocalEngine:
    name = "local"

    def __init__(self, state_dir: str | Path | None = None, **ignored: Any) -> None:
        self.root = state_root(Path(state_dir) if state_dir is not None else None)
        self._chosen_by = Path(state_dir) if state_dir is not None else None
        self._planned: tuple[Job, LocalPlan] | None = None  # the last plan made, for start

    def _usable_root(self) -> Path:
        """The root, once known to be this user's directory (or free to be made): else one line."""
        from torchjob.engines.local.rootcheck import origin, root_problem

        problem = root_problem(self.root)
        if problem is not None:
            raise EngineError(f"{origin(self._chosen_by)}: {problem}")
        return self.root

    # ------------------------------------------------------------ running

    def _plan_of(self, job: Job) -> LocalPlan:
        """The plan made for this very job (by check, warnings or plan), else a new one: the job is
        expanded once whichever of them, and start, are asked."""
        from torchjob.engines.local.planning import plan_job

        made = self._planned
        if made is not None and made[0] is job and made[1].state is not None:
            return made[1]
        local = plan_job(job)
        self._planned = (job, local)
        return local

    def check(self, job: Job) -> list[Issue]:
        return self._plan_of(job).problems

    def warnings(self, job: Job) -> list[Issue]:
        """What ``job`` asks for that has no effect here (``validate --local``; a run records them)."""
        from torchjob.engines.local.containers import local_warnings

        state = self._plan_of(job).state
        return [] if state is None else local_warnings(state, {})

    def plan(self, job: Job, options: StartOptions) -> Plan:
        """The pods in creation order with their ranks and resolved commands, and the ports to
        reserve (its text, written when asked); ``detail`` is the expanded, checked job that
        ``start`` runs (planning.py)."""
        from torchjob.engines.local.planning import plan_text

        local = self._plan_of(job)  # the expansion check or warnings made of this job, if they did
        return Plan(self.name, job, options, lambda: plan_text(job, local), local)

    def start(self, plan: Plan) -> JobReport:
        from torchjob.engines.local import RunOptions, run_job

        planned: LocalPlan = plan.detail_for(self.name)  # the job expanded and checked once
        job, options = plan.job, plan.options
        result = run_job(
            job,
            RunOptions(
                state_dir=self._usable_root(),
                quiet=options.quiet or options.detach,
                timeout=options.timeout,
                extra_env=dict(options.extra_env),
                detach=options.detach,
                prewarm=ENGINE.value(options, "prewarm"),
                max_restarts=ENGINE.value(options, "max_restarts"),
                on_start=options.on_start,
                preload=tuple(ENGINE.value(options, "preload")),
                warm=ENGINE.value(options, "warm"),
                queue=ENGINE.value(options, "queue"),
                remove=options.remove,
                hang_notice=ENGINE.value(options, "hang_notice"),
            ),
            planned,
            output=_output(options.sink),
        )
        if options.detach and not result.started:  # no job id to give: there is no job to follow
            raise EngineError(f"job {result.job_id} did not start: {result.reason}", exit_code=1)
        if not options.detach and result.report is not None:  # the final status, just read
            return result.report
        where = JobDir(result.job_dir)
        if not where.status_file.exists():  # detached, and its supervisor has not written yet
            return JobReport(self.name, where.id, job.name, "Pending", location=str(where.path))
        return self._live(where)

    # ------------------------------------------------------------ reading

    def list_jobs(self) -> list[JobReport]:
        return [self._live(d) for d in reversed(self._jobs())]

    def _jobs(self) -> list[JobDir]:
        """The jobs kept, oldest first; those past their ttlSecondsAfterFinished are removed first."""
        root = self._usable_root()
        try:
            collect_expired(root, time.time())
            return list_jobs(root)
        except OSError as err:  # a job directory made unreadable: say which
            raise EngineError(_cannot_read(err)) from None

    def status(self, ref: str) -> JobReport:
        where = self._find(ref)
        report = self._live(where)
        for pod in report.pods:  # read here, not kept in status.json: output comes between its writes
            with contextlib.suppress(ValueError):  # a pod name that is not a plain name has none
                pod.last_output_at = last_output(where.log_dir(pod.name, pod.attempt))
        return report

    def wait(self, ref: str, timeout: float | None = None, sink: Sink | None = None) -> JobReport:
        """Polls the job's status; it has nothing to say while waiting (``sink`` is unused)."""
        where = self._find(ref)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            report = self._live(where)
            if report.terminal or report.phase == UNKNOWN:  # Unknown: nobody will change it again
                return report
            if deadline is not None and time.monotonic() >= deadline:
                return report
            time.sleep(FOLLOW_EVERY)

    def _live(self, where: JobDir) -> JobReport:
        """The stored report, with phase Unknown when its supervisor died before the job ended."""
        try:
            report = where.read_status()
        except OSError as err:
            raise EngineError(_cannot_read(err)) from None
        if report.terminal or report.phase == UNKNOWN or where.supervisor_alive():
            return report
        report.reason = (
            f"the supervisor of this job is gone; last known phase {report.phase}: {report.reason}"
        )
        report.phase = UNKNOWN
        return report

    def _find(self, ref: str, min_prefix: int = 1) -> JobDir:
        """A job by id, by name (the newest of that name) or by an id prefix that only one job has."""
        if not ref:
            raise EngineError("a job reference cannot be empty: give a job id, an id prefix or a name")
        jobs = self._jobs()
        for where in jobs:
            if where.id == ref:
                return where
        # A job's directory is named <job name>-<6 hex>: only those can carry the name.
        named = [(where, where.read_status()) for where in jobs if where.id.startswith(f"{ref}-")]
        named = [(where, report) for where, report in named if report.name == ref]
        if named:
            return max(named, key=lambda item: item[1].started_at or 0.0)[0]
        prefixed = [where for where in jobs if where.id.startswith(ref)]
        if prefixed and len(ref) < min_prefix:
            raise EngineError(
                f"job {ref!r} is too short a prefix to pick a job by: give the job's name, its id "
                f"or at least {min_prefix} characters of it"
            )
        if len(prefixed) == 1:
            return prefixed[0]
        if prefixed:
            raise EngineError(f"job {ref!r} is ambiguous: {', '.join(j.id for j in prefixed)}")
        raise JobNotFound(f"no local job {ref!r} in {self.root}", ref)

    # --------------------------------------------------------------- logs

    def logs(self, ref: str, query: LogQuery) -> Iterator[LogLine]:
        """Every check is made here, before the first line: a wrong pod, container or attempt is an error."""
        where = self._find(ref)
        report, problem = where.read_status_checked()
        if problem is not None:  # the logs on disk are still the job's: shown, without ranks
            report.pods = _pods_on_disk(where, report.name)
            if not report.pods:
                raise EngineError(f"{problem}; no pod of job {where.id} has a log to show")
            StreamSink().notice(f"{problem}; showing the pods' logs found on disk (without ranks)")
        files = self._log_files(where, report, query, check=True)
        return self._read_logs(where, report, query, files)

    def _read_logs(
        self, where: JobDir, report: JobReport, query: LogQuery, files: list[_LogFile]
    ) -> Iterator[LogLine]:
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
                files = self._log_files(where, report, query, check=False)

    def _log_files(self, where: JobDir, report: JobReport, query: LogQuery, *, check: bool) -> list[_LogFile]:
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

    # -------------------------------------------------------------- queue

    def queues(self) -> QueueListing:
        """The queue (admission/): its every job, whatever its state directory (every user's, if shared)."""
        from torchjob.engines.local.admission import queue_listing

        return queue_listing()

    # ------------------------------------------------------------- delete

    def delete(self, refs: list[str]) -> list[str]:
        """Every ref must name a job (exact id, exact name, or an id prefix of 4 characters or
        more) before any job is touched: a mistyped second ref deletes nothing. A root torchjob
        did not mark as its own (a project directory given as --state-dir) is refused outright."""
        if self.root.exists() and not is_state_root(self.root):
            raise EngineError(
                f"{self.root} is not a torchjob state directory (torchjob writes {ROOT_MARKER} into "
                "each one it keeps jobs in); refusing to delete anything there (if it holds jobs of "
                f"an older torchjob, create {self.root / ROOT_MARKER})"
            )
        found: dict[str, JobDir] = {}
        problems = []
        for ref in refs:
            try:
                where = self._find(ref, MIN_DELETE_PREFIX)
            except EngineError as err:
                problems.append(str(err))
                continue
            found.setdefault(where.id, where)
        if problems:
            raise EngineError("; ".join(problems) + "; nothing was deleted")
        import shutil

        from torchjob.engines.local.process import kill_now

        for where in found.values():
            _stop_supervisor(where)
            kill_now(where.id, [], [], 1.0)  # whatever of the job is left (a killed supervisor's)
            shutil.rmtree(where.path, ignore_errors=True)
        return list(found)


def last_output(log_dir: Path) -> float | None:
    """When the newest log file of a pod attempt was last written (None: no logs yet)."""
    times = []
    for log in log_dir.glob("*.log"):
        with contextlib.suppress(OSError):
            times.append(log.stat().st_mtime)
    return max(times, default=None)


def _output(sink: Sink | None) -> object:
    """Where the job's console writes: the caller's stream, else (a sink of lines) the sink."""
    if sink is None:
        return StreamSink().stream
    if sink.stream is not None:
        return sink.stream
    from torchjob.engines.local.output import SinkConsole

    return SinkConsole(sink)


def _cannot_read(err: OSError) -> str:
    return f"cannot read {err.filename or 'the job directory'}: {err.strerror or err}"


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


def _stop_supervisor(where: JobDir) -> None:
    """SIGTERM the supervisor (it stops the job's pods), then SIGKILL (its watchdog cleans up)."""
    found = where.supervisor()
    # This process supervised the job itself (``run --rm``, attached): the job has ended already.
    if found is None or found[0] == os.getpid() or not where.supervisor_alive():
        return
    pid = found[0]
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    while where.supervisor_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if where.supervisor_alive():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        time.sleep(WATCHDOG_GRACE)


if TYPE_CHECKING:  # mypy checks here that the class implements the engine interface
    _implements: type[Engine] = LocalEngine
    _queues: type[QueueingEngine] = LocalEngine
