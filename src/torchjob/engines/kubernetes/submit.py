"""Creating a rendered job on the cluster: every object, in order, or none of them."""

from __future__ import annotations

import contextlib
from typing import Any

from torchjob.engines.base import EngineError
from torchjob.engines.kubernetes.client import Cluster, namespaced_path
from torchjob.engines.kubernetes.errors import ApiError
from torchjob.engines.kubernetes.kinds import Discovery


def object_path(discovery: Discovery, obj: dict[str, Any], namespace: str, name: str | None = None) -> str:
    api_version, kind = str(obj.get("apiVersion", "")), str(obj.get("kind", ""))
    plural = discovery.plural(api_version, kind, f"{kind} {obj.get('metadata', {}).get('name', '')}")
    return namespaced_path(api_version, plural, namespace, name)


def create_all(cluster: Cluster, discovery: Discovery, objects: list[dict[str, Any]], namespace: str) -> None:
    """Create ``objects`` in order; when one is refused, delete the ones already made and raise."""
    paths = [object_path(discovery, obj, namespace) for obj in objects]  # every kind known first
    created: list[str] = []
    try:
        for obj, path in zip(objects, paths, strict=True):
            name = str(obj["metadata"]["name"])
            what = f"create {obj.get('apiVersion')} {obj.get('kind')} {name}"
            cluster.json("POST", path, body=obj, doing=what)
            created.append(f"{path}/{name}")
    except EngineError:
        for path in reversed(created):
            with contextlib.suppress(EngineError):
                cluster.json(
                    "DELETE", path, query={"propagationPolicy": "Background"}, doing=f"delete {path}"
                )
        raise


def delete_object(cluster: Cluster, path: str, what: str) -> bool:
    """Delete one object (its children in the background); False when it was already gone."""
    try:
        cluster.json("DELETE", path, query={"propagationPolicy": "Background"}, doing=f"delete {what}")
    except ApiError as err:
        if err.status == 404:
            return False
        raise
    return True
