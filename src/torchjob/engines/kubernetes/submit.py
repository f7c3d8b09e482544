"""Creating a rendered job on the cluster: every object, in order, or none of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchjob.engine_api.base import EngineError
from torchjob.engines.kubernetes.client import Cluster, namespaced_path
from torchjob.engines.kubernetes.errors import ApiError
from torchjob.engines.kubernetes.kinds import JOB_LABEL, Discovery


def object_path(discovery: Discovery, obj: dict[str, Any], namespace: str, name: str | None = None) -> str:
    api_version, kind = str(obj.get("apiVersion", "")), str(obj.get("kind", ""))
    plural = discovery.plural(api_version, kind, f"{kind} {obj.get('metadata', {}).get('name', '')}")
    return namespaced_path(api_version, plural, namespace, name)


def create_all(
    cluster: Cluster,
    discovery: Discovery,
    objects: list[dict[str, Any]],
    namespace: str,
    say: Callable[[str], None] | None = None,
) -> None:
    """Create ``objects`` in order; when one is refused, or Ctrl-C/SIGTERM comes (KeyboardInterrupt),
    delete the ones already made and raise. ``say`` tells of an interrupt what it left behind."""
    paths = [object_path(discovery, obj, namespace) for obj in objects]  # every kind known first
    created: list[str] = []
    try:
        for obj, path in zip(objects, paths, strict=True):
            name = str(obj["metadata"]["name"])
            what = f"create {obj.get('apiVersion')} {obj.get('kind')} {name}"
            # Counted before it is asked for: an interrupted or timed-out request may have made it.
            created.append(f"{path}/{name}")
            cluster.json("POST", path, body=obj, doing=what)
    except BaseException as err:
        if isinstance(err, ApiError) and 400 <= err.status < 500:
            created.pop()  # refused (409: someone else's object of that name): not ours to delete
        left = _undo(cluster, created)
        if say is not None and not isinstance(err, Exception):
            if left:
                say(
                    "interrupted while creating the job's objects; not deleted (each carries the label "
                    f"{JOB_LABEL}): {', '.join(left)}"
                )
            else:
                say("interrupted while creating the job's objects; those already created were deleted")
        raise


def _undo(cluster: Cluster, paths: list[str]) -> list[str]:
    """Delete ``paths``, newest first: those that may remain (a delete failed, or a second Ctrl-C)."""
    todo = list(reversed(paths))
    left: list[str] = []
    try:
        while todo:
            path = todo[0]
            try:
                delete_object(cluster, path, path)
            except EngineError:
                left.append(path)
            todo.pop(0)
    except KeyboardInterrupt:  # again: stop cleaning up
        left += todo
    return left


def delete_object(cluster: Cluster, path: str, what: str) -> bool:
    """Delete one object (its children in the background); False when it was already gone."""
    try:
        cluster.json("DELETE", path, query={"propagationPolicy": "Background"}, doing=f"delete {what}")
    except ApiError as err:
        if err.status == 404:
            return False
        raise
    return True
