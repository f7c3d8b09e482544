"""Targets: one validated job rendered as the objects a Kubernetes training stack runs.

A layer between :mod:`torchjob.expand` and the engines, pure like them (no I/O, no kubernetes
import). ``render_target(job, target)`` returns the objects to create, in creation order, plus
warnings for what a target drops harmlessly; a feature a target cannot express raises
:class:`~torchjob.errors.SpecError` naming the feature, the target and the targets that can.

Each target is one module that declares a :class:`Target` record (``TARGET``): how it renders,
and how an engine reads its objects back (its kind, status, pod labels, env). :data:`MODULES`
lists them; everything else (CLI choices, the capability table, the cluster's kinds) derives
from the records. Adding a target is one module and one line here.

- ``pods``: the expansion itself (what Volcano's controller would create).
- ``volcano``: the defaulted Volcano ``Job`` (``batch.volcano.sh/v1alpha1``).
- ``kubeflow``: a training-operator v1 ``PyTorchJob``, mapped as Flyte's backend maps it.
- ``trainjob``: a Kubeflow Trainer v2 ``TrainJob`` run through ``torchrun``.
- ``jobset``: a ``JobSet`` (``jobset.x-k8s.io/v1alpha2``) for clusters with only JobSet.
"""

from __future__ import annotations

from collections.abc import Callable

from torchjob.records import field, record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI reads target_names() while building its parser: nothing heavy here
    from typing import Any

    from torchjob.spec.model import Job

# The one list of targets: module paths, in the order CLI choices and messages name them.
MODULES = [
    "torchjob.targets.pods",
    "torchjob.targets.volcano",
    "torchjob.targets.kubeflow",
    "torchjob.targets.trainjob",
    "torchjob.targets.jobset",
]
# Every object a target renders, and every pod template in it, carries this label.
JOB_LABEL = "torchjob.io/job-name"

__all__ = [
    "JOB_LABEL",
    "MODULES",
    "Status",
    "Target",
    "TargetRender",
    "TopKind",
    "all_targets",
    "for_cluster",
    "get_target",
    "render_target",
    "target_names",
]


@record
class TargetRender:
    """What one target makes of a job: objects to create (in order) and harmless losses."""

    kind: str
    api_version: str
    objects: list[dict[str, Any]] = field(default_factory=list)
    # (field path, message): what the target drops; never an error.
    warnings: list[tuple[str, str]] = field(default_factory=list)


@record(frozen=True)
class TopKind:
    """The object whose controller runs the job, and what a cluster admin installs to get it."""

    api_version: str  # group/version
    kind: str
    plural: str
    install: str
    # Fields an older controller's CRD lacks: (field path without list indexes, the first version of
    # the controller that has it). A cluster that refuses one is told which version it needs.
    versions: tuple[tuple[str, str], ...] = ()

    @property
    def controller(self) -> str:
        """The controller as a cluster admin knows it ("Kubeflow Trainer")."""
        return self.install.removeprefix("install ")


@record(frozen=True)
class Status:
    """What a target's own object says of the job, in Volcano's phase words; phase None: ask the pods."""

    phase: str | None
    reason: str = ""
    since: str | None = None  # the condition's lastTransitionTime, as written


@record(frozen=True)
class Target:
    """One target, declared once in its own module as ``TARGET``."""

    name: str
    render: Callable[[Job, str | None], TargetRender]  # (job, --runtime)
    top: TopKind | None = None  # None: bare pods, read back by their label
    preference: int = 100  # without --target, the cluster's kind with the lowest is chosen
    can: frozenset[str] = frozenset()  # features (common.FEATURES) it can express
    status: Callable[[dict[str, Any]], Status] | None = None  # None: the phase comes from the pods
    task_keys: tuple[str, ...] = ()  # pod labels (or annotations) naming a pod's task...
    index_keys: tuple[str, ...] = ()  # ...and its index in that task, tried in order
    # ...and the run of the whole job it belongs to (the controller's count of the job's restarts:
    # a restarted job's pods are made again, maybe under the same names)
    attempt_keys: tuple[str, ...] = ()
    add_env: Callable[[dict[str, Any], dict[str, str]], None] | None = None  # None: every container
    runtime: bool = False  # takes --runtime
    # (field path, what, name): the longest name of each kind its controller derives from the job's
    generated: Callable[[Job], list[tuple[str, str, str]]] | None = None
    dns1035: bool = False  # the job's name must start with a letter (it names a Service)
    podgroup: bool = False  # Volcano's PodGroup of the job carries the job's label
    # Without a top object: the (api version, plural) of what it renders beside its pods, deleted
    # with the job by its label (the pods themselves always are).
    side_kinds: tuple[tuple[str, str], ...] = ()


def target_names() -> tuple[str, ...]:
    """Every target's name, without importing any target module (the CLI's choices)."""
    return tuple(module.rpartition(".")[2] for module in MODULES)


_LOADED: dict[str, Target] = {}


def get_target(name: str) -> Target:
    """The record of target ``name``; its module is imported only when asked for."""
    if name not in _LOADED:
        import importlib

        from torchjob.target_api.common import unknown_target

        module = next((m for m in MODULES if m.rpartition(".")[2] == name), None)
        if module is None:
            names = ", ".join(target_names())
            raise unknown_target(f"unknown target {name!r}; expected one of {names}")
        _LOADED[name] = importlib.import_module(module).TARGET
    return _LOADED[name]


def all_targets() -> list[Target]:
    return [get_target(name) for name in target_names()]


def _runtime_targets() -> str:
    return " or ".join(t.name for t in all_targets() if t.runtime)


def render_target(job: Job, target: str, *, runtime: str | None = None) -> TargetRender:
    """The objects ``target`` needs for ``job`` (validated and defaulted)."""
    from torchjob.target_api.common import unknown_target

    declared = get_target(target)
    if runtime is not None and not declared.runtime:
        raise unknown_target(f"--runtime only applies to --target {_runtime_targets()}, not {target!r}")
    from torchjob.target_api.convert import is_converted, render_kind

    if is_converted(job):  # read from a PyTorchJob, TrainJob or JobSet: as read, or converted
        return render_kind(job, target, runtime)
    from torchjob.target_api.names import check

    check(job, target)  # names the controller makes from the job's must fit their limits
    return declared.render(job, runtime)


def for_cluster(
    job: Job, target: str, namespace: str, env: dict[str, str] | None = None, *, runtime: str | None = None
) -> TargetRender:
    """Exactly what is sent to a cluster: the target's objects in ``namespace``, ``env`` added.

    The kubernetes engine submits this and ``torchjob render -n NS -e K=V`` prints it."""
    from torchjob.records import replace
    from torchjob.target_api.common import add_env_to_containers

    job = replace(job, metadata=replace(job.metadata, namespace=namespace))
    rendered = render_target(job, target, runtime=runtime)
    declared = get_target(target)
    add_env = declared.add_env or add_env_to_containers
    for obj in rendered.objects:
        obj.setdefault("metadata", {})["namespace"] = namespace
        if env:
            add_env(obj, env)
    return rendered
