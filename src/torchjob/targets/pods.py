"""``pods``: the expansion as it stands (what Volcano's controller would create), each object labelled."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torchjob.expand import Expansion, paused_gc
from torchjob.spec.model import Job
from torchjob.targets import JOB_LABEL, TargetRender


def objects(expansion: Expansion) -> Iterator[dict[str, Any]]:
    """Job-level objects first, then every pod, each carrying :data:`JOB_LABEL`."""
    name = expansion.job.name
    for obj in expansion.objects():
        obj["metadata"].setdefault("labels", {})[JOB_LABEL] = name
        yield obj
    for pod in expansion.pods():
        pod.manifest["metadata"]["labels"][JOB_LABEL] = name
        yield pod.manifest


def render(job: Job) -> TargetRender:
    expansion = Expansion(job)
    with paused_gc():
        items = list(objects(expansion))
    return TargetRender(kind="Pod", api_version="v1", objects=items, warnings=expansion.warnings())
