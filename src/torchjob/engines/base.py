"""The one interface every engine implements, and the typed reports every engine returns.

An engine is an I/O shell around the pure core: it takes a loaded, defaulted and validated
:class:`~torchjob.spec.model.Job` and runs it somewhere (local processes, a Kubernetes cluster).
The CLI and the SDK talk to engines only through :class:`Engine`, found by name in
:mod:`torchjob.engines.registry`; they never import an engine's own modules.

The JSON shape of :class:`JobReport` (``to_dict``) is documented in docs/architecture.md and is
the same for every engine: ``torchjob status -o json`` prints it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from torchjob.records import field, record

if TYPE_CHECKING:
    from torchjob.spec.model import Job

__all__ = [
    "TERMINAL_PHASES",
    "ContainerReport",
    "Engine",
    "EngineError",
    "FailureReport",
    "JobReport",
    "LogLine",
    "LogQuery",
    "PodReport",
    "PortReport",
    "StartOptions",
]

# Volcano's job phases that never change again; "Unknown" is not terminal (its engine lost track).
TERMINAL_PHASES = frozenset({"Completed", "Failed", "Aborted", "Terminated"})


class EngineError(Exception):
    """A user-facing failure of an engine (job not found, cluster unreachable, ...): one line, exit 2.

    ``exit_code`` is 2 for bad input or an unusable environment, 1 when a job failed.
    """

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@record
class StartOptions:
    detach: bool = False  # return once the job has started instead of when it ends
    quiet: bool = False  # attached: no streamed logs, notes, table or summary
    timeout: float | None = None  # whole-job deadline in seconds; then the job is Terminated
    extra_env: dict[str, str] = field(default_factory=dict)  # added to every main container's env, last
    follow: bool = True  # attached: stream every pod's logs while the job runs
    replace: bool = False  # an existing job of the same name is deleted first (cluster engines)
    target: str | None = None  # how a cluster engine expresses the job (volcano, kubeflow, ...)
    runtime: str | None = None  # the Trainer runtime for target trainjob


@record
class ContainerReport:
    name: str
    init: bool = False
    state: str = "waiting"  # waiting | running | terminated
    exit_code: int | None = None
    reason: str = ""  # e.g. ImagePullBackOff, OOMKilled, Error
    restarts: int = 0


@record
class PodReport:
    name: str  # the full pod name (<job>-<task>-<index> locally, the cluster's name on a cluster)
    short: str  # <task>-<index>: the log prefix
    task: str
    index: int
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    rank: int | None = None
    reason: str = ""
    attempt: int = 0
    restarts: int = 0
    exit_code: int | None = None
    started_at: float | None = None  # seconds since the epoch
    finished_at: float | None = None
    address: str = ""
    containers: list[ContainerReport] = field(default_factory=list)


@record
class PortReport:
    declared: int
    host: int


@record
class FailureReport:
    """The first pod that failed, by time: the root cause a user looks for first."""

    pod: str
    short: str
    exit_code: int | None = None
    rank: int | None = None
    reason: str = ""
    time: float | None = None
    log_tail: list[str] = field(default_factory=list)


@record
class JobReport:
    engine: str  # local | kubernetes | ...
    id: str  # the engine's handle: a local job id, a cluster's namespace/name
    name: str
    phase: str  # Pending | Running | Restarting | Completing | Completed | Failed | Aborted | ...
    reason: str = ""
    namespace: str = "default"
    target: str = ""  # how the job was expressed (cluster engines); "" locally
    location: str = ""  # where its state lives: a job directory, a cluster context
    retry_count: int = 0
    max_retry: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    pods: list[PodReport] = field(default_factory=list)
    ports: list[PortReport] = field(default_factory=list)
    first_failure: FailureReport | None = None
    events: list[dict[str, Any]] = field(default_factory=list)  # {"time": float, "message": str}

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def ok(self) -> bool:
        return self.phase == "Completed"


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


class Engine(Protocol):
    """What the CLI and the SDK may ask of an engine. ``ref`` is a job id, a unique prefix or a name."""

    name: str

    def check(self, job: Job) -> list[tuple[str, str]]:
        """What stops ``job`` from running on this engine, as (field path, message); [] when it can."""
        ...

    def start(self, job: Job, options: StartOptions) -> JobReport:
        """Run ``job``: attached, until it ends (its final report); detached, return once started."""
        ...

    def list_jobs(self) -> list[JobReport]:
        """Every job this engine knows of, newest first (a damaged one as phase Unknown with the reason)."""
        ...

    def status(self, ref: str) -> JobReport:
        """One job's report; EngineError when ``ref`` names no job or more than one."""
        ...

    def logs(self, ref: str, query: LogQuery) -> Iterator[LogLine]:
        """The job's log lines, oldest first; with ``follow``, until the job ends."""
        ...

    def wait(self, ref: str, timeout: float | None = None) -> JobReport:
        """Block until the job reaches a terminal phase (or ``timeout`` passes): its latest report."""
        ...

    def delete(self, refs: list[str]) -> list[str]:
        """Stop and remove these jobs; every ref is resolved before anything is deleted. Their ids."""
        ...
