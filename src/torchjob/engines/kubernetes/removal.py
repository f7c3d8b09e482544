"""Deleting a job from the cluster: all its objects, and, where torchjob cannot wait for ever, within
a bound as a whole (the delete after ``--timeout``, ``--replace``'s delete of the old job)."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

from torchjob.engine_api.base import EngineError, Interrupted
from torchjob.engines.kubernetes import bounded, claims, finding
from torchjob.engines.kubernetes.client import Cluster, namespaced_path
from torchjob.engines.kubernetes.errors import ApiError
from torchjob.engines.kubernetes.kinds import JOB_LABEL, Discovery, Found
from torchjob.engines.kubernetes.phase import timestamp
from torchjob.engines.kubernetes.submit import delete_object

GONE_TIMEOUT = 120.0  # how long --replace deletes the old job and waits for it to go, as a whole
# A job being submitted has its claims (for the `pods` target also its ConfigMap, Service, ...)
# made before its object or first pod (submit.create_all, in order): for that moment they look
# like leftovers. prune leaves leftovers until the newest is older than this: longer than one
# create can take (client.py: 5 tries of at most 80 s, 30 s waits between them: 520 s), with a
# margin. Ages are measured on the API server's clock (Cluster.now), as its creation times are.
SETTLE_AGE = 600.0


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
                removed.append(f"{finding.singular(claims.PLURAL)}/{claim_name}")
        return removed
    from torchjob.targets import get_target

    for api_version, plural in get_target(found.target).side_kinds:
        if not discovery.has_version(api_version):
            continue
        for item in finding.labelled(cluster, api_version, plural, namespace, name):
            item_name = str(item["metadata"]["name"])
            path = namespaced_path(api_version, plural, namespace, item_name)
            delete_object(cluster, path, f"{plural} {item_name}")
            removed.append(f"{finding.singular(plural)}/{item_name}")
    pods = cluster.json(  # one request for every pod of the job
        "DELETE",
        namespaced_path("v1", "pods", namespace),
        query={"labelSelector": f"{JOB_LABEL}={name}"},
        doing=f"delete the pods of job {name}",
    )
    removed += [f"pod/{p['metadata']['name']}" for p in pods.get("items") or []]
    return removed


def left_age(found: Found, now: float) -> float:
    """Seconds since the newest of what a leftover-only job left was made (0 when not known)."""
    made = [timestamp((item.get("metadata") or {}).get("creationTimestamp")) for _, item in found.left]
    return 0.0 if not made or None in made else now - max(t for t in made if t is not None)


def too_new(found: Found, age: float) -> str:
    """Why prune keeps leftovers made a moment ago, and how to remove them all the same."""
    return (
        f"kept {found.ref}: only leftovers, the newest made {max(age, 0.0):.0f}s ago (under "
        f"{SETTLE_AGE:g}s: a job being submitted may still be making its objects); if it is not, "
        f"remove them with: {bounded.remove_command(found.ref)}"
    )


def delete_left(cluster: Cluster, found: Found) -> tuple[list[str], list[str]]:
    """Delete the very objects a leftover-only job was found with, as ``(removed, kept)`` by
    ``kind/name``. Never its pods nor anything else by its label, and each object only while it is
    the one found (its uid): one made again under its name since (a new submission) is kept."""
    versions = {plural: api_version for api_version, plural in finding.leftover_kinds()}
    removed: list[str] = []
    kept: list[str] = []
    for plural, item in found.left:
        meta = item["metadata"]
        what = f"{finding.singular(plural)}/{meta['name']}"
        if claims.deleting(item):
            continue  # going already
        path = namespaced_path(versions[plural], plural, found.namespace, str(meta["name"]))
        try:
            delete_object(cluster, path, what, uid=meta.get("uid"))
        except ApiError as err:
            if err.status != 409:
                raise
            kept.append(what)
            continue
        removed.append(what)
    return removed, kept


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


def clear_way(
    cluster: Cluster, discovery: Discovery, existing: Found, replacing: bool, note: Callable[[str], None]
) -> None:
    """A job of the same name is there: wait for one being deleted to go, or delete it
    (--replace) and wait, within GONE_TIMEOUT as a whole; else refuse."""
    job, namespace = existing.name, existing.namespace
    if existing.deleting:  # a job deleted a moment ago: its claims wait for its pods to go
        note(f"job {job} is still being deleted in namespace {namespace}; waiting for it to go")
    elif not replacing:
        raise EngineError(
            f"job {job} already exists in namespace {namespace} (target {existing.target}); "
            "use --replace to delete it and submit again"
        )
    deadline = time.monotonic() + GONE_TIMEOUT
    try:
        if not existing.deleting and not delete_within(cluster, discovery, existing, GONE_TIMEOUT):
            raise _still_there(existing, "its delete had no answer")
        while time.monotonic() < deadline:
            lookup = bounded.Background(
                lambda: finding.find(cluster, discovery, job, namespace), name="torchjob-find"
            )
            if not lookup.wait(bounded.left_of(deadline)):
                break
            if lookup.outcome() is None:
                return
            time.sleep(min(0.5, bounded.left_of(deadline)))
    except KeyboardInterrupt:
        if existing.deleting:
            raise  # someone else's delete: it goes on by itself
        note(
            f"interrupted while replacing job {existing.ref}; nothing new was created; "
            f"{what_is_left(existing)} may remain, deleted in part: remove them with "
            f"{bounded.remove_command(existing.ref)}"
        )
        raise Interrupted from None
    raise _still_there(existing, "it was deleted but is still there")


def _still_there(existing: Found, why: str) -> EngineError:
    return EngineError(
        f"job {existing.name} is in the way of the new one: {why} after {GONE_TIMEOUT:g}s; nothing "
        f"new was created; {what_is_left(existing)} may remain: remove them with "
        f"{bounded.remove_command(existing.ref)}, then submit again"
    )


def delete_after_timeout(
    cluster: Cluster, discovery: Discovery, found: Found, note: Callable[[str], None]
) -> str:
    """The job that outlived --timeout deleted, within CLEANUP_TIMEOUT: how that went, said."""
    seconds = bounded.CLEANUP_TIMEOUT
    left = f"{what_is_left(found)} may remain: remove them with "
    left += bounded.remove_command(found.ref)
    try:
        if delete_within(cluster, discovery, found, seconds):
            return "deleted"
    except KeyboardInterrupt:
        note(f"interrupted while deleting job {found.ref} after its timeout; {left}")
        raise Interrupted from None
    return f"its delete had no answer within {seconds:g}s; {left}"


def left_removed(ref: str, removed: list[str]) -> str:
    """What was removed of a job of which no pod was left: said, as it was not the job itself."""
    return f"job {ref} had no pods left; removed {', '.join(removed)}"


@contextlib.contextmanager
def telling_interrupts(note: Callable[[str], None], deleted: list[str], refs: list[str]) -> Iterator[None]:
    """Around the removal of the jobs ``refs``: a Ctrl-C says which were deleted (``deleted``, as
    it is filled on the way) and which not (:func:`interrupted_delete`), then stops the command."""
    try:
        yield
    except KeyboardInterrupt:
        note(interrupted_delete(deleted, refs))
        raise Interrupted from None


def interrupted_delete(deleted: list[str], refs: list[str]) -> str:
    """What an interrupted ``delete`` did: the jobs deleted, and those not (the one under way may
    be deleted in part), with the command that deletes the rest."""
    rest = [ref for ref in refs if ref not in deleted]
    done = f"deleted {', '.join(deleted)}; " if deleted else ""
    return (
        f"interrupted; {done}not deleted (or only in part): {', '.join(rest)}; delete "
        f"{'it' if len(rest) == 1 else 'them'} with: {bounded.remove_command(*rest)}"
    )
