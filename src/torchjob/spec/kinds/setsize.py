"""A JobSet's size, counted from its numbers before any of its Jobs (a task each) is made: a set
too large for any cluster is refused at once, not after its Jobs are checked one by one."""

from __future__ import annotations

from torchjob.spec.kinds.common import INT32_MAX, at, integer, mapping
from torchjob.spec.validate import MAX_PODS
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from torchjob.spec.kinds.translation import Translation
    from torchjob.spec.source import Document

    Place = Callable[[str], tuple[Document, str]]


def pods_per_job(rjob: dict[str, Any]) -> tuple[int, int | None]:
    """A replicated job's pods per Job (its completions, else its parallelism, else 1) and its
    parallelism as given."""
    job_spec = mapping(at(rjob, "template", "spec"))
    completions, parallelism = integer(job_spec.get("completions")), integer(job_spec.get("parallelism"))
    pods = completions if completions is not None else (parallelism if parallelism is not None else 1)
    return pods, parallelism


def sizes_fit(tr: Translation, rjobs: list[tuple[int, dict[str, Any]]], place: Place) -> bool:
    """Whether the set's pods can be made: each replicated job's ``replicas`` times
    ``parallelism`` within JobSet's int32 and the pods in all within a cluster's
    (``validate.MAX_PODS``). Counted from the numbers alone, so that a set too large for any
    cluster is refused before its Jobs (one task each) are made and checked one by one."""
    fits, total = True, 0
    for r, rjob in rjobs:
        count = integer(rjob.get("replicas"), 1) or 0
        pods, parallelism = pods_per_job(rjob)
        if max(count, pods, parallelism or 0) > INT32_MAX:
            # an int32 field's value out of range: its schema told it; no Job is made of it
            # (2**31 of them, one task each, would never end)
            fits = False
            continue
        total += count * max(pods, 0)
        product = count * (parallelism if parallelism is not None else 1)
        if product > INT32_MAX:  # JobSet's webhook
            where, path = place(f"replicatedJobs[{r}].replicas")
            message = f"replicas times parallelism is {product}; JobSet takes at most {INT32_MAX}"
            if where is tr.source:
                tr.add(path, message)
            else:
                tr.elsewhere.append(where.problem(path, message))
            fits = False
    if total > MAX_PODS:
        where, path = place("replicatedJobs")
        message = (
            f"the replicated jobs make {total} pods in all; expected at most {MAX_PODS}, "
            "the most pods one Kubernetes cluster is built for"
        )
        if where is tr.source:
            tr.add(path, message)
        else:  # a TrainJob's runtime: the TrainJob tells its pods in all at its own field
            tr.add("spec.runtimeRef", message)
        fits = False
    return fits
