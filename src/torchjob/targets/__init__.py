"""Targets: one validated job rendered as the objects a Kubernetes training stack runs.

A layer between :mod:`torchjob.expand` and the engines, pure like them (no I/O, no kubernetes
import). ``render_target(job, target)`` returns the objects to create, in creation order, plus
warnings for what a target drops harmlessly; a feature a target cannot express raises
:class:`~torchjob.errors.SpecError` naming the feature, the target and the targets that can.

- ``pods``: the expansion itself (what Volcano's controller would create).
- ``volcano``: the defaulted Volcano ``Job`` (``batch.volcano.sh/v1alpha1``).
- ``kubeflow``: a training-operator v1 ``PyTorchJob``, mapped as Flyte's backend maps it.
- ``trainjob``: a Kubeflow Trainer v2 ``TrainJob`` run through ``torchrun``.
- ``jobset``: a ``JobSet`` (``jobset.x-k8s.io/v1alpha2``) for clusters with only JobSet.
"""

from __future__ import annotations

from typing import Any

from torchjob.records import field, record
from torchjob.spec.model import Job

TARGETS = ("pods", "volcano", "kubeflow", "trainjob", "jobset")
# Every object a target renders, and every pod template in it, carries this label.
JOB_LABEL = "torchjob.io/job-name"

__all__ = ["JOB_LABEL", "TARGETS", "TargetRender", "render_target"]


@record
class TargetRender:
    """What one target makes of a job: objects to create (in order) and harmless losses."""

    kind: str
    api_version: str
    objects: list[dict[str, Any]] = field(default_factory=list)
    # (field path, message): what the target drops; never an error.
    warnings: list[tuple[str, str]] = field(default_factory=list)


def render_target(job: Job, target: str, *, runtime: str | None = None) -> TargetRender:
    """The objects ``target`` needs for ``job`` (validated and defaulted)."""
    from torchjob.targets.common import unknown_target

    if runtime is not None and target != "trainjob":
        raise unknown_target(f"--runtime only applies to --target trainjob, not {target!r}")
    if target in TARGETS:
        from torchjob.targets.names import check

        check(job, target)  # names the controller makes from the job's must fit their limits
    # Each target module is imported only when asked for.
    if target == "pods":
        from torchjob.targets import pods
        from torchjob.targets.common import uncontrolled_warnings

        rendered = pods.render(job)
        rendered.warnings += uncontrolled_warnings(job)
        return rendered
    if target == "volcano":
        from torchjob.targets import volcano

        return volcano.render(job)
    if target == "kubeflow":
        from torchjob.targets import kubeflow

        return kubeflow.render(job)
    if target == "trainjob":
        from torchjob.targets import trainjob

        return trainjob.render(job, runtime=runtime)
    if target == "jobset":
        from torchjob.targets import jobset

        return jobset.render(job)
    raise unknown_target(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
