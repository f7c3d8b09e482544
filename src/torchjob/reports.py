"""The reports every engine gives of a job, its pods and containers: typed records with one JSON shape.

``JobReport.to_dict()`` is what ``torchjob status -o json`` prints and what the local and Slurm
engines keep as ``status.json``; ``from_dict`` reads it back, checking every field (a
:class:`ReportError` names the one that is wrong). The shape is documented in docs/engines.md.
This module sits at the bottom of the layers, beside the vocabulary it uses (:mod:`torchjob.phases`),
so that the engines, the controller that builds reports and :mod:`torchjob.display` that prints
them all read the same records.
"""

from __future__ import annotations

from torchjob.phases import TERMINAL_JOB_PHASES, ContainerState, JobPhase, PodState
from torchjob.records import field, record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from enum import Enum
    from typing import Any, TypeVar

    E = TypeVar("E", bound=Enum)

__all__ = [
    "ContainerReport",
    "Event",
    "FailureReport",
    "JobReport",
    "PodReport",
    "PortReport",
    "ReportError",
]


class ReportError(ValueError):
    """A stored report that is not the documented shape: names the field and what was expected."""


class _Reader:
    """Typed reads from one JSON object of a report; a wrong type raises :class:`ReportError`."""

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, dict):
            raise ReportError(
                f"{where.rstrip('.') or 'the report'}: expected an object, got {type(data).__name__}"
            )
        self.data: dict[str, Any] = data
        self.where = where

    def _get(self, key: str, kinds: tuple[type, ...], what: str, default: Any) -> Any:
        if key not in self.data:
            if default is _REQUIRED:
                raise ReportError(f"{self.where}{key}: missing, expected {what}")
            return default
        value = self.data[key]
        if value is None and default is None:
            return None
        # bool is an int to Python, but never a count or a time in a report
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise ReportError(f"{self.where}{key}: expected {what}, got {type(value).__name__}")
        return value

    def text(self, key: str, default: Any = "") -> Any:
        return self._get(key, (str,), "a string", default)

    def integer(self, key: str, default: Any = 0) -> Any:
        return self._get(key, (int,), "an integer", default)

    def number(self, key: str) -> float | None:
        value = self._get(key, (int, float), "a number", None)
        return None if value is None else float(value)

    def choice(self, key: str, kind: type[E], default: Any) -> E:
        """One of a vocabulary's words (an enum of strings), as that enum's member."""
        text = self.text(key, default)
        try:
            return kind(text)
        except ValueError:
            words = ", ".join(member.value for member in kind)
            raise ReportError(f"{self.where}{key}: expected one of {words}, got {text!r}") from None

    def flag(self, key: str) -> bool:
        return bool(self._get(key, (bool,), "true or false", False))

    def items(self, key: str) -> list[Any]:
        value: list[Any] = self._get(key, (list,), "a list", [])
        return value

    def at(self, key: str, index: int) -> str:
        return f"{self.where}{key}[{index}]."


_REQUIRED: Any = object()


@record
class Event:
    """One lifecycle event of a job (a restart, a policy's action, a pod's failure), as said."""

    time: float  # seconds since the epoch
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"time": self.time, "message": self.message}

    @classmethod
    def from_dict(cls, data: object, where: str = "") -> Event:
        r = _Reader(data, where)
        return cls(time=r.number("time") or 0.0, message=r.text("message"))


@record
class ContainerReport:
    name: str
    init: bool = False
    state: ContainerState = ContainerState.WAITING
    exit_code: int | None = None
    reason: str = ""  # e.g. ImagePullBackOff, OOMKilled, Error
    restarts: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "init": self.init,
            "state": str(self.state),
            "exitCode": self.exit_code,
            "reason": self.reason,
            "restarts": self.restarts,
        }

    @classmethod
    def from_dict(cls, data: object, where: str = "") -> ContainerReport:
        r = _Reader(data, where)
        return cls(
            name=r.text("name", _REQUIRED),
            init=r.flag("init"),
            state=r.choice("state", ContainerState, ContainerState.WAITING),
            exit_code=r.integer("exitCode", None),
            reason=r.text("reason"),
            restarts=r.integer("restarts"),
        )


@record
class PodReport:
    name: str  # the full pod name (<job>-<task>-<index> locally, the cluster's name on a cluster)
    short: str  # <task>-<index>: the log prefix
    task: str
    index: int
    phase: PodState
    rank: int | None = None
    reason: str = ""
    attempt: int = 0
    restarts: int = 0
    exit_code: int | None = None
    started_at: float | None = None  # seconds since the epoch
    finished_at: float | None = None
    address: str = ""
    containers: list[ContainerReport] = field(default_factory=list)
    terminating: bool = False  # being stopped: its processes have been signalled
    last_output_at: float | None = None  # when its containers last wrote output (engines that know)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "short": self.short,
            "task": self.task,
            "index": self.index,
            "phase": str(self.phase),  # a PodState (an engine of its own may give the word)
            "rank": self.rank,
            "reason": self.reason,
            "attempt": self.attempt,
            "restarts": self.restarts,
            "exitCode": self.exit_code,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
            "address": self.address,
            "terminating": self.terminating,
            "lastOutputAt": self.last_output_at,
            "containers": [c.to_dict() for c in self.containers],
        }

    @classmethod
    def from_dict(cls, data: object, where: str = "") -> PodReport:
        r = _Reader(data, where)
        return cls(
            name=r.text("name", _REQUIRED),
            short=r.text("short", _REQUIRED),
            task=r.text("task", _REQUIRED),
            index=r.integer("index"),
            phase=r.choice("phase", PodState, _REQUIRED),
            rank=r.integer("rank", None),
            reason=r.text("reason"),
            attempt=r.integer("attempt"),
            restarts=r.integer("restarts"),
            exit_code=r.integer("exitCode", None),
            started_at=r.number("startedAt"),
            finished_at=r.number("finishedAt"),
            address=r.text("address"),
            terminating=r.flag("terminating"),
            last_output_at=r.number("lastOutputAt"),
            containers=[
                ContainerReport.from_dict(c, r.at("containers", i))
                for i, c in enumerate(r.items("containers"))
            ],
        )


@record
class PortReport:
    declared: int
    host: int

    def to_dict(self) -> dict[str, Any]:
        return {"declared": self.declared, "host": self.host}

    @classmethod
    def from_dict(cls, data: object, where: str = "") -> PortReport:
        r = _Reader(data, where)
        return cls(declared=r.integer("declared", _REQUIRED), host=r.integer("host", _REQUIRED))


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
    # The exception the program raised, as its log's last traceback ends (``RuntimeError: boom``),
    # read from more of the log than the tail kept: a deep traceback's start is not in the tail.
    exception: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "short": self.short,
            "exitCode": self.exit_code,
            "rank": self.rank,
            "reason": self.reason,
            "time": self.time,
            "logTail": list(self.log_tail),
            "exception": self.exception,
        }

    @classmethod
    def from_dict(cls, data: object, where: str = "") -> FailureReport:
        r = _Reader(data, where)
        tail = r.items("logTail")
        if not all(isinstance(line, str) for line in tail):
            raise ReportError(f"{where}logTail: expected a list of strings")
        return cls(
            pod=r.text("pod", _REQUIRED),
            short=r.text("short"),
            exit_code=r.integer("exitCode", None),
            rank=r.integer("rank", None),
            reason=r.text("reason"),
            time=r.number("time"),
            log_tail=list(tail),
            exception=r.text("exception"),
        )


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
    events: list[Event] = field(default_factory=list)  # the latest lifecycle events, oldest first

    name_resolution: str = ""  # local engine: whether pod names resolve for the job's processes
    network: str = ""  # local engine: the job's own network namespace, or why the machine's
    # A cluster's job of which only what it left remains (its object and pods are gone): those
    # objects as kind/name (phase Unknown, the reason naming them and how to remove them).
    leftovers: list[str] = field(default_factory=list)

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_JOB_PHASES

    @property
    def ok(self) -> bool:
        return self.phase == JobPhase.COMPLETED

    @property
    def settling(self) -> bool:
        """Failed, and pods the job stopped are still stopping: their logs may yet name the root
        cause (a rank that raised in a pod stopped before it failed by itself); a ``wait`` gives
        them a while (engine_api/polling.py)."""
        return self.terminal and not self.ok and any(p.terminating for p in self.pods)

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON shape (camelCase keys; docs/engines.md): ``status -o json`` prints it."""
        data: dict[str, Any] = {
            "engine": self.engine,
            "id": self.id,
            "name": self.name,
            "namespace": self.namespace,
            "phase": self.phase,
            "reason": self.reason,
            "target": self.target,
            "location": self.location,
            "retryCount": self.retry_count,
            "maxRetry": self.max_retry,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
            "ports": [p.to_dict() for p in self.ports],
            "pods": [p.to_dict() for p in self.pods],
            "firstFailure": self.first_failure.to_dict() if self.first_failure else None,
            "events": [e.to_dict() for e in self.events],
        }
        if self.name_resolution:
            data["nameResolution"] = self.name_resolution
        if self.network:
            data["network"] = self.network
        if self.leftovers:
            data["leftovers"] = list(self.leftovers)
        return data

    @classmethod
    def from_dict(cls, data: object) -> JobReport:
        """The report ``to_dict`` wrote; :class:`ReportError` naming the field when it is not that shape."""
        r = _Reader(data, "")
        failure = r.data.get("firstFailure")
        leftovers = r.items("leftovers")
        if not all(isinstance(item, str) for item in leftovers):
            raise ReportError("leftovers: expected a list of strings")
        return cls(
            engine=r.text("engine", _REQUIRED),
            id=r.text("id", _REQUIRED),
            name=r.text("name", _REQUIRED),
            phase=r.text("phase", _REQUIRED),
            reason=r.text("reason"),
            namespace=r.text("namespace", "default"),
            target=r.text("target"),
            location=r.text("location"),
            retry_count=r.integer("retryCount"),
            max_retry=r.integer("maxRetry"),
            started_at=r.number("startedAt"),
            finished_at=r.number("finishedAt"),
            pods=[PodReport.from_dict(p, r.at("pods", i)) for i, p in enumerate(r.items("pods"))],
            ports=[PortReport.from_dict(p, r.at("ports", i)) for i, p in enumerate(r.items("ports"))],
            first_failure=None if failure is None else FailureReport.from_dict(failure, "firstFailure."),
            events=[Event.from_dict(e, f"events[{i}].") for i, e in enumerate(r.items("events"))],
            name_resolution=r.text("nameResolution"),
            network=r.text("network"),
            leftovers=list(leftovers),
        )
