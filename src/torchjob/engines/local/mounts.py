"""A container's volume mounts on this machine.

A ConfigMap volume is a directory of files in the job directory, an ``emptyDir`` a directory per
pod attempt, a ``hostPath`` the host path itself. Each mount path written in ``command``,
``args``, env values or ``workingDir`` is rewritten to its local directory (so
``/etc/volcano/worker.host`` works); programs that open such paths themselves should read
``$TORCHJOB_VOLCANO_DIR`` instead. A directory made from the job's data never lies outside the
engine's directory for it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from torchjob.engines.local import security
from torchjob.engines.local.containers import PodSetup, ResolveError
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any


def mount_dirs(ctx: PodSetup, container: dict[str, Any]) -> dict[str, str]:
    """mountPath -> local directory for each volume of the container that has one here.

    A ConfigMap or emptyDir volume, with its ``subPath``, must stay inside the engine's directory
    for it: a name such as ``../x`` is refused (ResolveError), never followed.
    """
    volumes = {str(v.get("name")): v for v in ctx.plan.manifest["spec"].get("volumes") or []}
    mounts: dict[str, str] = {}
    for i, mount in enumerate(container.get("volumeMounts") or []):
        volume = volumes.get(str(mount.get("name")))
        target = str(mount.get("mountPath", "")).rstrip("/")
        if volume is None or not target:
            continue
        local: Path | None = None
        base: Path | None = None
        if "configMap" in volume:
            base = ctx.configmap_dir
            local = base / str((volume["configMap"] or {}).get("name", ""))
        elif "emptyDir" in volume:
            base = ctx.pod_dir / "volumes"
            local = base / str(volume["name"])  # created when the pod starts
        elif "hostPath" in volume:
            local = Path(str((volume["hostPath"] or {}).get("path", "")))
        if local is None:
            continue
        sub_path = str(mount.get("subPath") or "")
        if sub_path:
            if sub_path.startswith("/") or ".." in Path(sub_path).parts:
                raise ResolveError(
                    f"volumeMounts[{i}].subPath",
                    f"{sub_path!r} must be a relative path without '..' (as Kubernetes requires)",
                )
            local = local / sub_path
        if base is not None and not inside(base, local):
            raise ResolveError(
                f"volumeMounts[{i}]",
                f"volume {mount.get('name')!r} would be at {local}, outside the job's directory {base}",
            )
        if str(local) != target:
            mounts[target] = str(local)
    return mounts


def inside(base: Path, path: Path) -> bool:
    """``path`` lies below ``base`` once both are resolved (``..`` and symlinks followed)."""
    root, resolved = base.resolve(), path.resolve()
    return resolved != root and resolved.is_relative_to(root)


def empty_dirs(ctx: PodSetup) -> list[Path]:
    """The pod attempt's emptyDir directories; ResolveError for a name that would lead outside."""
    base = ctx.pod_dir / "volumes"
    found = []
    for volume in ctx.plan.manifest["spec"].get("volumes") or []:
        if "emptyDir" in volume:
            path = base / str(volume["name"])
            if not inside(base, path) or path.parent != base:
                raise ResolveError(
                    "volumes", f"emptyDir {volume['name']!r} would be at {path}, outside the pod's directory"
                )
            found.append(path)
    return found


def make_empty_dirs(ctx: PodSetup) -> None:
    """The pod's emptyDir volumes, and each working directory inside one (a runtime makes a missing
    working directory; only one in the pod's own volumes is made here, never a host path)."""
    from torchjob.engines.local.state import make_private_dirs

    spec = ctx.plan.manifest["spec"]
    owner = security.volume_owner(spec)
    made = empty_dirs(ctx)
    for path in made:
        make_private_dirs(path)
    root = ctx.pod_dir / "volumes"
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if container.get("workingDir"):
            cwd = rewrite_paths(str(container["workingDir"]), mount_dirs(ctx, container))
            local = Path(os.path.normpath(cwd))
            # Made before any container of this attempt runs, so no symlink of theirs is followed.
            if local.is_relative_to(os.path.normpath(root)) and not local.exists():
                make_private_dirs(local)
                made.append(local)
    if owner is not None:  # the pod runs as another user: its volumes are its own
        for path in made:
            os.chown(path, owner[0], owner[1])
            os.chmod(path, owner[2])


def rewrite_paths(text: str, mounts: Mapping[str, str]) -> str:
    for target, local in mounts.items():
        # A plain replacement string would interpret backslashes in the local path.
        text = re.sub(re.escape(target) + r"(?=/|$|[^\w.-])", _constant(local), text)
    return text


def _constant(value: str) -> Callable[[re.Match[str]], str]:
    return lambda _match: value
