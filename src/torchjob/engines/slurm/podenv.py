"""A pod's environment on Slurm, resolved as a kubelet resolves it (pure).

``env`` values with ``$(VAR)`` expanded against what came before, ``configMapKeyRef`` to the job's
own ConfigMaps (the svc plugin's host lists), ``fieldRef`` (pod name, namespace, labels,
annotations; node name and pod IP are the node's host name); other sources are a PlanError
naming the field.
"""

from __future__ import annotations

import re

from torchjob.engines.slurm.errors import PlanError
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from torchjob.expand import DesiredState


def configmaps_of(state: DesiredState) -> dict[str, dict[str, str]]:
    return {
        str(obj["metadata"]["name"]): {str(k): str(v) for k, v in (obj.get("data") or {}).items()}
        for obj in state.objects
        if obj.get("kind") == "ConfigMap"
    }


_VAR_REF = r"\$(\$|\(([A-Za-z_][A-Za-z0-9_.-]*)\))"
_FIELD_INDEX = r"^metadata\.(labels|annotations)\['([^']*)'\]$"  # compiled when a pod asks for one


def expand_refs(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined names are replaced, ``$$`` is a literal ``$``."""

    def sub(match: re.Match[str]) -> str:
        if match.group(1) == "$":
            return "$"
        name = match.group(2)
        return env[name] if name in env else match.group(0)

    return re.sub(_VAR_REF, sub, str(text))


def container_env(
    container: dict[str, Any],
    manifest: dict[str, Any],
    host: str,
    configmaps: Mapping[str, Mapping[str, str]],
    engine_env: Mapping[str, str],
    where: str,
) -> dict[str, str]:
    """A container's environment: the engine's variables, then its ``env`` in order, each value
    with ``$(VAR)`` expanded against what came before, as a kubelet does."""
    env = dict(engine_env)
    meta = manifest["metadata"]
    fields = {
        "metadata.name": str(meta.get("name", "")),
        "metadata.namespace": str(meta.get("namespace", "default")),
        "spec.nodeName": host,
        "status.podIP": host,
        "status.hostIP": host,
    }
    for i, entry in enumerate(container.get("env") or []):
        name = str(entry.get("name", ""))
        path = f"{where}.env[{i}]"
        if "value" in entry or "valueFrom" not in entry:
            env[name] = expand_refs(str(entry.get("value", "")), env)
            continue
        source = entry["valueFrom"] or {}
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"] or {}
            data = configmaps.get(str(ref.get("name", ""))) or {}
            key = str(ref.get("key", ""))
            if key in data:
                env[name] = data[key]
            elif not ref.get("optional"):
                raise PlanError(
                    path, f"ConfigMap key {ref.get('name')!r}/{key!r} is not one of the job's own"
                )
        elif "fieldRef" in source:
            field_path = str((source["fieldRef"] or {}).get("fieldPath", ""))
            match = re.match(_FIELD_INDEX, field_path)
            if field_path in fields:
                env[name] = fields[field_path]
            elif match:
                env[name] = str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
            else:
                raise PlanError(path, f"fieldRef {field_path!r} is not supported on Slurm")
        else:
            raise PlanError(path, f"valueFrom {', '.join(source) or '(empty)'} is not supported on Slurm")
    return env
