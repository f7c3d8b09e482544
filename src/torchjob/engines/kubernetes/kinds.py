"""The kind each target creates on top, and API discovery: what this cluster can be sent."""

from __future__ import annotations

from typing import Any

from torchjob.engine_api.base import EngineError
from torchjob.engines.kubernetes.client import Cluster
from torchjob.engines.kubernetes.errors import ApiError
from torchjob.records import field, record
from torchjob.targets import JOB_LABEL, target_names  # JOB_LABEL: on every object the targets render

__all__ = ["JOB_LABEL", "Discovery", "Found", "Kind", "top_kinds"]


@record(frozen=True)
class Kind:
    target: str
    api_version: str  # group/version, or v1 for the core API
    kind: str
    plural: str
    install: str  # what a cluster admin installs to get it

    @property
    def label(self) -> str:
        return f"{self.api_version} {self.kind}"


@record
class Found:
    """A job on the cluster: its name, namespace, target and top-level object (None for `pods`)."""

    name: str
    namespace: str
    target: str
    kind: Kind | None = None
    top: dict[str, Any] | None = None
    deleting: bool = False  # what was found is being deleted already (it goes by itself)
    leftover: bool = False  # neither its object nor a pod was found: only objects it left
    # What was found of such a job, as (plural, object); as few as finding it took (see finding.left_of)
    left: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def top_kinds() -> dict[str, Kind]:
    """The top-level object of each target whose controller runs the job (as each target declares
    it), in the order a job without --target goes to them; `pods` has none."""
    from torchjob.targets import all_targets

    ordered = sorted((t for t in all_targets() if t.top is not None), key=lambda t: t.preference)
    return {
        t.name: Kind(t.name, t.top.api_version, t.top.kind, t.top.plural, t.top.install)
        for t in ordered
        if t.top is not None
    }


class Discovery:
    """The cluster's API groups and resources, each read once (one request per group version)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._versions: set[str] | None = None
        self._resources: dict[str, dict[str, dict[str, Any]]] = {}

    def group_versions(self) -> set[str]:
        if self._versions is None:
            groups = self.cluster.json("GET", "/apis", doing="list the cluster's API groups")
            self._versions = {"v1"} | {
                str(v.get("groupVersion"))
                for g in groups.get("groups") or []
                for v in g.get("versions") or []
            }
        return self._versions

    def resources(self, api_version: str) -> dict[str, dict[str, Any]]:
        """Kind -> its APIResource ({name, namespaced, verbs, ...}); {} when the group version is absent."""
        if api_version not in self._resources:
            path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            try:
                listing = self.cluster.json("GET", path, doing=f"discover {api_version}")
            except ApiError as err:
                if err.status != 404:
                    raise
                listing = {}
            self._resources[api_version] = {
                str(r["kind"]): r for r in listing.get("resources") or [] if "/" not in str(r.get("name", ""))
            }
        return self._resources[api_version]

    def has(self, kind: Kind) -> bool:
        if kind.api_version != "v1" and kind.api_version not in self.group_versions():
            return False
        return kind.kind in self.resources(kind.api_version)

    def has_version(self, api_version: str) -> bool:
        return api_version == "v1" or api_version in self.group_versions()

    def available_targets(self) -> list[str]:
        return [name for name, kind in top_kinds().items() if self.has(kind)]

    def choose_target(self, wanted: str | None) -> str:
        """The target named (if the cluster has its kind), else the first the cluster has."""
        kinds = top_kinds()
        if wanted and wanted not in kinds and wanted in target_names():
            return wanted  # bare pods: no kind to look for
        if wanted:
            kind = kinds.get(wanted)
            if kind is None:
                names = ", ".join((*kinds, *(t for t in target_names() if t not in kinds)))
                raise EngineError(f"--target: no target {wanted!r} (targets: {names})")
            if not self.has(kind):
                others = [t for t in self.available_targets() if t != wanted] or ["pods"]
                raise EngineError(
                    f"this cluster has no {kind.label}: {kind.install} or use --target {others[0]}"
                )
            return wanted
        available = self.available_targets()
        if not available:
            labels = ", ".join(kind.label for kind in kinds.values())
            installs = [kind.install.removeprefix("install ") for kind in kinds.values()]
            either = ", ".join(installs[:-1]) + " or " + installs[-1] if len(installs) > 1 else installs[0]
            raise EngineError(f"this cluster has none of {labels}: install {either}, or use --target pods")
        return available[0]

    def plural(self, api_version: str, kind: str, what: str) -> str:
        resource = self.resources(api_version).get(kind)
        if resource is None:
            raise EngineError(f"this cluster has no {api_version} {kind} (needed for {what})")
        return str(resource["name"])
