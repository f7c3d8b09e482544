"""Deleting a job from the cluster: all its objects, and, where torchjob cannot wait for ever, within
a bound as a whole (the delete after ``--timeout``, ``--replace``'s delete of the old job)."""

from __future__ import annotations

import functools
from typing import Any

from torchjob.engines.kubernetes import bounded, claims
from torchjob.engines.kubernetes.client import Cluster, namespaced_path
from torchjob.engines.kubernetes.errors import ApiError
from torchjob.engines.kubernetes.kinds import JOB_LABEL, Discovery, Found
from torchjob.engines.kubernetes.submit import delete_object


def delete_job(cluster: Cluster, discovery: Discovery, found: Found) -> list[str]:
    """Delete the job's object (its children go with it) and its claims, or, for bare pods, every
    object of the target's side kinds and the pods, by the job's label: what was deleted, as
    ``kind/name`` (pods by their label in one request, named when the server lists them)."""
    namespace, name = found.namespace, found.name
    removed: list[str] = []
    if found.kind is not None:
        path = namespaced_path(found.kind.api_version, found.kind.plural, namespace, name)
        delete_object(cluster, path, f"{found.kind.label} {name}")
        removed.append(f"{found.kind.kind.lower()}/{name}")
        # The controller's children go with it (owner references), so do the claims made for
        # its volumes; any claim without the reference goes by its label.
        for claim in claims.of_job(cluster, namespace, name):
            claim_name = str(claim["metadata"]["name"])
            if not claims.deleting(claim):
                delete_object(cluster, claims.claim_path(namespace, claim_name), f"claim {claim_name}")
                removed.append(f"{_singular(claims.PLURAL)}/{claim_name}")
        return removed
    from torchjob.targets import get_target

    for api_version, plural in get_target(found.target).side_kinds:
        if not discovery.has_version(api_version):
            continue
        for item in labelled(cluster, api_version, plural, namespace, name):
            item_name = str(item["metadata"]["name"])
            path = namespaced_path(api_version, plural, namespace, item_name)
            delete_object(cluster, path, f"{plural} {item_name}")
            removed.append(f"{_singular(plural)}/{item_name}")
    pods = cluster.json(  # one request for every pod of the job
        "DELETE",
        namespaced_path("v1", "pods", namespace),
        query={"labelSelector": f"{JOB_LABEL}={name}"},
        doing=f"delete the pods of job {name}",
    )
    removed += [f"pod/{p['metadata']['name']}" for p in pods.get("items") or []]
    return removed


def leftover_kinds() -> list[tuple[str, str]]:
    """Where a job without its object is looked for by its label: its pods, then what any target
    renders beside them; claims last (found alone, they may be a deleted job's, still in use)."""
    from torchjob.targets import all_targets

    kinds = [("v1", "pods")]
    for target in all_targets():
        kinds += [kind for kind in target.side_kinds if kind not in kinds and kind[1] != claims.PLURAL]
    return [*kinds, ("v1", claims.PLURAL)]


def labelled(
    cluster: Cluster, api_version: str, plural: str, namespace: str, job: str, *, one: bool = False
) -> list[dict[str, Any]]:
    """The objects of one kind labelled as the job's (at most one with ``one``); none where the
    cluster serves no such kind."""
    query = {"labelSelector": f"{JOB_LABEL}={job}", "limit": 1 if one else None}
    try:
        listing = cluster.json(
            "GET",
            namespaced_path(api_version, plural, namespace),
            query=query,
            doing=f"list the {plural} of job {job}",
        )
    except ApiError as err:
        if err.status == 404:
            return []
        raise
    return list(listing.get("items") or [])


def _singular(plural: str) -> str:
    """A resource's name as kubectl writes it before ``/NAME``: networkpolicies -> networkpolicy."""
    return plural[:-3] + "y" if plural.endswith("ies") else plural.removesuffix("s")


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
