"""A container's environment, resolved as a kubelet does it, for a local process.

``env`` and ``envFrom`` in order; ``valueFrom.fieldRef`` from the pod's own metadata and local
address, ``configMapKeyRef`` from the ConfigMaps of the expansion (the svc plugin's),
``resourceFieldRef`` from the container's resources (else this machine's); ``$(VAR)`` expanded in
values (and in ``command`` and ``args``, :mod:`.resolve`) as Kubernetes does. The engine's own
variables (``ENGINE_VARIABLES``) are reserved, and this process's environment is what containers
inherit, without the variables torch's launcher sets for its own workers.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping

from torchjob.engines.local.containers import PodSetup, ResolveError
from torchjob.spec.units import parse_quantity
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

_VAR_REF = re.compile(r"\$(\$|\(([A-Za-z_][A-Za-z0-9_.-]*)\))")
_FIELD_INDEX = re.compile(r"^metadata\.(labels|annotations)\['([^']*)'\]$")


# What the engine sets in every container for its bookkeeping (markers, directories, ports):
# reserved, so that a job can neither hide its processes nor mislead the engine's records.
ENGINE_VARIABLES = frozenset(
    {
        "TORCHJOB_JOB_ID", "TORCHJOB_POD_UID", "TORCHJOB_JOB_DIR", "TORCHJOB_POD_NAME", "TORCHJOB_POD_IP",
        "TORCHJOB_ATTEMPT", "TORCHJOB_RETRY_COUNT", "TORCHJOB_WAIT_INTERVAL", "TORCHJOB_BIN",
        "TORCHJOB_VOLCANO_DIR", "TORCHJOB_CONFIG_MOUNT", "TORCHJOB_JOB_UIDS", "TORCHJOB_FINISHED",
    }
)  # fmt: skip
ENGINE_PREFIXES = ("TORCHJOB_PORT_",)


# What torch's launcher (torchrun, torch.distributed.launch) sets for each of its workers: the
# worker's own rank. A job started from such a worker (an SDK call in a script torchrun runs)
# must not hand them to its pods: TORCHELASTIC_USE_AGENT_STORE=True alone makes every rank wait for
# a store that nobody serves. Dropped only when the caller is such a worker (TORCHELASTIC_RUN_ID).
_LAUNCHER_VARIABLES = frozenset(
    {
        "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
        "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    }
)  # fmt: skip


def inherited_env() -> dict[str, str]:
    """This process's environment as the containers inherit it (see _LAUNCHER_VARIABLES)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return dict(os.environ)
    return {
        k: v
        for k, v in os.environ.items()
        if k not in _LAUNCHER_VARIABLES and not k.startswith("TORCHELASTIC_")
    }


def is_engine_variable(name: str) -> bool:
    return name in ENGINE_VARIABLES or name.startswith(ENGINE_PREFIXES)


def expand_refs(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined names are replaced, ``$$`` is a literal ``$``."""

    def sub(match: re.Match[str]) -> str:
        if match.group(1) == "$":
            return "$"
        name = match.group(2)
        return env[name] if name in env else match.group(0)

    return _VAR_REF.sub(sub, text)


def _machine_resource(resource: str) -> float:
    if resource.endswith("cpu"):
        return float(os.cpu_count() or 1)
    if resource.endswith("memory"):
        import psutil

        return float(psutil.virtual_memory().total)
    if resource.endswith("ephemeral-storage"):
        import shutil

        return float(shutil.disk_usage("/").total)
    return 0.0


def _resource_value(container: dict[str, Any], ref: dict[str, Any], path: str) -> str:
    resource = str(ref.get("resource", ""))
    kind, _, name = resource.partition(".")
    if kind not in ("limits", "requests") or not name:
        raise ResolveError(path, f"resourceFieldRef resource {resource!r} is not limits.X or requests.X")
    values = (container.get("resources") or {}).get(kind) or {}
    if name in values:
        amount = parse_quantity(values[name])
    elif kind == "requests" and name in ((container.get("resources") or {}).get("limits") or {}):
        amount = parse_quantity(container["resources"]["limits"][name])
    else:
        amount = _machine_resource(name)
    divisor = parse_quantity(ref.get("divisor") or "1") or 1.0
    return str(math.ceil(amount / divisor - 1e-9))


def _field_value(ctx: PodSetup, field_path: str, path: str) -> str:
    meta = ctx.plan.manifest["metadata"]
    spec = ctx.plan.manifest["spec"]
    simple = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": ctx.uid,
        "spec.nodeName": os.uname().nodename,  # gethostname(), without importing socket
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": ctx.address,
        "status.podIPs": ctx.address,
        "status.hostIP": "127.0.0.1",
        "status.hostIPs": "127.0.0.1",
    }
    if field_path in simple:
        return str(simple[field_path])
    match = _FIELD_INDEX.match(field_path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise ResolveError(
        path,
        f"fieldRef {field_path!r} cannot be resolved (supported: {', '.join(simple)}, "
        "metadata.labels['KEY'], metadata.annotations['KEY'])",
    )


def _configmap_value(ctx: PodSetup, ref: dict[str, Any], path: str) -> str | None:
    name, key = str(ref.get("name", "")), str(ref.get("key", ""))
    data = ctx.configmaps.get(name)
    if data is None or key not in data:
        if ref.get("optional"):
            return None
        what = f"ConfigMap {name!r}" if data is None else f"key {key!r} of ConfigMap {name!r}"
        raise ResolveError(
            path,
            f"{what} does not exist locally (only the job's own ConfigMaps do: "
            f"{', '.join(ctx.configmaps) or 'none'}); mark it optional or set the value directly",
        )
    return data[key]


def env_from(
    ctx: PodSetup, container: dict[str, Any], env: dict[str, str], errors: list[ResolveError] | None = None
) -> None:
    """The variables of the container's ``envFrom`` sources, added to ``env``. A source that
    cannot be had here raises ResolveError; with ``errors``, each one is collected there instead
    and the sources after it are still read (the check tells them all at once)."""
    for i, source in enumerate(container.get("envFrom") or []):
        path = f"envFrom[{i}]"
        prefix = str(source.get("prefix") or "")
        problem = None
        if "configMapRef" in source:
            ref = source["configMapRef"] or {}
            data = ctx.configmaps.get(str(ref.get("name", "")))
            if data is not None:
                env.update({prefix + k: v for k, v in data.items()})
            elif not ref.get("optional"):
                problem = ResolveError(path, f"ConfigMap {ref.get('name')!r} does not exist locally")
        elif "secretRef" in source and not (source["secretRef"] or {}).get("optional"):
            problem = ResolveError(
                path,
                "Secrets are not available to local jobs; mark the secretRef optional "
                "and give its variables with run -e NAME=VALUE",
            )
        if problem is not None:
            if errors is None:
                raise problem
            errors.append(problem)


def env_value(
    ctx: PodSetup, container: dict[str, Any], var: dict[str, Any], env: Mapping[str, str], path: str
) -> str | None:
    if "valueFrom" not in var:
        return expand_refs(str(var.get("value", "")), env)
    source = var["valueFrom"] or {}
    if "fieldRef" in source:
        return _field_value(
            ctx, str((source["fieldRef"] or {}).get("fieldPath", "")), f"{path}.valueFrom.fieldRef"
        )
    if "configMapKeyRef" in source:
        return _configmap_value(ctx, source["configMapKeyRef"] or {}, f"{path}.valueFrom.configMapKeyRef")
    if "resourceFieldRef" in source:
        try:
            return _resource_value(container, source["resourceFieldRef"] or {}, f"{path}.valueFrom")
        except ValueError as err:
            raise ResolveError(f"{path}.valueFrom.resourceFieldRef", str(err)) from None
    if "secretKeyRef" in source:
        if (source["secretKeyRef"] or {}).get("optional"):
            return None
        raise ResolveError(
            f"{path}.valueFrom.secretKeyRef",
            f"Secrets are not available to local jobs; run -e {var.get('name')}=VALUE stands in for it "
            "(or mark it optional)",
        )
    raise ResolveError(f"{path}.valueFrom", "unsupported valueFrom source")
