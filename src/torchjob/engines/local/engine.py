"""The local engine behind :class:`torchjob.engine_api.base.Engine`: jobs as processes of this machine.

Each job lives in its own directory under the state root (layout: :mod:`.state`); this module
finds jobs by reference, tells a job whose supervisor died (phase ``Unknown``), reads their logs
(:mod:`.logreader`) and stops them. Running a job is :func:`torchjob.engines.local.run_job`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from torchjob.engine_api import jobdirs
from torchjob.engine_api.base import (
    EngineError,
    JobReport,
    LogLine,
    LogQuery,
    Plan,
    QueueListing,
    StartOptions,
    StreamSink,
)
from torchjob.engines.local.roots import collect_expired, list_jobs, state_root
from torchjob.engines.local.settings import ENGINE
from torchjob.engines.local.state import JobDir
from torchjob.phases import UNKNOWN
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.engine_api.base import Engine, QueueingEngine, Sink
    from torchjob.engines.local.planning import LocalPlan
    from torchjob.errors import Issue
    from torchjob.spec.model import Job

STOP_GRACE = 15.0  # seconds a supervisor has to stop its job after SIGTERM, before SIGKILL
WATCHDOG_GRACE = 1.5  # after SIGKILL, the supervisor's watchdog needs about a second to stop the pods
WAIT_EVERY = 0.1  # seconds between reads of a waited-for job's status


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
        from torchjob.engines.local import gpus
        from torchjob.engines.local.localcheck import local_warnings
        from torchjob.engines.local.planning import declared_gpus
        from torchjob.spec.model import here_issues

        state = self._plan_of(job).state
        found = here_issues(job, errors=False) + ([] if state is None else local_warnings(state, {}))
        return found + gpus.absent(job, declared_gpus)  # a run says it as a note

    def plan(self, job: Job, options: StartOptions) -> Plan:
        """The pods in creation order with their ranks and resolved commands, and the ports to
        reserve (its text, written when asked); ``detail`` is the expanded, checked job that
        ``start`` runs (planning.py)."""
        from torchjob.engines.local.planning import plan_text

        local = self._plan_of(job)  # the expansion check or warnings made of this job, if they did

        def refused() -> Exception | None:  # start's own checks, in its order (run --dry-run)
            from torchjob.engines.local import refusal

            try:
                self._usable_root()
            except EngineError as err:
                return err
            return refusal(job, local, queue=ENGINE.value(options, "queue"))

        return Plan(self.name, job, options, lambda: plan_text(job, local), local, refused)

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
        from torchjob.engines.local import logreader  # not loaded by a run

        where = self._find(ref)
        report = self._live(where)
        for pod in report.pods:  # read here, not kept in status.json: output comes between its writes
            with contextlib.suppress(ValueError):  # a pod name that is not a plain name has none
                pod.last_output_at = logreader.last_output(where.log_dir(pod.name, pod.attempt))
        return report

    def wait(self, ref: str, timeout: float | None = None, sink: Sink | None = None) -> JobReport:
        """Polls the job's status; it has nothing to say while waiting (``sink`` is unused)."""
        from torchjob.engine_api.polling import until_ended

        where = self._find(ref)
        return until_ended(lambda: self._live(where), timeout, WAIT_EVERY)

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

    def _find(self, ref: str, deleting: bool = False) -> JobDir:
        """A job by id, by name (the newest of that name) or by an id prefix that only one job has
        (engine_api/jobdirs.py: the rules every engine with job directories follows)."""
        jobs = {where.id: where for where in self._jobs()}

        def started(job_id: str) -> float:
            return jobs[job_id].read_status().started_at or 0.0

        chosen = jobdirs.choose(ref, list(jobs), started, engine="local", root=self.root, deleting=deleting)
        return jobs[chosen]

    # --------------------------------------------------------------- logs

    def logs(self, ref: str, query: LogQuery) -> Iterator[LogLine]:
        """Every check is made here, before the first line: a wrong pod, container or attempt is an error."""
        from torchjob.engines.local.logreader import log_lines  # not loaded by a run

        return log_lines(self._find(ref), query)

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
        jobdirs.check_removable(self.root, state_root())
        found: dict[str, JobDir] = {}
        problems = []
        for ref in refs:
            try:
                where = self._find(ref, deleting=True)
            except EngineError as err:
                problems.append(str(err))
                continue
            found.setdefault(where.id, where)
        if problems:
            raise EngineError("; ".join(problems) + "; nothing was deleted")
        from torchjob.engines.local.process import kill_now

        left = []
        for where in found.values():
            _stop_supervisor(where)
            kill_now(where.id, [], [], 1.0)  # whatever of the job is left (a killed supervisor's)
            kept = where.remove()  # checked gone, not assumed
            if kept is not None:
                left.append(jobdirs.not_removed(where.id, kept))
        if left:
            raise EngineError("; ".join(left))
        return list(found)


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
