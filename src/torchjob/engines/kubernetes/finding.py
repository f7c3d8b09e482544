"""Finding a job on the cluster by its name: its top-level object of any target, else, by the
job's label, its pods or what it left (a `pods` job's side objects, claims)."""

from __future__ import annotations

from typing import Any

from torchjob.engine_api.base import JobNotFound
from torchjob.engines.kubernetes import bounded, claims
from torchjob.engines.kubernetes.client import Cluster, list_labelled, namespaced_path
from torchjob.engines.kubernetes.errors import ApiError
from torchjob.engines.kubernetes.kinds import JOB_LABEL, Discovery, Found, top_kinds


def find(cluster: Cluster, discovery: Discovery, name: str, namespace: str) -> Found | None:
    """The job called ``name``: its top-level object of any target, else its bare pods."""
    candidates: list[Found] = []
    kinds = top_kinds()
    for target in discovery.available_targets():
        kind = kinds[target]
        path = namespaced_path(kind.api_version, kind.plural, namespace, name)
        try:
            top = cluster.json("GET", path, doing=f"get {kind.label} {name}")
        except ApiError as err:
            if err.status == 404:
                continue
            raise
        if JOB_LABEL in ((top.get("metadata") or {}).get("labels") or {}):
            candidates.append(Found(name, namespace, target, kind, top))
    if candidates:  # a TrainJob's JobSet may carry the label too: its owner is the job
        found = next((c for c in candidates if not owned(c.top or {})), candidates[0])
        found.deleting = claims.deleting(found.top or {})
        return found
    # Bare pods; what is left of a job whose pods are gone (a `pods` job's creation or delete
    # cut short, an object a controller left behind); a job's claims still being deleted
    # (they wait for its pods): found, so that `delete` and `--replace` remove what is left,
    # and a new submission waits for it to go.
    for api_version, plural in leftover_kinds():
        if not discovery.has_version(api_version):
            continue
        # every claim: one may be in use by a deleted job's pod, another not
        one = plural != claims.PLURAL
        items = labelled(cluster, api_version, plural, namespace, name, one=one)
        if items:
            return Found(
                name,
                namespace,
                "pods",
                deleting=all(claims.deleting(i) for i in items),
                leftover=plural != "pods",
                left=[(plural, i) for i in items] if plural != "pods" else [],
            )
    return None


def left_of(
    cluster: Cluster, discovery: Discovery, name: str, namespace: str
) -> list[tuple[str, dict[str, Any]]]:
    """Every object a job whose object and pods are gone left, as (plural, object): what
    ``status`` names (``find`` stops at the first)."""
    return [
        (plural, item)
        for api_version, plural in leftover_kinds()[1:]  # not the pods: there are none
        if discovery.has_version(api_version)
        for item in labelled(cluster, api_version, plural, namespace, name)
    ]


def resolve(cluster: Cluster, discovery: Discovery, ref: str, namespace: str) -> Found:
    """The job ``ref`` names (``[NAMESPACE/]NAME``, ``namespace`` when it names none); JobNotFound else."""
    where, _, name = ref.rpartition("/")
    where = where or namespace
    found = find(cluster, discovery, name, where)
    if found is None:
        raise not_found(cluster, ref, name, where)
    return found


def not_found(cluster: Cluster, ref: str, name: str, namespace: str) -> JobNotFound:
    context = f" of context {cluster.context}" if cluster.context else ""
    return JobNotFound(f"no job {name!r} in namespace {namespace}{context}", ref)


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
    path = namespaced_path(api_version, plural, namespace)
    try:
        return list_labelled(
            cluster, path, f"{JOB_LABEL}={job}", f"list the {plural} of job {job}", limit=1 if one else None
        )
    except ApiError as err:
        if err.status == 404:
            return []
        raise


def owned(obj: dict[str, Any]) -> bool:
    """Made by a controller (a TrainJob's JobSet, a Job's pod): not a job of its own."""
    return any(ref.get("controller") for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


def every_job(cluster: Cluster, discovery: Discovery, namespace: str) -> list[tuple[Found, dict[str, Any]]]:
    """Every job in ``namespace`` with its pods by name: each top-level object of the cluster's
    targets that no controller owns, the bare pods of the jobs that have none, and the jobs of
    which only what they left remains (as ``delete NAME`` finds them)."""
    by_job: dict[str, dict[str, dict[str, Any]]] = {}
    for pod in list_labelled(cluster, namespaced_path("v1", "pods", namespace), JOB_LABEL):
        label = str(pod["metadata"]["labels"][JOB_LABEL])
        by_job.setdefault(label, {})[str(pod["metadata"]["name"])] = pod
    jobs: list[tuple[Found, dict[str, Any]]] = []
    kinds = top_kinds()
    for target in discovery.available_targets():
        kind = kinds[target]
        path = namespaced_path(kind.api_version, kind.plural, namespace)
        for top in list_labelled(cluster, path, JOB_LABEL):
            if not owned(top):
                name = str(top["metadata"]["name"])
                jobs.append((Found(name, namespace, target, kind, top), by_job.pop(name, {})))
    for name, pods in by_job.items():
        if not any(owned(p) for p in pods.values()):
            jobs.append((Found(name, namespace, "pods"), pods))
    named = {found.name for found, _ in jobs} | set(by_job)
    jobs += [(found, {}) for found in _left_behind(cluster, discovery, namespace) if found.name not in named]
    return jobs


def _left_behind(cluster: Cluster, discovery: Discovery, namespace: str) -> list[Found]:
    """A job for each name the objects labelled as a job's beside its pods carry (Services,
    ConfigMaps, NetworkPolicies, PodGroups, claims): those of jobs with no object nor pod left."""
    left: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for api_version, plural in leftover_kinds()[1:]:  # the pods were listed already
        if not discovery.has_version(api_version):
            continue
        try:
            items = list_labelled(cluster, namespaced_path(api_version, plural, namespace), JOB_LABEL)
        except ApiError as err:
            # Not served here, or not ours to list (RBAC): the listing of the jobs goes on without
            # these, as it did before leftovers were listed; `delete NAME` still finds them.
            if err.status in (403, 404):
                continue
            raise
        for item in items:
            label = str((item.get("metadata") or {}).get("labels", {}).get(JOB_LABEL, ""))
            if label:
                left.setdefault(label, []).append((plural, item))
    return [
        Found(
            name,
            namespace,
            "pods",
            deleting=all(claims.deleting(item) for _, item in items),
            leftover=True,
            left=items,
        )
        for name, items in left.items()
    ]


def singular(plural: str) -> str:
    """A resource's name as kubectl writes it before ``/NAME``: networkpolicies -> networkpolicy."""
    return plural[:-3] + "y" if plural.endswith("ies") else plural.removesuffix("s")


def left_names(found: Found) -> list[str]:
    """What a job of which only what it left was found left, as ``kind/name``."""
    return [f"{singular(plural)}/{item['metadata']['name']}" for plural, item in found.left]


def what_remains(found: Found) -> str:
    """Why a job of which only what it left was found is shown, and how to remove that."""
    names = ", ".join(left_names(found))
    if found.deleting:  # claims that wait for a deleted job's last pod: they go by themselves
        return f"its object and pods are gone; what it left is being deleted: {names}"
    return (
        f"its object and pods are gone; only what it left remains: {names}; "
        f"remove {'it' if len(found.left) == 1 else 'them'} with: {bounded.remove_command(found.ref)}"
    )
