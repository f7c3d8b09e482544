"""The one interface every engine implements; the typed reports it returns are :mod:`torchjob.reports`.

An engine is an I/O shell around the pure core: it takes a loaded, defaulted and validated
:class:`~torchjob.spec.model.Job` and runs it somewhere (local processes, a Kubernetes cluster).
The CLI and the SDK talk to engines only through :class:`Engine`, found by name in
:mod:`torchjob.engine_api.registry`; they never import an engine's own modules.

The JSON shape of :class:`JobReport` (``to_dict``) is documented in docs/engines.md and is
the same for every engine: ``torchjob status -o json`` prints it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

from torchjob.phases import TERMINAL_JOB_PHASES
from torchjob.records import field, record
from torchjob.reports import (  # the reports live below the display; named here for the engines too
    ContainerReport,
    Event,
    FailureReport,
    JobReport,
    PodReport,
    PortReport,
    ReportError,
)
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, Protocol, TextIO

    from torchjob.errors import Issue
    from torchjob.spec.model import Job

__all__ = [
    "TERMINAL_PHASES",
    "ContainerReport",
    "EngineError",
    "EngineInfo",
    "Event",
    "FailureReport",
    "JobReport",
    "LogLine",
    "LogQuery",
    "Plan",
    "PodReport",
    "PortReport",
    "QueueListing",
    "ReportError",
    "Setting",
    "StartOptions",
    "StreamSink",
]

# Volcano's job phases that never change again; UNKNOWN is not terminal (its engine lost track).
# The one set, torchjob.phases', named here too for engines that read it from the interface.
TERMINAL_PHASES = TERMINAL_JOB_PHASES


class EngineError(Exception):
    """A user-facing failure of an engine (job not found, cluster unreachable, ...): one line, exit 2.

    ``exit_code`` is 2 for bad input or an unusable environment, 1 when a job failed.
    """

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class JobNotFound(EngineError):
    """No job of the engine answers to ``ref`` (an id, an id prefix or a name) where it looked."""

    def __init__(self, message: str, ref: str) -> None:
        super().__init__(message)
        self.ref = ref


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped the job, and the engine has said so in its one line: the CLI adds none."""


class ThisProcess:
    """What the process is, as the torchjob program says (``cli.main``); a caller in Python says
    nothing, so its process keeps these defaults."""

    # The torchjob program, which ends once its one command has. An engine that took Ctrl-C and
    # SIGTERM for a run that one of them stopped may then keep them taken to the end: another one
    # while the last lines are said is held, and the exit code stays 130. A caller in Python gets
    # its own handlers back as the call returns.
    ends_with_command = False
    # A process that reads what its jobs' pods left after the job has ended (the SDK's calls: a
    # task may return the path of a file in its rank's temporary directory): an engine that
    # removes the pods' temporary files waits for its exit.
    reads_pod_files = False


class StartOptions:
    """How to start one job: the engine-neutral choices, plus ``settings`` that only the engine
    reads (declared by it as :class:`Setting`; e.g. the local engine's ``max_restarts``). Any
    other keyword is one of those settings: ``StartOptions(detach=True, target="volcano")``."""

    def __init__(
        self,
        detach: bool = False,
        quiet: bool = False,
        timeout: float | None = None,
        extra_env: dict[str, str] | None = None,
        follow: bool = True,
        on_start: Callable[[str], None] | None = None,
        remove: bool = False,
        sink: Sink | None = None,
        settings: dict[str, object] | None = None,
        source: Callable[[str, str], str] | None = None,
        **more_settings: object,
    ) -> None:
        self.detach = detach  # return once the job has started instead of when it ends
        self.quiet = quiet  # attached: no streamed logs, notes, table or summary
        self.timeout = timeout  # whole-job deadline in seconds; then the job is Terminated
        self.extra_env = dict(extra_env or {})  # added to every main container's env, last
        self.follow = follow  # attached: stream every pod's logs while the job runs
        self.on_start = on_start  # attached: told the job's id once it is submitted
        self.remove = remove  # run --rm: a job that completed is removed once it ended
        self.sink = sink  # attached: where the engine's lines go (None: the engine's default)
        self.settings: dict[str, object] = {**(settings or {}), **more_settings}
        # Names a field of the job's own file in a note: (path, message) -> "FILE:LINE: path: message",
        # at the path the file has (a PyTorchJob's, not the Volcano Job it was read into).
        self.source = source

    def setting(self, name: str, default: Any = None) -> Any:
        """The setting's value, or ``default`` when it was not given (None counts as not given)."""
        value = self.settings.get(name)
        return default if value is None else value

    def __repr__(self) -> str:
        return f"StartOptions({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


class Setting:
    """One setting an engine declares: the CLI makes a flag of it for ``commands``; the engine
    reads it from its constructor's keywords and from ``StartOptions.settings``. Declared in a
    module that imports nothing of the engine, so listing them costs nothing (registry.py).

    A plain class, not a record: a record's generic ``__init__`` made listing every engine's
    settings cost about 0.3 ms of each command's start-up."""

    __slots__ = (
        "choices",
        "commands",
        "default",
        "flags",
        "help",
        "invalid",
        "metavar",
        "minimum",
        "name",
        "type",
    )

    def __init__(
        self,
        name: str,  # a Python name (state_dir); its flag is --state-dir unless ``flags`` says otherwise
        help: str,
        type: str = "str",  # str | path | int | float | bool | modules (names separated by commas)
        default: Any = None,  # the engine's value when not given (a bool's flag gives the other one)
        commands: tuple[str, ...] = ("run",),  # the commands that take it: run, submit, status, ...
        flags: tuple[str, ...] = (),  # its spellings on the command line (-n, --namespace)
        metavar: str | None = None,
        choices: tuple[str, ...] | Callable[[], tuple[str, ...]] = (),  # a callable: asked late
        minimum: float | None = None,  # a number: the least it may be (nan and infinity refused too)
        invalid: str = "",  # what a number out of range is told, with {value}
    ) -> None:
        self.name, self.help, self.type, self.default = name, help, type, default
        self.commands, self.flags, self.metavar, self.choices = commands, flags, metavar, choices
        self.minimum, self.invalid = minimum, invalid

    def allowed(self) -> tuple[str, ...]:
        """The choices; a callable is asked when the flags are built (a list that tests may extend)."""
        return self.choices() if callable(self.choices) else self.choices

    @property
    def spellings(self) -> tuple[str, ...]:
        return self.flags or ("--" + self.name.replace("_", "-"),)

    def __repr__(self) -> str:
        return f"Setting({self.name!r})"


class EngineInfo:
    """What the registry knows of an engine without importing it: where it is, its settings, and
    the few ways the CLI treats it differently (declared here, never by comparing its name)."""

    __slots__ = (
        "factory",
        "handle",
        "location",
        "runs_here",
        "settings",
        "start_modules",
        "submits",
        "summarizes",
    )

    def __init__(
        self,
        factory: str,  # "module:Class": imported only when the engine is used
        settings: tuple[Setting, ...] = (),
        runs_here: bool = False,  # pods are this machine's processes: scripts and modules are here
        summarizes: bool = False,  # an attached run ends with the engine's own summary
        submits: bool = False,  # `torchjob submit` sends jobs to this engine
        location: str = "context",  # what a report's location is, as `status` labels it
        handle: str = "name",  # what `submit` prints for status/logs/delete to take: "name" or "id"
        # What starting a job imports beyond the factory's module: `torchjob run` imports them
        # while its job file is read in another process (spec/prefetch.py), not after.
        start_modules: tuple[str, ...] = (),
    ) -> None:
        self.factory, self.settings, self.runs_here = factory, settings, runs_here
        self.summarizes, self.submits, self.location = summarizes, submits, location
        self.handle, self.start_modules = handle, start_modules

    def value(self, options: StartOptions, name: str) -> Any:
        """Setting ``name`` as ``options`` give it, else as declared here (its default)."""
        declared = next(s for s in self.settings if s.name == name)
        return options.setting(name, declared.default)


class Plan:
    """What an engine will do with one job, decided once, before anything starts: ``start`` takes
    the plan itself and carries it out, so a job is expanded (or rendered) once per run, and what
    ``torchjob run --dry-run`` printed is what a start of the same plan does.

    ``detail`` is the engine's own (the local engine's expanded, checked job; a cluster engine's
    objects); only the engine that made the plan reads it (:meth:`detail_for`). ``text``, what the
    engine will do for a person, is written when first asked for: a run that is not a dry run
    never pays for it. ``refused()`` is what ``start`` would refuse the plan with before
    starting anything (``run --dry-run`` says it and exits as ``run`` would); also asked only
    when wanted. A plain class, not a record: its text is a property."""

    __slots__ = ("_describe", "_refusal", "_text", "detail", "engine", "job", "options")

    def __init__(
        self,
        engine: str,  # the engine's name
        job: Any,  # the Job (spec.model.Job) the plan was made for
        options: StartOptions,
        text: str | Callable[[], str],  # the text, or what writes it when asked
        detail: Any = None,
        # What finds the error start would raise before anything starts (None: it would start).
        refusal: Callable[[], Exception | None] | None = None,
    ) -> None:
        self.engine, self.job, self.options, self.detail = engine, job, options, detail
        self._refusal = refusal
        self._text: str | None = text if isinstance(text, str) else None
        self._describe: Callable[[], str] | None = None if isinstance(text, str) else text

    @property
    def text(self) -> str:
        """What the engine will do, for a person (``run --dry-run``)."""
        if self._text is None:
            assert self._describe is not None
            self._text = self._describe()
        return self._text

    def refused(self) -> Exception | None:
        """The very error ``start`` would refuse this plan with before it starts or makes anything
        (a ``SpecError`` naming the job's fields, an ``EngineError``), or None when it would start
        it. Found without writing anything; an engine that refuses a job in ``plan`` itself (it
        cannot plan it) raises there instead."""
        return None if self._refusal is None else self._refusal()

    def detail_for(self, engine: str) -> Any:
        """The plan's detail, for the engine that made it; another engine is refused in one line."""
        if engine != self.engine:
            raise EngineError(f"a plan of the {self.engine} engine cannot be started by the {engine} engine")
        return self.detail

    def __repr__(self) -> str:
        return f"Plan(engine={self.engine!r}, job={getattr(self.job, 'name', self.job)!r})"


@record
class QueuedJob:
    """A job in a queue of an engine's own (the local engine's admission)."""

    id: str
    name: str
    queue: str
    priority: int
    state: str  # Running | Waiting
    requests: dict[str, str]  # what it holds (Running) or what its gang waits for (Waiting)
    reason: str = ""  # why it waits
    since: float | None = None  # when it was submitted (seconds since the epoch)
    user: str = ""  # whose job it is, in a queue users share

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "queue": self.queue,
            "priority": self.priority,
            "state": self.state,
            "requests": dict(self.requests),
            "reason": self.reason,
            "since": self.since,
            "user": self.user,
        }


@record
class QueueInfo:
    name: str
    weight: float = 1.0
    capability: dict[str, str] = field(default_factory=dict)  # caps on what its jobs hold together
    running: int = 0
    waiting: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "weight": self.weight,
            "capability": dict(self.capability),
            "running": self.running,
            "waiting": self.waiting,
        }


@record
class QueueListing:
    """``torchjob queue``: what the engine can give, its queues, what runs and what waits."""

    capacity: dict[str, str]
    free: dict[str, str]
    source: str  # where the capacity came from
    queues: list[QueueInfo] = field(default_factory=list)
    jobs: list[QueuedJob] = field(default_factory=list)  # running first, then waiting in order
    where: str = ""  # where the queue is kept, and whether other users share it
    notes: list[str] = field(default_factory=list)  # what a person should know of it now

    def to_dict(self) -> dict[str, Any]:
        return {
            "capacity": dict(self.capacity),
            "free": dict(self.free),
            "source": self.source,
            "where": self.where,
            "notes": list(self.notes),
            "queues": [q.to_dict() for q in self.queues],
            "jobs": [j.to_dict() for j in self.jobs],
        }


@record
class LogQuery:
    pod: str | None = None  # a pod name, short name (worker-1) or task name; None for every pod
    container: str | None = None
    attempt: int | None = None  # None: the latest attempt
    all_attempts: bool = False
    follow: bool = False  # keep yielding new lines until the job ends


@record
class LogLine:
    prefix: str  # master-0, worker-1 (rank 2), ...: the same on every engine
    text: str  # one line, without its newline
    pod_ordinal: int = 0  # which pod of the query it belongs to (for a stable colour)
    pod: str = ""  # the pod's short name (<task>-<index>), without rank or container


class StreamSink:
    """The output of a run as the command line shows it: log lines and reports on standard output,
    notes on standard error. The streams are looked up at each write (a test may swap them).
    What an engine writes to when its caller gave no sink (``StartOptions.sink``)."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self._out, self._err = out, err

    @property
    def stream(self) -> TextIO:
        return self._out or sys.stdout

    def log(self, line: LogLine) -> None:
        self.stream.write(f"{line.prefix} | {line.text}\n")
        self.stream.flush()

    def notice(self, text: str) -> None:
        print(f"torchjob: {text}", file=self._err or sys.stderr, flush=True)

    def report(self, text: str) -> None:
        print(text, file=self.stream, flush=True)


# The interface is for the type checker: engines implement it by shape, not by subclassing, and
# the CLI and the SDK import it under TYPE_CHECKING, so no command pays for importing typing.
if TYPE_CHECKING:

    class Sink(Protocol):
        """Where an attached run's and a wait's output goes: the caller's, never the engine's own.

        ``stream``, when the caller has one (a terminal, a file), takes an engine's live output
        as it is (log lines, a status table redrawn in place); otherwise lines come one by one."""

        @property
        def stream(self) -> TextIO | None: ...

        def log(self, line: LogLine) -> None:
            """A pod's log line."""
            ...

        def notice(self, text: str) -> None:
            """A note about the job for the person (without the ``torchjob: `` it is shown with)."""
            ...

        def report(self, text: str) -> None:
            """A line of a table or a summary."""
            ...

    class Engine(Protocol):
        """What the CLI and the SDK may ask of an engine. ``ref`` is a job id, a unique prefix or a name."""

        name: str

        def check(self, job: Job) -> list[Issue]:
            """What stops ``job`` from running on this engine (errors); [] when it can."""
            ...

        def warnings(self, job: Job) -> list[Issue]:
            """What of ``job`` this engine does not do as a cluster would (warnings)."""
            ...

        def plan(self, job: Job, options: StartOptions) -> Plan:
            """Decide what running ``job`` means here, without starting anything (``run --dry-run``)."""
            ...

        def start(self, plan: Plan) -> JobReport:
            """Carry out ``plan``, one this engine made: attached, until the job ends (its final
            report); detached (``plan.options.detach``), return once it started."""
            ...

        def list_jobs(self) -> list[JobReport]:
            """Every job this engine knows of, newest first (a damaged one: phase Unknown, with why)."""
            ...

        def status(self, ref: str) -> JobReport:
            """One job's report; EngineError when ``ref`` names no job or more than one."""
            ...

        def logs(self, ref: str, query: LogQuery) -> Iterator[LogLine]:
            """The job's log lines, oldest first; with ``follow``, until the job ends."""
            ...

        def wait(self, ref: str, timeout: float | None = None, sink: Sink | None = None) -> JobReport:
            """Block until the job reaches a terminal phase (or ``timeout`` passes): its latest report.
            What it has to say while waiting (a pod unschedulable) goes to ``sink``."""
            ...

        def delete(self, refs: list[str]) -> list[str]:
            """Stop and remove these jobs; every ref is resolved before anything is deleted. Their ids."""
            ...

    class QueueingEngine(Engine, Protocol):
        """An engine that queues jobs itself (optional: the CLI looks for ``queues``)."""

        def queues(self) -> QueueListing:
            """Its capacity, its queues, the jobs that hold resources and those that wait, in order."""
            ...

    class LeftoverEngine(Engine, Protocol):
        """An engine on which a job may leave objects once the job itself is gone, listed as phase
        Unknown with ``JobReport.leftovers`` (optional: ``prune`` looks for ``prune_leftovers``)."""

        def prune_leftovers(self, older_than: float | None = None) -> list[str]:
            """Remove what such jobs left, when it is older than ``older_than`` seconds and than a
            job being submitted may take to make its objects: those jobs' ids."""
            ...

    class ClockEngine(Engine, Protocol):
        """An engine whose jobs are timed by another machine's clock (a cluster's API server's):
        ``prune --older-than`` measures ages against it (optional: the CLI looks for ``now``)."""

        def now(self) -> float:
            """That clock's time now, as seconds since the epoch."""
            ...
