"""The ``slurm`` engine: a job as one Slurm allocation whose pods are job steps.

``start`` makes the job directory under the job root (a filesystem the login node and the compute
nodes share), writes the job, its options and the batch script there and submits the allocation
with ``sbatch`` (inside an allocation that exists, it starts the job's controller in it instead:
allocation.py). The batch script runs ``torchjob.engines.slurm.batch`` on the batch host, which
drives the job with the engine-neutral controller and writes ``status.json`` and every attempt's
logs into the job directory. Everything else reads that directory plus Slurm's own view (view.py),
follows it (follow.py), and cancels it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from torchjob import logs
from torchjob.engine_api import jobdirs
from torchjob.engine_api.base import EngineError, JobReport, LogQuery, Plan, StartOptions, StreamSink
from torchjob.engines.slurm import cancel, clients, follow, preflight
from torchjob.engines.slurm.settings import ENV, SlurmSettings, job_root, settings_from
from torchjob.engines.slurm.view import JOB_FILE, OPTIONS_FILE, SLURM_FILE, SlurmView, owned_root
from torchjob.errors import Issue
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.engine_api.base import Engine, LogLine, Sink
    from torchjob.engines.slurm.limits import StepLimit
    from torchjob.engines.slurm.plan import SlurmPlan
    from torchjob.spec.model import Job


def _remove(job_dir: Path) -> str:
    """Remove a job directory and all in it, checked (engine_api/jobdirs.py); "" once it is gone,
    else what to say of what stayed (also logged, for -v)."""
    left = jobdirs.remove(job_dir)
    if left is None:
        return ""
    said = jobdirs.not_removed(job_dir.name, left)
    logs.info("slurm: %s", said)
    return said


def _removed(job_dir: Path, said: str) -> str:
    """``said``, and what stayed of ``job_dir`` once it is removed (:func:`_remove`): one message."""
    return "; ".join(filter(None, [said, _remove(job_dir)]))


def _batch_command(job_dir: Path) -> list[str]:
    """What the batch script execs: this interpreter (a shared venv) running the job's controller."""
    return [sys.executable, "-m", "torchjob.engines.slurm.batch", str(job_dir)]


class SlurmEngine:
    name = "slurm"

    def __init__(self, **settings: Any) -> None:
        self.given = {k: v for k, v in settings.items() if k in ENV}  # another engine's are not ours
        self.settings = settings_from(self.given, dict(os.environ))
        self.root = job_root(self.settings)
        self.default_root = job_root(SlurmSettings())
        self.view = SlurmView(self.root)
        self._step_limit: StepLimit | None = None  # the cluster's, read once (limits.py)

    def _for(self, options: StartOptions) -> SlurmSettings:
        """The settings of one start: those its options give, over the engine's own."""
        given = {**self.given, **{k: v for k, v in options.settings.items() if k in ENV and v is not None}}
        return settings_from(given, dict(os.environ))

    # ------------------------------------------------------------------ planning

    def step_limit(self) -> StepLimit:
        """The most job steps one job may create on the cluster (its MaxStepCount, or Slurm's
        default said assumed): asked of Slurm once for the engine's life, a command's."""
        if self._step_limit is None:
            from torchjob.engines.slurm.limits import read_step_limit

            self._step_limit = read_step_limit(os.environ)
        return self._step_limit

    def _plan(self, job: Job, job_dir: Path, settings: SlurmSettings, allocation: str | None) -> SlurmPlan:
        from torchjob.engines.slurm.plan import PlanError, plan_job
        from torchjob.errors import Problem, SpecError
        from torchjob.spec.model import here_issues

        kind = here_issues(job, errors=True)  # a PyTorchJob's, TrainJob's or JobSet's own
        if kind:
            raise SpecError([Problem(issue.path, issue.message, "") for issue in kind])
        try:
            return plan_job(
                job,
                settings,
                str(job_dir),
                _batch_command(job_dir),
                in_allocation=allocation is not None,
                step_limit=self.step_limit(),
            )
        except PlanError as err:
            # A flag's mistake is the command line's; a field's, the job file's (the CLI adds its line).
            where = "<command line>" if err.path.startswith("-") else ""
            raise SpecError([Problem(err.path, err.message, where)]) from None

    def _allocation(self, settings: SlurmSettings) -> str | None:
        """The allocation this process runs in, where the job's pods then run (allocation.py)."""
        if settings.new_allocation:
            return None
        from torchjob.engines.slurm.allocation import current

        return current(os.environ)

    def check(self, job: Job, settings: SlurmSettings | None = None) -> list[Issue]:
        from torchjob.engines.slurm.plan import PlanError, plan_job
        from torchjob.spec.model import here_issues

        kind: list[Issue] = here_issues(job, errors=True)  # a PyTorchJob's, TrainJob's or JobSet's own
        try:
            plan_job(
                job,
                settings or self.settings,
                str(self.root / job.name),
                ["true"],
                step_limit=self.step_limit(),
            )
        except PlanError as err:
            return [*kind, Issue(err.path, err.message)]
        return kind

    def warnings(self, job: Job) -> list[Issue]:
        from torchjob.spec.model import here_issues

        # images: the docs say it once (commands run on the node, as locally)
        found: list[Issue] = here_issues(job, errors=False)
        return found + preflight.placement_warnings(job)

    def plan(self, job: Job, options: StartOptions) -> Plan:
        job_id = jobdirs.new_id(job.name)
        job_dir = self.root / job_id
        chosen = self._for(options)
        allocation = self._allocation(chosen)
        plan = self._plan(job, job_dir, chosen, allocation)

        def text() -> str:  # an id is drawn for each plan: a dry run's is never a later run's
            from torchjob.engines.slurm.dryrun import plan_text  # a dry run's alone

            shown = plan_text(job, plan, job_id, job_dir, allocation).replace(job_id, f"{job.name}-<id>")
            return shown + "\n# <id>: six hex digits, drawn anew by each run"

        def refusal() -> Exception | None:  # start's check of the allocation, from its variables alone
            from torchjob.engines.slurm.allocation import check_fits

            try:
                check_fits(plan, os.environ)
            except EngineError as err:
                return err
            return None

        # What start asks Slurm itself (its clients, a partition's nodes) a plan does not ask.
        refused = refusal if allocation is not None else None
        return Plan(self.name, job, options, text, detail=(job_id, plan), refusal=refused)

    # ------------------------------------------------------------------ start

    def start(self, plan: Plan) -> JobReport:
        """The plan carried out under its id and directory (the partition may still be chosen
        here, by the queue's answer, and the allocation planned again for it)."""
        job_id, _ = plan.detail_for(self.name)
        job, options = plan.job, plan.options
        job_dir = self.root / job_id
        sink = options.sink or StreamSink()
        chosen = self._for(options)
        allocation = self._allocation(chosen)
        self._plan(job, job_dir, chosen, allocation)  # a job Slurm cannot run: a SpecError at once
        preflight.slurm_answers(allocation, answered=self.step_limit().read)
        for line in preflight.placement_notices(job, options.source):  # at the file's line, as written
            sink.notice(line)
        if allocation is None:
            chosen = preflight.queue_partition(job, chosen, sink)
        slurm_plan = self._plan(job, job_dir, chosen, allocation)
        if allocation is not None:
            from torchjob.engines.slurm.allocation import check_fits, check_steps

            check_fits(slurm_plan, os.environ)
            check_steps(slurm_plan, os.environ)  # those the allocation made count too
        else:
            preflight.fits_nodes(slurm_plan)
        self._make_job_dir(job, job_dir, chosen, options, slurm_plan, allocation)
        logs.info("slurm: job %s in %s", job_id, job_dir)
        # One handler of Ctrl-C and SIGTERM from here to the run's last word (follow.Interrupts):
        # held while sbatch runs and its id is kept, then raised once, then held while cancelling.
        with follow.Interrupts() as interrupts:
            try:
                slurm_id = self._launch(job_dir, slurm_plan, allocation)
            except clients.SlurmError as err:
                raise EngineError(_removed(job_dir, str(err))) from None  # nothing half-made is left
            if options.detach:
                if not options.quiet:
                    sink.notice(f"Slurm job {slurm_id}: {job_id}")
                report = self.view.report(job_dir)
                if interrupts.signum is not None:
                    raise KeyboardInterrupt  # submitted: `torchjob delete` stops it (the id is printed)
                return report
            if options.on_start is not None:
                options.on_start(job_id)
            if not options.quiet:
                where = f"in allocation {allocation}" if allocation else f"Slurm job {slurm_id}"
                sink.notice(f"{where}: {job_id} ({job_dir})")
            return self._attached(job_dir, slurm_id, allocation, options, sink, interrupts)

    def _make_job_dir(
        self,
        job: Job,
        job_dir: Path,
        chosen: SlurmSettings,
        options: StartOptions,
        plan: SlurmPlan,
        allocation: str | None,
    ) -> None:
        from torchjob.files import write_atomic
        from torchjob.lifecycle import active_deadline
        from torchjob.render import dump
        from torchjob.spec.manifest import job_manifest
        from torchjob.spec.model import completions

        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            owned_root(self.root)
            if self.root != self.default_root:
                jobdirs.mark_root(self.root)  # a root of torchjob's: jobs may be deleted from it
            job_dir.mkdir(mode=0o700)
        except OSError as err:
            raise EngineError(f"cannot make the job directory {job_dir}: {err.strerror or err}") from None
        settings = {name: getattr(chosen, name) for name in ENV}
        settings["sbatch_args"] = list(chosen.sbatch_args)
        options_data = {
            "id": job_dir.name,
            "settings": settings,
            # The job's own deadline too (an SDK run_policy's activeDeadlineSeconds): job.json, a
            # Volcano manifest, has no field for it.
            "timeout": active_deadline(job, options.timeout),
            # A task's dependencies it waits for to complete (a JobSet's dependsOn status
            # Complete): Volcano's dependsOn in job.json has no field for it either.
            "completes": completions(job),
            "maxRestarts": options.setting("max_restarts"),
            "extraEnv": dict(options.extra_env),
            "workdir": os.getcwd(),  # relative paths as sbatch would: from where the job was submitted
            "ports": plan.ports,
            "inAllocation": allocation is not None,
            # The limit the job was planned under: the batch host plans it again under the same.
            "stepLimit": {
                "count": plan.step_limit.count,
                "read": plan.step_limit.read,
                "why": plan.step_limit.why,
            },
        }
        write_atomic(job_dir / JOB_FILE, dump(job_manifest(job), "json"))
        write_atomic(job_dir / OPTIONS_FILE, json.dumps(options_data, indent=1) + "\n")
        script = job_dir / "batch.sh"
        write_atomic(script, plan.script)
        script.chmod(0o700)

    def _launch(self, job_dir: Path, plan: SlurmPlan, allocation: str | None) -> str:
        """Submit the allocation (or start the controller in the allocation that exists) and keep
        its id in slurm.json; the Slurm job id."""
        from torchjob.files import write_atomic

        if allocation is not None:
            from torchjob.engines.slurm.allocation import start_controller

            pid, started = start_controller(job_dir, os.environ)
            data: dict[str, object] = {
                "jobId": allocation,
                "inAllocation": True,
                "controller": pid,
                "controllerStarted": started,
            }
            slurm_id = allocation
        else:
            slurm_id = clients.submit(plan.sbatch_args, str(job_dir / "batch.sh"))
            data = {"jobId": slurm_id}
        write_atomic(job_dir / SLURM_FILE, json.dumps(data) + "\n")
        return slurm_id

    def _attached(
        self,
        job_dir: Path,
        slurm_id: str,
        allocation: str | None,
        options: StartOptions,
        sink: Sink,
        interrupts: follow.Interrupts,
    ) -> JobReport:
        teller = follow.Teller(self.view, slurm_id, None if options.quiet else sink)
        job = job_dir.name

        def more() -> None:
            sink.notice(f"stopping job {job} (Slurm job {slurm_id}); wait, it is not left running")

        def polled(report: JobReport) -> None:
            interrupts.check()  # a signal whose KeyboardInterrupt was lost ends the follow here
            teller(report)

        try:
            interrupts.follow(more)  # Ctrl-C (or SIGTERM) now ends the following
            if options.follow and not options.quiet:
                for line in follow.lines(self.view, job_dir, LogQuery(follow=True), polled):
                    sink.log(line)
            report = follow.wait(self.view, job_dir, None, polled)
        except follow.BeyondLimits as err:
            # Attached, a job that cannot start would be followed for ever: cancel it, say why.
            interrupts.hold()
            cancel.cancel(slurm_id)
            what = follow.WHAT_LIMIT.get(str(err), "a limit of the partition, QOS or account")
            said = f"Slurm will not start job {slurm_id} as asked: {err} ({what})"
            raise EngineError(_removed(job_dir, said)) from None
        except KeyboardInterrupt:
            # Attached, the terminal is the job's: Ctrl-C (or SIGTERM) cancels the allocation and
            # its steps, and returns once Slurm holds none of them; its one line says so. More
            # signals meanwhile are held by `interrupts` (and said, once, by `more`).
            from torchjob.engine_api.base import Interrupted

            self._stop_attached(job_dir, slurm_id, sink)
            raise Interrupted from None
        if allocation is None:
            cancel.left_queue(slurm_id)  # attached, a run returns once nothing of it is left
        if "unsharedOn" in self.view.slurm(job_dir):  # the job root is unusable: a setup error
            raise EngineError(_removed(job_dir, report.reason))
        return report

    def _stop_attached(self, job_dir: Path, slurm_id: str, sink: Sink) -> None:
        """Ctrl-C of an attached run: stop the job (more Ctrl-C meanwhile are held: start()), and
        say in one line what was stopped (or what runs on, and how to stop it). Bounded: the ping
        and the cancel's wait take at most cancel.CANCEL_TIMEOUT in all."""
        job = job_dir.name
        deadline = time.monotonic() + cancel.CANCEL_TIMEOUT
        slurm = self.view.slurm(job_dir)
        if slurm.get("inAllocation"):
            from torchjob.engines.slurm.allocation import stop_controller

            stop_controller(int(slurm.get("controller") or 0), slurm.get("controllerStarted"))
            sink.notice(
                f"Ctrl-C: stopped job {job} in allocation {slurm_id}; exit code 130 "
                f"(its logs: torchjob logs {job} --engine slurm)"
            )
            return
        try:
            said = clients.ping()
        except clients.SlurmError:
            said = "no answer"
        if said is not None:
            sink.notice(
                f"{clients.unreachable_message(said)} Slurm job {slurm_id} runs on: cancel it with "
                f"`scancel {slurm_id}` (or `torchjob delete {job} --engine slurm`) once "
                "slurmctld answers"
            )
            return
        try:
            cancel.cancel(slurm_id, max(deadline - time.monotonic(), cancel.POLL))
        except EngineError as err:
            sink.notice(f"{err}: cancel it with `scancel {slurm_id}`")
            return
        sink.notice(
            f"Ctrl-C: cancelled Slurm job {slurm_id} (job {job}); exit code 130 "
            f"(its logs: torchjob logs {job} --engine slurm)"
        )

    # ------------------------------------------------------------------ reading jobs

    def _dirs(self) -> list[Path]:
        """The job directories; those past their ttlSecondsAfterFinished are removed first."""
        if not self.root.is_dir():
            return []
        owned_root(self.root)
        found = self.view.job_dirs()
        return [d for d in found if not self._collect_expired(d)]

    def _collect_expired(self, job_dir: Path) -> bool:
        """Remove a job whose ``expires`` (written by its controller at its end) has passed, once
        Slurm no longer runs its allocation, as Volcano's garbage collector does; whether it was."""
        import stat

        if not jobdirs.is_marked_root(self.root, self.default_root):
            return False
        expires = job_dir / "expires"
        if not jobdirs.owned(expires, stat.S_IFREG):
            return False  # no TTL, or not the controller's file: kept
        try:
            at = float(expires.read_text())
        except (OSError, ValueError):
            return False  # a damaged file: kept until deleted
        if at > time.time():
            return False
        slurm = self.view.slurm(job_dir)
        slurm_id = str(slurm.get("jobId", ""))
        if slurm_id and not slurm.get("inAllocation"):
            try:
                rows = clients.queue(slurm_id)
            except clients.SlurmError:
                return False  # asked again by a later command
            if any(state not in clients.FINAL_STATES for _, state, _ in rows):
                return False
        _remove(job_dir)  # what stays of it is renamed aside: no job any more (-v says where)
        return not job_dir.exists()

    def _find(self, ref: str, deleting: bool = False) -> Path:
        dirs = {d.name: d for d in self._dirs()}

        def started(job_id: str) -> float:
            return (dirs[job_id] / OPTIONS_FILE).stat().st_mtime

        chosen = jobdirs.choose(ref, list(dirs), started, engine="slurm", root=self.root, deleting=deleting)
        return dirs[chosen]

    def list_jobs(self) -> list[JobReport]:
        reports = [self.view.report(d) for d in self._dirs()]
        reports.sort(key=lambda r: r.started_at or 0.0, reverse=True)
        return reports

    def status(self, ref: str) -> JobReport:
        return self.view.report(self._find(ref))

    def wait(self, ref: str, timeout: float | None = None, sink: Sink | None = None) -> JobReport:
        return follow.wait(self.view, self._find(ref), timeout)

    # ------------------------------------------------------------------ logs

    def logs(self, ref: str, query: LogQuery) -> Iterator[LogLine]:
        job_dir = self._find(ref)
        report = self.view.report(job_dir)
        chosen = [p for p in report.pods if query.pod is None or query.pod in (p.name, p.short, p.task)]
        if query.pod is not None and report.pods and not chosen:
            names = ", ".join(p.short for p in report.pods)
            raise EngineError(f"job {job_dir.name} has no pod {query.pod!r} (pods: {names})")
        containers = sorted({c.name for p in chosen for c in p.containers})
        if query.container is not None and containers and query.container not in containers:
            listed = ", ".join(containers)
            raise EngineError(
                f"job {job_dir.name} has no container {query.container!r} (containers: {listed})"
            )
        if query.attempt is not None and not query.follow:
            dirs = [d for p in chosen for d in (job_dir / "logs" / p.name).glob("*") if d.name.isdigit()]
            attempts = sorted({int(d.name) for d in dirs})
            if query.attempt not in attempts:
                listed = ", ".join(map(str, attempts)) or "none yet"
                raise EngineError(f"job {job_dir.name} has no attempt {query.attempt} (attempts: {listed})")
        return follow.lines(self.view, job_dir, query)

    # ------------------------------------------------------------------ delete

    def delete(self, refs: list[str]) -> list[str]:
        """Every ref must name one job before any is touched (engine_api/jobdirs.py: an id, a name
        one job has, an id prefix of 4 characters or more), and only in a root torchjob marked."""
        jobdirs.check_removable(self.root, self.default_root)
        found: dict[str, Path] = {}
        problems = []
        for ref in refs:
            try:
                job_dir = self._find(ref, deleting=True)
            except EngineError as err:
                problems.append(str(err))
                continue
            found.setdefault(job_dir.name, job_dir)
        if problems:
            raise EngineError("; ".join(problems) + "; nothing was deleted")
        deleted, failed = [], []
        for job_dir in found.values():
            try:
                cancel.stop(self.view, job_dir)
            except EngineError as err:  # kept: its directory is how to find it again
                failed.append(f"job {job_dir.name} kept: {err}")
                continue
            left = _remove(job_dir)  # checked gone, not assumed (as on the local engine)
            if left:
                failed.append(left)
            else:
                deleted.append(job_dir.name)
        if failed:
            done = f" (deleted: {', '.join(deleted)})" if deleted else ""
            raise EngineError("; ".join(failed) + done)
        return deleted


_implements: type[Engine] = SlurmEngine
