"""Task configurations with the names, fields and defaults of Flyte's kfpytorch plugin.

``PyTorch`` describes a master plus workers that each run the function once; ``Elastic``
describes torch elastic launches (``torchrun``), on one node or many. Every contradiction or
out-of-range value raises ``ValueError`` when the object is built, so a bad config fails at
import/decoration time, not minutes later in a pod. Nothing here imports torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeVar

START_METHODS = ("spawn", "fork", "forkserver")
_NNODES = re.compile(r"^\s*([0-9]+)\s*(?::\s*([0-9]+)\s*)?$")  # ASCII digits, as torchrun reads them
_MAX_DIGITS = 18  # more is no node count; int() refuses text past 4,300 digits anyway


def _is_quantity(text: str) -> bool:
    """A Kubernetes quantity that is not negative (``500m``, ``4Gi``, ``1e3``)."""
    from torchjob.spec.units import parse_quantity

    try:
        return parse_quantity(text) >= 0 and not text.lstrip().startswith(("+", "-"))
    except ValueError:
        return False


_Config = TypeVar("_Config", bound=type)


def _known_fields(cls: _Config) -> _Config:
    """A keyword that is not a field (``Worker(replica=3)``) is a ValueError naming the field and
    the nearest one, like every other bad config, rather than Python's bare TypeError."""
    from dataclasses import fields
    from functools import wraps

    init = vars(cls)["__init__"]  # the dataclass's own
    names = [f.name for f in fields(cls)]

    @wraps(init)
    def checked(self: Any, *args: Any, **kwargs: Any) -> None:
        for key in kwargs:
            if key not in names:
                import difflib

                close = difflib.get_close_matches(key, names, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"expected one of {', '.join(names)}"
                raise ValueError(f"{cls.__name__}: unknown field {key!r}; {hint}")
        init(self, *args, **kwargs)

    setattr(cls, "__init__", checked)  # noqa: B010 - assigned on the class, not an instance
    return cls


class RestartPolicy(Enum):
    """What the kubelet does when a replica's container exits; values are Kubernetes' spellings."""

    ALWAYS = "Always"
    FAILURE = "OnFailure"
    NEVER = "Never"


class CleanPodPolicy(Enum):
    """Which pods are deleted when the job finishes (Kubeflow's ``cleanPodPolicy``)."""

    NONE = "None"
    ALL = "All"
    RUNNING = "Running"


def _optional_int(owner: str, name: str, value: Any, minimum: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{owner}.{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{owner}.{name} must be >= {minimum}, got {value}")


def _enum(owner: str, name: str, value: Any, kind: type[Enum]) -> None:
    if value is not None and not isinstance(value, kind):
        choices = ", ".join(f"{kind.__name__}.{m.name}" for m in kind)
        raise ValueError(f"{owner}.{name} must be one of {choices}, got {value!r}")


@_known_fields
@dataclass
class Resources:
    """Compute resources of a replica, in Kubernetes quantities (``cpu="2"``, ``mem="4Gi"``)."""

    cpu: str | int | float | None = None
    mem: str | int | None = None
    gpu: str | int | None = None
    ephemeral_storage: str | int | None = None

    def __post_init__(self) -> None:
        for name in ("cpu", "mem", "gpu", "ephemeral_storage"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise ValueError(f"Resources.{name} must be a quantity such as '2' or '4Gi', got {value!r}")
            if isinstance(value, int | float) and value < 0:
                raise ValueError(f"Resources.{name} must not be negative, got {value}")
            if isinstance(value, str) and not _is_quantity(value):
                raise ValueError(
                    f"Resources.{name}: {value!r} is not a Kubernetes quantity such as '500m' or '4Gi'"
                )

    def to_k8s(self) -> dict[str, str]:
        """The Kubernetes ``resources.requests``/``limits`` mapping."""
        keys = {
            "cpu": "cpu",
            "mem": "memory",
            "gpu": "nvidia.com/gpu",
            "ephemeral_storage": "ephemeral-storage",
        }
        return {
            key: str(getattr(self, attr)) for attr, key in keys.items() if getattr(self, attr) is not None
        }


def _resources(owner: str, name: str, value: Any) -> None:
    if value is not None and not isinstance(value, Resources):
        raise ValueError(f"{owner}.{name} must be a torchjob.Resources, got {type(value).__name__}")


@_known_fields
@dataclass
class RunPolicy:
    """Job-level policy: pod clean-up, TTL, active deadline and back-off limit."""

    clean_pod_policy: CleanPodPolicy | None = None
    ttl_seconds_after_finished: int | None = None
    active_deadline_seconds: int | None = None
    backoff_limit: int | None = None

    def __post_init__(self) -> None:
        _enum("RunPolicy", "clean_pod_policy", self.clean_pod_policy, CleanPodPolicy)
        _optional_int("RunPolicy", "ttl_seconds_after_finished", self.ttl_seconds_after_finished, 0)
        _optional_int("RunPolicy", "active_deadline_seconds", self.active_deadline_seconds, 1)
        _optional_int("RunPolicy", "backoff_limit", self.backoff_limit, 0)


@_known_fields
@dataclass
class Worker:
    image: str | None = None
    requests: Resources | None = None
    limits: Resources | None = None
    replicas: int | None = None
    restart_policy: RestartPolicy | None = None

    def __post_init__(self) -> None:
        _optional_int("Worker", "replicas", self.replicas, 0)
        _replica_checks("Worker", self.image, self.requests, self.limits, self.restart_policy)


@_known_fields
@dataclass
class Master:
    """The rank-0 replica; there is always exactly one, so it has no ``replicas``."""

    image: str | None = None
    requests: Resources | None = None
    limits: Resources | None = None
    restart_policy: RestartPolicy | None = None

    def __post_init__(self) -> None:
        _replica_checks("Master", self.image, self.requests, self.limits, self.restart_policy)


def _replica_checks(owner: str, image: Any, requests: Any, limits: Any, restart: Any) -> None:
    if image is not None and (not isinstance(image, str) or not image):
        raise ValueError(f"{owner}.image must be a non-empty string, got {image!r}")
    _resources(owner, "requests", requests)
    _resources(owner, "limits", limits)
    _enum(owner, "restart_policy", restart, RestartPolicy)


def _run_policy(owner: str, value: Any) -> None:
    if value is not None and not isinstance(value, RunPolicy):
        raise ValueError(f"{owner}.run_policy must be a torchjob.RunPolicy, got {type(value).__name__}")


@_known_fields
@dataclass
class PyTorch:
    """One master (rank 0) and ``worker.replicas`` workers, each running the function once."""

    master: Master = field(default_factory=Master)
    worker: Worker = field(default_factory=Worker)
    run_policy: RunPolicy | None = None
    num_workers: int | None = None  # the old spelling of worker.replicas
    increase_shared_mem: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.master, Master):
            raise ValueError(f"PyTorch.master must be a torchjob.Master, got {type(self.master).__name__}")
        if not isinstance(self.worker, Worker):
            raise ValueError(f"PyTorch.worker must be a torchjob.Worker, got {type(self.worker).__name__}")
        _run_policy("PyTorch", self.run_policy)
        _optional_int("PyTorch", "num_workers", self.num_workers, 0)
        if self.num_workers is not None and self.worker.replicas is not None:
            raise ValueError(
                "PyTorch: num_workers and worker.replicas are both set; "
                "set only worker=Worker(replicas=N) (num_workers is the deprecated spelling)"
            )
        if self.num_workers is None and self.worker.replicas is None:
            raise ValueError("PyTorch: the number of workers is missing; set worker=Worker(replicas=N)")

    @property
    def workers(self) -> int:
        """The number of worker replicas, whichever spelling set it."""
        count = self.worker.replicas if self.worker.replicas is not None else self.num_workers
        return int(count or 0)


def parse_nnodes(nnodes: Any) -> tuple[int, int]:
    """``2`` -> (2, 2); ``"1:4"`` -> (1, 4); anything else is a ValueError."""
    if isinstance(nnodes, bool):
        raise ValueError(f"Elastic.nnodes must be an integer or a 'MIN:MAX' string, got {nnodes!r}")
    if isinstance(nnodes, int):
        low = high = nnodes
    elif isinstance(nnodes, str):
        match = _NNODES.match(nnodes)
        if not match:
            shown = repr(nnodes) if len(nnodes) <= 40 else f"{nnodes[:30]!r}... ({len(nnodes)} characters)"
            raise ValueError(f"Elastic.nnodes={shown} is not a node count such as 2 or a range such as '1:4'")
        digits = max(len(match[1]), len(match[2] or ""))
        if digits > _MAX_DIGITS:
            raise ValueError(
                f"Elastic.nnodes: a node count of {digits} digits is too large (expected 2, or '1:4')"
            )
        low = int(match[1])
        high = int(match[2]) if match[2] is not None else low
    else:
        raise ValueError(
            f"Elastic.nnodes must be an integer or a 'MIN:MAX' string, got {type(nnodes).__name__}"
        )
    if low < 1:
        raise ValueError(f"Elastic.nnodes={nnodes!r}: the node count must be at least 1")
    if low > high:
        raise ValueError(
            f"Elastic.nnodes={nnodes!r}: the minimum ({low}) is larger than the maximum ({high})"
        )
    return low, high


def _default_rdzv_configs() -> dict[str, Any]:
    return {"timeout": 900, "join_timeout": 900}


@_known_fields
@dataclass
class Elastic:
    """A torch elastic launch: ``nnodes`` nodes (or a ``"MIN:MAX"`` range) of ``nproc_per_node`` processes."""

    nnodes: int | str = 1
    nproc_per_node: int = 1
    start_method: str = "spawn"
    monitor_interval: int | float = 0.1  # torchrun's default; Flyte's 5 s adds seconds to every call
    max_restarts: int = 0
    rdzv_configs: dict[str, Any] = field(default_factory=_default_rdzv_configs)
    increase_shared_mem: bool = True
    run_policy: RunPolicy | None = None
    # Derived from nnodes in __post_init__.
    min_nodes: int = field(init=False, repr=False, compare=False)
    max_nodes: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.min_nodes, self.max_nodes = parse_nnodes(self.nnodes)
        if isinstance(self.nproc_per_node, bool) or not isinstance(self.nproc_per_node, int):
            raise ValueError(f"Elastic.nproc_per_node must be an integer, got {self.nproc_per_node!r}")
        if self.nproc_per_node < 1:
            raise ValueError(f"Elastic.nproc_per_node must be at least 1, got {self.nproc_per_node}")
        if self.start_method not in START_METHODS:
            raise ValueError(
                f"Elastic.start_method must be one of {', '.join(START_METHODS)}, got {self.start_method!r}"
            )
        interval = self.monitor_interval
        if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
            raise ValueError(f"Elastic.monitor_interval must be a number of seconds > 0, got {interval!r}")
        _optional_int("Elastic", "max_restarts", self.max_restarts, 0)
        if self.max_restarts is None:
            raise ValueError("Elastic.max_restarts must be an integer >= 0, got None")
        if not isinstance(self.rdzv_configs, dict) or not all(isinstance(k, str) for k in self.rdzv_configs):
            raise ValueError(
                f"Elastic.rdzv_configs must be a dict with string keys, got {self.rdzv_configs!r}"
            )
        for key in ("timeout", "join_timeout", "last_call_timeout", "close_timeout", "read_timeout"):
            value = self.rdzv_configs.get(key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
            ):
                raise ValueError(
                    f"Elastic.rdzv_configs[{key!r}] must be a number of seconds > 0, got {value!r}"
                )
        _run_policy("Elastic", self.run_policy)

    @property
    def single_node(self) -> bool:
        """True for ``1``, ``"1"`` and ``"1:1"``: everything runs on one node, no multi-node rendezvous."""
        return self.max_nodes == 1

    @property
    def nnodes_text(self) -> str:
        """The ``MIN:MAX`` form torchrun and the entrypoint take."""
        return f"{self.min_nodes}:{self.max_nodes}"
