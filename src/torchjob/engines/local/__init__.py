"""The local engine: run every pod of a job as processes of this machine, as a cluster would.

Callers use it through the engine interface (``get_engine("local").start(plan)``, engine.py);
``run_job`` here is how that start runs a planned job. ``job`` is a loaded, defaulted and validated
:class:`~torchjob.spec.model.Job`. Bad input for this engine (a container without a ``command``, a
missing ``workingDir``, a Secret reference) raises :class:`~torchjob.errors.SpecError` before
anything starts. Job directories go to ``RunOptions.state_dir``, else ``$TORCHJOB_HOME/jobs``,
else ``~/.torchjob/jobs`` (layout: :mod:`torchjob.engines.local.state`).

Ctrl-C (SIGINT) stops the job (phase Terminated) and then raises KeyboardInterrupt; SIGTERM and
SIGHUP stop it and return the Terminated result. With ``detach=True`` the job runs in a
background process and ``run_job`` returns at once with phase ``Pending``.
"""

from __future__ import annotations

import os
import select
import sys
import time
from pathlib import Path

from torchjob.phases import JobPhase
from torchjob.records import field, record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from torchjob.engine_api.base import JobReport
    from torchjob.engines.local.admission import Plan
    from torchjob.engines.local.planning import LocalPlan
    from torchjob.errors import Issue
    from torchjob.spec.model import Job

__all__ = ["RunOptions", "RunResult", "check_job", "refusal", "run_job"]


@record
class RunOptions:
    state_dir: Path | None = None  # root of job directories; default $TORCHJOB_HOME/jobs or ~/.torchjob/jobs
    quiet: bool = False  # no streamed logs, notes, status table or summary
    timeout: float | None = None  # whole-job deadline in seconds; then the job is Terminated
    extra_env: dict[str, str] = field(default_factory=dict)  # added to every container's env, last
    detach: bool = False  # run in a background process; run_job returns once it has started
    prewarm: bool = True  # start main containers' interpreters while init containers run (prewarm.py)
    max_restarts: int | None = None  # fail the job when a pod's containers restarted more often
    on_start: Callable[[str], None] | None = None  # attached: told the job id before its pods start
    preload: tuple[str, ...] = ()  # modules a fork server imports once for all main containers (preload.py)
    queue: bool = True  # wait for CPUs, memory and GPUs in the local queue (admission/); False: start at once
    remove: bool = False  # run --rm: the summary says a completed job is removed, not where its logs are
    warm: bool = False  # the preload server is kept for this process's next jobs (pool.py)
    hang_notice: float = 300.0  # one notice once every running pod has written nothing this long (0: never)


@record
class RunResult:
    phase: str  # Completed | Failed | Aborted | Terminated (Pending when detached)
    reason: str
    job_dir: Path
    started: bool = True  # False: the job never ran a pod (its directory could not be written)
    report: JobReport | None = None  # the status this result was read from, when there is one

    @property
    def ok(self) -> bool:
        return self.phase == JobPhase.COMPLETED

    @property
    def job_id(self) -> str:
        return self.job_dir.name


def check_job(job: Job) -> list[Issue]:
    """What stops ``job`` from running locally, as issues; empty when it can run."""
    from torchjob.engines.local.planning import plan_job

    return plan_job(job).problems


def _raise_problems(job: Job, plan: LocalPlan | None) -> None:
    from torchjob.errors import Problem, SpecError

    problems = check_job(job) if plan is None else plan.problems
    if problems:
        raise SpecError([Problem.of(issue) for issue in problems])


def refusal(job: Job, planned: LocalPlan, queue: bool = True) -> Exception | None:
    """What ``run_job`` would refuse ``job`` (planned as ``planned``) with before it makes anything,
    found without writing: its problems here, then the local queue's refusals (an unknown queue or
    priority class, a gang that asks more GPUs than there are; ``queue``: the job is queued). The
    queue's directory and the port registry, which a start opens (and may create), are not
    looked at: what is wrong with them is the machine's, told when a job starts."""
    from torchjob.errors import SpecError

    try:
        _raise_problems(job, planned)
        if queue:
            _admission_plan(job, place=False)
    except SpecError as err:
        return err
    return None


def _check_registry(job: Job) -> None:
    """An unsafe or stuck port registry is refused before the job directory is made."""
    from torchjob.engines.local import ports

    if ports.declared_ports(job):
        ports.check_registry()


def _result(job_dir: Path) -> RunResult:
    from torchjob.engines.local.state import JobDir

    report = JobDir(job_dir).read_status()
    return RunResult(report.phase, report.reason, job_dir, report=report)


def run_job(
    job: Job, options: RunOptions | None = None, planned: LocalPlan | None = None, output: object = None
) -> RunResult:
    """Run ``job`` to its end (or start it in the background with ``detach``); ``planned`` is the
    job's plan (planning.plan_job), checked and expanded once: made here when not given. An attached
    job's console writes to ``output``: the caller's stream (standard output when None), or a
    SinkConsole for a caller's sink of lines."""
    from torchjob.engines.local.roots import new_job_dir, state_root

    options = options or RunOptions()
    if planned is None and job.total_replicas:
        from torchjob.engines.local.planning import plan_job

        planned = plan_job(job)
    _raise_problems(job, planned)
    plan = _admission_plan(job) if options.queue else None
    _check_registry(job)
    root = state_root(options.state_dir)
    try:
        job_dir = new_job_dir(root, job.name)
    except OSError as err:  # past the root's checks, yet no directory there (/proc, a read-only mount)
        from torchjob.engine_api.base import EngineError

        raise EngineError(f"{root}: cannot make the job's directory there: {err.strerror or err}") from None
    if options.detach:
        return _detach(job, job_dir.path, options, plan, planned)
    if options.on_start is not None:
        options.on_start(job_dir.id)
    stream = None if options.quiet else sys.stdout if output is None else output
    return _supervise(job, job_dir.path, options, stream=stream, plan=plan, planned=planned)


def _admission_plan(job: Job, place: bool = True) -> Plan | None:
    """What the local queue needs of the job; None when it asks for nothing (then it never waits).
    ``place``: the queue's directory is checked usable too (its lock file is made if missing)."""
    if not any(
        (c.get("resources") or {}).get(kind)
        for task in job.spec.tasks
        for c in [
            *(task.template.spec.get("initContainers") or []),
            *(task.template.spec.get("containers") or []),
        ]
        for kind in ("requests", "limits")
    ):
        return None  # most jobs: nothing to count, nothing to load
    from torchjob.engines.local.admission import plan_for

    plan = plan_for(job)
    # The queue's directory must be usable before the job is made (its lock may be held: the job waits).
    if plan is not None and place:
        from torchjob.engines.local.admission import check_place

        check_place()
    return plan


def _supervise(
    job: Job,
    path: Path,
    options: RunOptions,
    *,
    stream: object,
    echo_logs: bool = True,
    on_started: Callable[[], None] | None = None,
    plan: Plan | None = None,
    planned: LocalPlan | None = None,
) -> RunResult:
    from torchjob.engines.local.output import Console, SinkConsole
    from torchjob.engines.local.state import JobDir
    from torchjob.engines.local.supervisor import Supervisor

    # Never blocking on the reader: a stalled pipe or terminal must not stop timeouts and signals.
    console: Console | SinkConsole | None = None
    if isinstance(stream, SinkConsole):  # for a caller's sink that takes lines (engines.base.Sink)
        console = stream
    elif stream is not None:
        console = Console(stream, never_block=True)  # type: ignore[arg-type]
    supervisor = Supervisor(
        job,
        JobDir(path),
        console=console,
        echo_logs=echo_logs,
        timeout=options.timeout,
        extra_env=options.extra_env,
        prewarm=options.prewarm,
        max_restarts=options.max_restarts,
        preload=options.preload,
        pooled=options.warm,
        admission=plan,
        remove=options.remove,
        hang_notice=options.hang_notice,
        planned=planned.take() if planned is not None else None,
    )
    supervisor.signals.install()
    try:
        supervisor.run(on_started)
    finally:
        supervisor.signals.restore()
    if supervisor.interrupted is not None and supervisor.interrupted == 2:  # SIGINT
        if isinstance(console, Console) and console.hushed:  # it said so (output.hush)
            from torchjob.engine_api.base import Interrupted

            raise Interrupted
        raise KeyboardInterrupt
    if not (path / "status.json").exists():  # it could not be written (a full disk)
        status = supervisor.ctl.status
        return RunResult(status.phase.value, status.reason, path, started=supervisor.running)
    result = _result(path)
    result.started = supervisor.running
    return result


def _detach(
    job: Job, path: Path, options: RunOptions, plan: Plan | None = None, planned: LocalPlan | None = None
) -> RunResult:
    """Double fork: the grandchild, in its own session, supervises; the caller returns once the
    job's pods have started, or with ``started=False`` and the reason when they never did."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # first child
        os.close(read_end)
        try:
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            _become_daemon(path)
            code = 0
            try:
                result = _supervise(
                    job,
                    path,
                    options,
                    stream=sys.stdout,
                    echo_logs=False,
                    on_started=lambda: _tell(write_end, "started"),
                    plan=plan,
                    planned=planned,
                )
                code = 0 if result.ok else 1
                if not result.started:
                    _tell(write_end, f"failed {result.reason}")
            except BaseException as err:
                import traceback

                traceback.print_exc()
                _tell(write_end, f"failed the supervisor crashed: {err!r} (see supervisor.log)")
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        except BaseException:
            os._exit(1)
    os.close(write_end)
    os.waitpid(pid, 0)  # the first child exits as soon as it has forked
    with os.fdopen(read_end, "rb") as pipe:
        # Until the pods have started, or the daemon says why not (or dies: end of file).
        ready, _, _ = select.select([pipe], [], [], 30.0)
        answer = pipe.readline().decode(errors="replace").strip() if ready else "failed no answer in 30 s"
    if answer != "started":
        reason = answer.removeprefix("failed ").strip() or "the supervisor ended before the job started"
        if ready and not (path / "status.json").exists():  # the daemon is done: nothing could see it
            from torchjob.engines.local.state import JobDir

            JobDir(path).remove()
        return RunResult("Failed", reason, path, started=False)
    deadline = time.monotonic() + 10
    from torchjob.engines.local.state import JobDir

    status = JobDir(path).status_file
    while not status.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    result = _result(path)
    result.phase = result.phase if status.exists() else "Pending"
    return result


def _tell(fd: int, line: str) -> None:
    """One line to the process waiting for a detached job to start; it may be gone already."""
    import contextlib

    with contextlib.suppress(OSError):
        os.write(fd, line.encode(errors="replace").replace(b"\n", b" ") + b"\n")


def _become_daemon(path: Path) -> None:
    from torchjob.engines.local.state import JobDir

    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    log = os.open(JobDir(path).supervisor_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(devnull)
    os.close(log)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives as long as the process
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
