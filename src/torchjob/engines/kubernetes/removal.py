"""Deleting a job from the cluster: all its objects, and, where torchjob cannot wait for ever, within
a bound as a whole (the delete after ``--timeout``, ``--replace``'s delete of the old job)."""

from __future__ import annotations

import functools
from typing import Any

from torchjob.engines.kubernetes import bounded, claims
from torchjob.engines.kubernetes.client import Cluster, list_labelled, namespaced_path
from torchjob.engines.kubernetes.errors import ApiError
from torchjob.engines.kubernetes.kinds import JOB_LABEL, Discovery, Found
from torchjob.engines.kubernetes.submit import delete_object


def delete_job(cluster: Cluster, discovery: Discovery, found: Found) -> None:
    """Delete the job's object (its children go with it) and its claims, or, for bare pods, every
    object of the target's side kinds and the pods, by the job's label."""
    namespace, label = found.namespace, f"{JOB_LABEL}={found.name}"
    if found.kind is not None:
        path = namespaced_path(found.kind.api_version, found.kind.plural, namespace, found.name)
        delete_object(cluster, path, f"{found.kind.label} {found.name}")
        # The controller's children go with it (owner references), so do the claims made for
        # its volumes; any claim without the reference goes by its label.
        for claim in claims.of_job(cluster, namespace, found.name):
            name = str(claim["metadata"]["name"])
            if not claims.deleting(claim):
                delete_object(cluster, claims.claim_path(namespace, name), f"claim {name}")
        return
    from torchjob.targets import get_target

    for api_version, plural in get_target(found.target).side_kinds:
        if not discovery.has_version(api_version):
            continue
        try:
            items = list_labelled(
                cluster,
                namespaced_path(api_version, plural, namespace),
                label,
                f"list the {plural} of job {found.name}",
            )
        except ApiError as err:
            if err.status == 404:
                continue
            raise
        for item in items:
            name = str(item["metadata"]["name"])
            delete_object(cluster, namespaced_path(api_version, plural, namespace, name), f"{plural} {name}")
    cluster.json(  # one request for every pod of the job
        "DELETE",
        namespaced_path("v1", "pods", namespace),
        query={"labelSelector": label},
        doing=f"delete the pods of job {found.name}",
    )


def delete_within(cluster: Cluster, discovery: Discovery, found: Found, seconds: float) -> bool:
    """:func:`delete_job` within ``seconds`` as a whole: whether it was done (False: what was not
    deleted yet may be left). A delete that failed raises its error; Ctrl-C stops the wait."""
    work: bounded.Background[Any] = bounded.Background(
        functools.partial(delete_job, cluster, discovery, found), name="torchjob-delete"
    )
    if not work.wait(seconds):
        return False
    work.outcome()
    return True


def what_is_left(found: Found) -> str:
    """The objects a delete cut short may leave, by what they share: the job's label."""
    what = found.kind.label if found.kind is not None else "objects"
    return f"its {what} and the objects labelled {JOB_LABEL}={found.name} in namespace {found.namespace}"
