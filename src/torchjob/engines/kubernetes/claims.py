"""The PersistentVolumeClaims torchjob creates for a job's ``volumes``: they go with the job.

Volcano's controller makes the claims of its own Jobs and gives them an owner reference, so they
go with the Job. torchjob makes them for the other targets, before the job's object (so the pods
find them), then gives each an owner reference to that object: whoever deletes the job (``delete``,
``--replace``, a TTL, kubectl) the garbage collector deletes its claims, once no pod uses them (the
claim protection finalizer). Claims keep the job's label, so ``delete`` also removes any that
lack the reference (the pods target, which has no object of its own, or a reference that could
not be given), and a job whose claims are still being deleted is found, and waited for, before
the same job is created again.
"""

from __future__ import annotations

from typing import Any

from torchjob.engine_api.base import EngineError
from torchjob.engines.kubernetes.client import Cluster, namespaced_path
from torchjob.engines.kubernetes.kinds import JOB_LABEL, Kind

KIND = "PersistentVolumeClaim"
PLURAL = "persistentvolumeclaims"


def claim_path(namespace: str, name: str | None = None) -> str:
    return namespaced_path("v1", PLURAL, namespace, name)


def give_to_job(cluster: Cluster, made: list[dict[str, Any]], kind: Kind | None) -> list[str]:
    """Make each claim in ``made`` owned by the job's object in it; a note for each that could not
    be (it is still deleted with the job by torchjob, by its label)."""
    top = next(
        (
            o
            for o in made
            if kind is not None and (o.get("apiVersion"), o.get("kind")) == (kind.api_version, kind.kind)
        ),
        None,
    )
    if top is None or kind is None:
        return []
    meta = top["metadata"]
    owner = {"apiVersion": kind.api_version, "kind": kind.kind, "name": meta["name"], "uid": meta["uid"]}
    notes: list[str] = []
    for claim in made:
        if claim.get("kind") != KIND:
            continue
        name, namespace = str(claim["metadata"]["name"]), str(claim["metadata"]["namespace"])
        try:
            cluster.json(
                "PATCH",
                claim_path(namespace, name),
                body={"metadata": {"ownerReferences": [owner]}},
                content_type="application/merge-patch+json",
                doing=f"give claim {name} to {kind.label} {meta['name']}",
            )
        except EngineError as err:
            notes.append(f"warning: {err}; `torchjob delete {meta['name']}` still deletes the claim")
    return notes


def of_job(cluster: Cluster, namespace: str, job: str) -> list[dict[str, Any]]:
    listing = cluster.json(
        "GET",
        claim_path(namespace),
        query={"labelSelector": f"{JOB_LABEL}={job}"},
        doing=f"list the claims of job {job}",
    )
    return list(listing.get("items") or [])


def deleting(obj: dict[str, Any]) -> bool:
    """Being deleted: it goes once its finalizers are done (a claim: once no pod uses it)."""
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))
