"""The ``slurm`` engine: a job as one Slurm allocation whose pods are job steps.

``start`` makes the job directory under the job root (a filesystem the login node and the compute
nodes share), writes the job, its options and the batch script there and submits the allocation
with ``sbatch``. The batch script runs ``torchjob.engines.slurm.batch`` on the batch host, which
drives the job with the engine-neutral controller and writes ``status.json`` and every attempt's
logs into the job directory. Everything else here reads that directory plus Slurm's own view
(``squeue``, ``scontrol show job``): why a job is pending, and an allocation that Slurm ended
(TIMEOUT, CANCELLED, NODE_FAIL, PREEMPTED) reported as such.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from torchjob.display import prefix_for
from torchjob.engine_api.base import (
    EngineError,
    JobNotFound,
    JobReport,
    LogLine,
    LogQuery,
    Plan,
    StartOptions,
    StreamSink,
)
from torchjob.engines.slurm import steps
from torchjob.engines.slurm.settings import ENV, SlurmSettings, job_root
from torchjob.errors import Issue
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.engine_api.base import Engine, Sink
    from torchjob.engines.slurm.plan import SlurmPlan
    from torchjob.spec.model import Job

SLURM_FILE = "slurm.json"  # the Slurm job id, and Slurm's final state once seen
_UNSHARED = "unshared on "  # _ask_slurm's reason for a batch host that did not see the job dir
POLL = 0.3
SLURM_EVERY = 1.0  # seconds between two questions to Slurm about one job
# Slurm's final states that end the job from outside the controller: how the report says them.
ENDED_BY_SLURM = {
    "TIMEOUT": ("Failed", "Slurm: TIMEOUT: the allocation reached its time limit"),
    "CANCELLED": ("Terminated", "Slurm: CANCELLED: the allocation was cancelled"),
    "NODE_FAIL": ("Failed", "Slurm: NODE_FAIL: a node of the allocation failed"),
    "PREEMPTED": ("Failed", "Slurm: PREEMPTED: the allocation was preempted"),
    "BOOT_FAIL": ("Failed", "Slurm: BOOT_FAIL: a node of the allocation failed to boot"),
    "DEADLINE": ("Failed", "Slurm: DEADLINE: the job's deadline passed before it ran"),
    "OUT_OF_MEMORY": ("Failed", "Slurm: OUT_OF_MEMORY: the allocation ran out of memory"),
}


# Pending reasons by which Slurm says that the job asks for more than its partition, QOS or
# association allows: waiting does not start it. (Without EnforcePartLimits, sbatch accepts such
# a job and leaves it pending; with it, sbatch refuses it and says why.) Compiled (and cached by
# re) when a job is seen pending, not before sbatch.
BEYOND_LIMITS = r"Partition(TimeLimit|NodeLimit|Config)|BadConstraints|(QOS|Assoc)Max\w*PerJob\w*|QOSMin\w+"
_WHAT_LIMIT = {
    "PartitionTimeLimit": "the time limit is above the partition's",
    "PartitionNodeLimit": "the node count is outside the partition's limits",
    "PartitionConfig": "no node of the partition has what one pod asks for",
}


class _BeyondLimits(Exception):
    """Slurm keeps an attached job pending for a reason in BEYOND_LIMITS (the reason)."""


def settings_from(given: dict[str, Any], environ: dict[str, str]) -> SlurmSettings:
    """The engine's settings: those given (flags) first, else ``TORCHJOB_SLURM_*`` variables."""
    values: dict[str, Any] = {}
    for name, variable in ENV.items():
        value = given.get(name)
        if value is None:
            value = environ.get(variable) or None
        if value is None:
            continue
        if name == "sbatch_args":
            value = tuple(shlex.split(value) if isinstance(value, str) else value)
        elif name in ("container_images", "single_component"):
            value = value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")
        else:
            value = str(value)
        values[name] = value
    return SlurmSettings(**values)


def _step_lines(job: Job, plan: SlurmPlan) -> list[str]:
    """Each pod's steps as they will run, a plugin's init container in one line."""
    from torchjob.engines.slurm.plan import PlanError, launches, place

    layout = {c.index: [("NODE", c.ntasks)] for c in plan.components}
    try:
        steps_of = launches(plan, place(plan, layout))
    except PlanError as err:  # check() refuses such a job before it starts
        return [f"#   (cannot plan the steps: {err})"]
    declared = {(task.name, name) for task in job.spec.tasks for name in task.template.init_container_names}
    lines: list[str] = []
    for launch in steps_of:
        resources = plan.components[launch.placement.component].resources
        header = f"#   {launch.pod}: on NODE, srun {' '.join(resources.step_args())}"
        if header not in lines:
            lines.append(header)
        argv = [
            sys.executable if launch.argv[0] in ("python", "python3") else launch.argv[0],
            *launch.argv[1:],
        ]
        if launch.init and (launch.task, launch.container) not in declared:
            text = f"init {launch.container}: added by a plugin ({argv[0]} ...)"
        else:
            text = f"{'init ' if launch.init else ''}{launch.container}: {shlex.join(argv)}"
        lines.append(f"#     {text}")
    return lines


def _plan_text(job: Job, plan: SlurmPlan, job_dir: Path) -> str:
    """What submitting the job does, for a person: sbatch's command, the batch script, the
    allocation's components and each pod's steps."""
    lines = [
        f"# slurm engine: job {job_dir.name} in {job_dir}",
        f"# submit: {plan.command_line(str(job_dir / 'batch.sh'))}",
        "# batch script:",
        *[f"#   {line}" for line in plan.script.splitlines()],
        "# components of the allocation:",
    ]
    for component in plan.components:
        args = " ".join(component.sbatch_args())
        lines.append(f"#   {component.index}: tasks {', '.join(component.tasks)}: {args}")
    lines.append("# pods, each container a job step on the pod's node (init containers first, in order);")
    lines.append("# NODE is the node Slurm gives the pod, known once the allocation runs:")
    lines += _step_lines(job, plan)
    return "\n".join(lines)


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _new_id(name: str) -> str:
    """The job's id: its name and six random hex digits (``os.urandom``: ``secrets`` would import
    hmac and hashlib on the way to ``sbatch``)."""
    return f"{name}-{os.urandom(3).hex()}"


def _remove(job_dir: Path) -> None:
    """Remove a job directory and all in it (shutil is imported here, off the way to sbatch)."""
    import shutil

    shutil.rmtree(job_dir, ignore_errors=True)


def _batch_command(job_dir: Path) -> list[str]:
    """What the batch script execs: this interpreter (a shared venv) running the job's controller."""
    return [sys.executable, "-m", "torchjob.engines.slurm.batch", str(job_dir)]


def _sigterm_interrupts() -> Callable[[], None]:
    """SIGTERM ends an attached run as Ctrl-C does (the job cancelled); a function restoring the
    previous handler. Only the main thread can set one (an SDK call may come from another)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore


class _EventTeller:
    """Attached: the controller's events (restarts, a task waiting for another) as they come."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.told = 0.0

    def __call__(self, report: JobReport) -> None:
        for event in report.events:
            if event.time > self.told:
                self.told = event.time
                self.sink.notice(event.message)


class SlurmEngine:
    name = "slurm"

    def __init__(self, **settings: Any) -> None:
        self.given = {k: v for k, v in settings.items() if k in ENV}  # another engine's are not ours
        self.settings = settings_from(self.given, dict(os.environ))
        self.root = job_root(self.settings)
        self._asked: dict[str, tuple[float, str | None, str]] = {}  # Slurm's last answer per job

    def _for(self, options: StartOptions) -> SlurmSettings:
        """The settings of one start: those its options give, over the engine's own."""
        given = {**self.given, **{k: v for k, v in options.settings.items() if k in ENV and v is not None}}
        return settings_from(given, dict(os.environ))

    # ------------------------------------------------------------------ planning

    def _plan(self, job: Job, job_dir: Path, settings: SlurmSettings) -> SlurmPlan:
        from torchjob.engines.slurm.plan import PlanError, plan_job
        from torchjob.errors import Problem, SpecError

        try:
            return plan_job(job, settings, str(job_dir), _batch_command(job_dir))
        except PlanError as err:
            raise SpecError([Problem(err.path, err.message, "")]) from None

    def check(self, job: Job, settings: SlurmSettings | None = None) -> list[Issue]:
        from torchjob.engines.slurm.plan import PlanError, plan_job

        try:
            plan_job(job, settings or self.settings, str(self.root / job.name), ["true"])
        except PlanError as err:
            return [Issue(err.path, err.message)]
        return []

    def warnings(self, job: Job) -> list[Issue]:
        return []  # images: the docs say it once (commands run on the node, as locally)

    def plan(self, job: Job, options: StartOptions) -> Plan:
        """The job's id and directory, its allocation and batch script, decided once: ``start``
        submits exactly these. The text (run --dry-run) writes the id as ``NAME-<id>``: an id is
        drawn for each plan, so a dry run's would never be the one a later run uses."""
        job_id = _new_id(job.name)
        chosen = self._for(options)
        plan = self._plan(job, self.root / job_id, chosen)  # a job Slurm cannot run: a SpecError

        def text() -> str:
            shown = _plan_text(job, plan, self.root / job_id).replace(job_id, f"{job.name}-<id>")
            return shown + "\n# <id>: six hex digits, drawn anew by each run"

        return Plan(self.name, job, options, text, detail=(job_id, plan, chosen))

    # ------------------------------------------------------------------ start

    def start(self, plan: Plan) -> JobReport:
        from torchjob.files import write_atomic
        from torchjob.render import dump
        from torchjob.spec.manifest import job_manifest

        job_id, slurm_plan, chosen = plan.detail_for(self.name)
        job, options = plan.job, plan.options
        job_dir = self.root / job_id
        self._client("sbatch")
        if slurm_plan.heterogeneous:
            self._fits_heterogeneous(slurm_plan)
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._own_root()
            job_dir.mkdir(mode=0o700)
        except OSError as err:
            raise EngineError(f"cannot make the job directory {job_dir}: {err.strerror or err}") from None
        from torchjob.lifecycle import active_deadline

        settings = {name: getattr(chosen, name) for name in ENV}
        settings["sbatch_args"] = list(chosen.sbatch_args)
        options_data = {
            "id": job_id,
            "settings": settings,
            # The job's own deadline too (an SDK run_policy's activeDeadlineSeconds): job.json, a
            # Volcano manifest, has no field for it.
            "timeout": active_deadline(job, options.timeout),
            "maxRestarts": options.setting("max_restarts"),
            "extraEnv": dict(options.extra_env),
            "workdir": os.getcwd(),  # relative paths as sbatch would: from where the job was submitted
        }
        write_atomic(job_dir / "job.json", dump(job_manifest(job), "json"))
        write_atomic(job_dir / "options.json", json.dumps(options_data, indent=1) + "\n")
        script = job_dir / "batch.sh"
        write_atomic(script, slurm_plan.script)
        script.chmod(0o700)
        try:
            slurm_id = steps.submit(slurm_plan.sbatch_args, script)
        except steps.SlurmError as err:
            _remove(job_dir)  # nothing half-made is left
            raise EngineError(str(err)) from None
        write_atomic(job_dir / SLURM_FILE, json.dumps({"jobId": slurm_id}) + "\n")
        sink = options.sink or StreamSink()
        if options.detach:
            if not options.quiet:
                sink.notice(f"Slurm job {slurm_id}: {job_id}")
            return self.status(job_id)
        if options.on_start is not None:
            options.on_start(job_id)
        if not options.quiet:
            sink.notice(f"Slurm job {slurm_id}: {job_id} ({job_dir})")

        def beyond_limits(report: JobReport) -> None:
            asked = self._asked.get(slurm_id)
            if (
                report.phase == "Pending"
                and asked
                and asked[1] == "PENDING"
                and re.fullmatch(BEYOND_LIMITS, asked[2])
            ):
                raise _BeyondLimits(asked[2])

        restore = _sigterm_interrupts()
        try:
            if options.follow and not options.quiet:
                told = _EventTeller(sink)

                def on_report(report: JobReport) -> None:
                    told(report)
                    beyond_limits(report)

                for line in self._lines(job_dir, LogQuery(follow=True), on_report):
                    sink.log(line)
            report = self._wait(job_dir, None, beyond_limits)
            self._left_queue(slurm_id)  # attached, a run returns once nothing of it is left
            if "unsharedOn" in self._slurm(job_dir):  # the job root is unusable: a setup error
                _remove(job_dir)
                raise EngineError(report.reason)
            return report
        except _BeyondLimits as err:
            # Attached, a job that cannot start would be followed for ever: cancel it, say why.
            self._cancel(slurm_id)
            _remove(job_dir)
            what = _WHAT_LIMIT.get(str(err), "a limit of the partition, QOS or account")
            raise EngineError(f"Slurm will not start job {slurm_id} as asked: {err} ({what})") from None
        except KeyboardInterrupt:
            # Attached, the terminal is the job's: Ctrl-C (or SIGTERM) cancels the allocation and
            # its steps, and returns once Slurm holds none of them.
            self._cancel(slurm_id)
            raise
        finally:
            restore()

    def _fits_heterogeneous(self, plan: SlurmPlan) -> None:
        """Slurm starts a heterogeneous job only with each component on a node of its own: on a
        partition with fewer nodes than components it would stay pending (Resources) for ever."""
        partition = plan.settings.partition
        nodes = steps.partition_nodes(partition)
        wanted = len(plan.components)
        if nodes is not None and nodes < wanted:
            kinds = "; ".join(", ".join(c.tasks) for c in plan.components)
            where = f"partition {partition}" if partition else "the default partition"
            raise EngineError(
                f"the job's tasks ask for {wanted} kinds of pod ({kinds}), each a component of a "
                f"heterogeneous job on a node of its own, and {where} has {nodes} node(s): give the "
                "tasks the same resources, or use --single-component"
            )

    # ------------------------------------------------------------------ reading jobs

    def _client(self, name: str) -> None:
        try:
            steps.client(name)
        except steps.SlurmError as err:
            raise EngineError(str(err)) from None

    def _dirs(self) -> list[Path]:
        """The job directories; those past their ttlSecondsAfterFinished are removed first."""
        if not self.root.is_dir():
            return []
        self._own_root()
        found = [
            d for d in self.root.iterdir() if (d / SLURM_FILE).is_file() or (d / "options.json").is_file()
        ]
        return [d for d in found if not self._collect_expired(d)]

    def _collect_expired(self, job_dir: Path) -> bool:
        """Remove a job whose ``expires`` (written by its controller at its end) has passed, once
        Slurm no longer runs its allocation, as Volcano's garbage collector does; whether it was."""
        import stat

        expires = job_dir / "expires"
        try:
            info = expires.lstat()
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                return False  # not the controller's file: kept
            at = float(expires.read_text())
        except (OSError, ValueError):
            return False  # no TTL (or a damaged file): kept until deleted
        if at > time.time():
            return False
        slurm_id = str(self._slurm(job_dir).get("jobId", ""))
        if slurm_id:
            try:
                rows = steps.queue(slurm_id)
            except steps.SlurmError:
                return False  # asked again by a later command
            if any(state not in steps.FINAL_STATES for _, state, _ in rows):
                return False
        _remove(job_dir)
        return not job_dir.exists()

    def _own_root(self) -> None:
        """A job root another user made is not trusted: its job directories could be theirs."""
        owner = self.root.stat().st_uid
        if owner != os.geteuid():
            raise EngineError(f"the job root {self.root} belongs to uid {owner}, not to you: choose another")

    def _find(self, ref: str) -> Path:
        if not ref:
            raise EngineError("a job reference cannot be empty: give a job id, an id prefix or a name")
        dirs = self._dirs()
        for d in dirs:
            if d.name == ref:
                return d
        named = [d for d in dirs if d.name.rpartition("-")[0] == ref]
        if named:
            return max(named, key=lambda d: d.stat().st_mtime)
        prefixed = [d for d in dirs if d.name.startswith(ref)]
        if len(prefixed) == 1:
            return prefixed[0]
        if prefixed:
            raise EngineError(f"job {ref!r} is ambiguous: {', '.join(sorted(d.name for d in prefixed))}")
        raise JobNotFound(f"no slurm job {ref!r} in {self.root}", ref)

    def _slurm(self, job_dir: Path) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads((job_dir / SLURM_FILE).read_text())
            return data
        except (OSError, ValueError):
            return {}

    def _report(self, job_dir: Path) -> JobReport:
        """status.json (the controller's) overlaid with Slurm's view of the allocation."""
        from torchjob.engine_api.base import ReportError

        slurm = self._slurm(job_dir)
        slurm_id = str(slurm.get("jobId", ""))
        ended_by_slurm = False
        name = job_dir.name.rpartition("-")[0] or job_dir.name
        try:
            data = json.loads((job_dir / "status.json").read_text())
            report = JobReport.from_dict(data)
            ended_by_slurm = data.get("endedBySlurm") is True
        except FileNotFoundError:  # the controller has not started yet
            report = JobReport(engine=self.name, id=job_dir.name, name=name, phase="Pending")
            report.started_at = _mtime(job_dir / "options.json")
        except (OSError, ValueError, ReportError) as err:
            reason = f"{job_dir / 'status.json'} cannot be read: {err}"
            return JobReport(self.name, job_dir.name, name, "Unknown", reason, location=str(job_dir))
        report.location = str(job_dir)
        if not slurm_id or (report.terminal and not ended_by_slurm):
            return report
        state = slurm.get("state")
        if state is None:
            state, reason = self._slurm_state(slurm_id)
            if state in steps.FINAL_STATES:
                slurm["state"] = state
                if reason.startswith(_UNSHARED):
                    slurm["unsharedOn"] = reason[len(_UNSHARED) :]
                from torchjob.files import write_atomic

                write_atomic(job_dir / SLURM_FILE, json.dumps(slurm) + "\n")
        else:
            reason = ""
        if state == "PENDING":
            report.phase, report.reason = "Pending", f"Slurm job {slurm_id} is pending: {reason}"
        elif state == "RUNNING" and not report.pods:
            report.reason = f"Slurm job {slurm_id} is running; its controller is starting"
        elif state in ENDED_BY_SLURM:
            report.phase, report.reason = ENDED_BY_SLURM[state]
            report.finished_at = report.finished_at or time.time()
        elif ended_by_slurm and state not in steps.FINAL_STATES:
            report.phase = "Terminating"  # Slurm is ending it; its final state says why
        elif ended_by_slurm and state == "COMPLETED":
            pass
        elif "unsharedOn" in slurm:
            report.phase = "Failed"
            report.reason = (
                f"the job directory {job_dir} is not on the batch host {slurm['unsharedOn']}: the job "
                f"root {self.root} must be on a filesystem that the login node and the compute nodes "
                "share (--job-root, TORCHJOB_SLURM_JOB_ROOT)"
            )
        elif state is None:
            report.phase = "Unknown"
            report.reason = f"Slurm no longer knows job {slurm_id}, and its controller wrote no final state"
        elif state in steps.FINAL_STATES:  # COMPLETED or FAILED without a final status.json
            report.phase = "Failed"
            report.reason = (
                f"Slurm job {slurm_id} ended ({state}) before its controller wrote a final state "
                f"(its output: {job_dir}/slurm-{slurm_id}.out; none there: is the job root "
                f"{self.root} on a filesystem the compute nodes share?)"
            )
        return report

    def _slurm_state(self, slurm_id: str) -> tuple[str | None, str]:
        """Slurm's state of the allocation and its reason; asked at most once a second per job
        (a followed job's report is read every few tenths of a second)."""
        asked = self._asked.get(slurm_id)
        if asked is not None and time.monotonic() - asked[0] < SLURM_EVERY:
            return asked[1], asked[2]
        state, reason = self._ask_slurm(slurm_id)
        self._asked[slurm_id] = (time.monotonic(), state, reason)
        return state, reason

    def _ask_slurm(self, slurm_id: str) -> tuple[str | None, str]:
        try:
            rows = steps.queue(slurm_id)
            if rows and rows[0][1] != "COMPLETING":
                return rows[0][1], rows[0][2]
            shown = steps.show_job(slurm_id)
            if shown:
                from torchjob.engines.slurm.plan import NOT_SHARED

                job = shown[0]
                if job.state == "FAILED" and job.exit_code == NOT_SHARED:
                    return job.state, _UNSHARED + job.fields.get("BatchHost", "its batch host")
                return job.state, job.reason
            return steps.final_state(slurm_id), ""  # forgotten by slurmctld: sacct, the completion file
        except steps.SlurmError as err:
            raise EngineError(str(err)) from None

    def list_jobs(self) -> list[JobReport]:
        reports = [self._report(d) for d in self._dirs()]
        reports.sort(key=lambda r: r.started_at or 0.0, reverse=True)
        return reports

    def status(self, ref: str) -> JobReport:
        return self._report(self._find(ref))

    def wait(self, ref: str, timeout: float | None = None, sink: Sink | None = None) -> JobReport:
        return self._wait(self._find(ref), timeout)

    def _wait(
        self, job_dir: Path, timeout: float | None, on_report: Callable[[JobReport], None] | None = None
    ) -> JobReport:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            report = self._report(job_dir)
            if on_report is not None:
                on_report(report)
            if report.terminal or report.phase == "Unknown":
                return report
            if deadline is not None and time.monotonic() >= deadline:
                return report
            time.sleep(POLL)

    # ------------------------------------------------------------------ logs

    def logs(self, ref: str, query: LogQuery) -> Iterator[LogLine]:
        job_dir = self._find(ref)
        report = self._report(job_dir)
        if query.pod is not None and report.pods and not self._pods(report, query):
            names = ", ".join(p.short for p in report.pods)
            raise EngineError(f"job {job_dir.name} has no pod {query.pod!r} (pods: {names})")
        chosen = [p for p in report.pods if p.name in self._pods(report, query)]
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
        return self._lines(job_dir, query)

    @staticmethod
    def _pods(report: JobReport, query: LogQuery) -> list[str]:
        return [p.name for p in report.pods if query.pod is None or query.pod in (p.name, p.short, p.task)]

    def _files(self, job_dir: Path, pods: list[str], query: LogQuery) -> list[tuple[int, str, Path]]:
        """(pod ordinal, pod name, file) of the attempts asked for, in order."""
        found = []
        for ordinal, pod in enumerate(pods):
            attempts = sorted(
                (int(d.name), d) for d in (job_dir / "logs" / pod).glob("*") if d.name.isdigit()
            )
            if query.attempt is not None:
                attempts = [a for a in attempts if a[0] == query.attempt]
            elif not query.all_attempts and not query.follow:
                attempts = attempts[-1:]
            for _, directory in attempts:
                for log in sorted(directory.glob("*.log")):
                    if query.container is None or log.stem == query.container:
                        found.append((ordinal, pod, log))
        return found

    def _lines(
        self, job_dir: Path, query: LogQuery, on_report: Callable[[JobReport], None] | None = None
    ) -> Iterator[LogLine]:
        from torchjob.files import LogFollower

        follower = LogFollower()  # reads a bounded chunk per file per call: any log in bounded memory
        owners: dict[Path, tuple[int, str]] = {}  # log file -> (pod ordinal, pod's short name)
        while True:
            # Read before the files: a job that ended then has every line in them already.
            report = self._report(job_dir)
            if on_report is not None:
                on_report(report)
            ended = report.terminal or report.phase == "Unknown"
            pods = self._pods(report, query)  # none until the controller wrote its first status
            ranks = {p.name: p.rank for p in report.pods}
            shorts = {p.name: p.short for p in report.pods}
            # As locally: init containers and one of several main containers are named in the prefix.
            labelled = {
                (p.name, c.name)
                for p in report.pods
                for c in p.containers
                if c.init or sum(not d.init for d in p.containers) > 1
            }
            for ordinal, pod, log in self._files(job_dir, pods, query):
                container = log.stem if (pod, log.stem) in labelled else None
                prefix = prefix_for(shorts.get(pod, pod), ranks.get(pod), container)
                if query.all_attempts:  # as locally: which attempt each line is of
                    prefix += f" #{log.parent.name}"
                follower.follow(log, prefix)
                owners.setdefault(log, (ordinal, shorts.get(pod, pod)))
            if ended:  # the last line of each file comes out even without its newline
                for log in list(follower.files):
                    follower.close(log)
            while chunk := follower.read():
                for item, text in chunk:
                    ordinal, short = owners[item.path]
                    yield LogLine(item.prefix, text, pod_ordinal=ordinal, pod=short)
            if ended and follower.files:
                continue  # closing files not yet read to their end
            if not query.follow or ended:
                return
            time.sleep(POLL)

    # ------------------------------------------------------------------ delete

    def _cancel(self, slurm_id: str, timeout: float = 60.0) -> None:
        """scancel the allocation, then wait (bounded) until Slurm holds no step of it."""
        try:
            listed = steps.component_ids(slurm_id)  # before scancel: the components' steps too
        except steps.SlurmError:
            listed = slurm_id
        try:
            steps.cancel(slurm_id)
        except steps.SlurmError as err:
            if "Invalid job id" not in str(err) and "already completing" not in str(err):
                raise EngineError(str(err)) from None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if not steps.steps(listed) and not steps.queue(slurm_id):
                    return
            except steps.SlurmError:
                pass
            time.sleep(POLL)
        raise EngineError(f"Slurm job {slurm_id} still has steps {timeout:g} s after scancel")

    def _left_queue(self, slurm_id: str, timeout: float = 30.0) -> None:
        """Wait (bounded) until the ended allocation left Slurm's queue, steps and batch script."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if not steps.queue(slurm_id):
                    return
            except steps.SlurmError:
                return
            time.sleep(0.1)

    def delete(self, refs: list[str]) -> list[str]:
        dirs = [self._find(ref) for ref in refs]
        for job_dir in dirs:
            slurm_id = str(self._slurm(job_dir).get("jobId", ""))
            if slurm_id:
                self._cancel(slurm_id)
            _remove(job_dir)
        return [d.name for d in dirs]


_implements: type[Engine] = SlurmEngine
