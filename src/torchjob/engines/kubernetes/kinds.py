"""The kind each target creates on top, and API discovery: what this cluster can be sent."""

from __future__ import annotations

from typing import Any

from torchjob.engines.base import EngineError
from torchjob.engines.kubernetes.client import Cluster
from torchjob.engines.kubernetes.errors import ApiError
from torchjob.records import record
from torchjob.targets import JOB_LABEL  # on every object and pod template the targets render

__all__ = ["JOB_LABEL", "PREFERENCE", "SIDE_KINDS", "TOP_KINDS", "Discovery", "Kind"]


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


# The top-level object of each target whose controller runs the job; `pods` has none.
TOP_KINDS: dict[str, Kind] = {
    "volcano": Kind("volcano", "batch.volcano.sh/v1alpha1", "Job", "jobs", "install Volcano"),
    "kubeflow": Kind(
        "kubeflow", "kubeflow.org/v1", "PyTorchJob", "pytorchjobs", "install the Kubeflow training operator"
    ),
    "jobset": Kind("jobset", "jobset.x-k8s.io/v1alpha2", "JobSet", "jobsets", "install JobSet"),
    "trainjob": Kind(
        "trainjob", "trainer.kubeflow.org/v1alpha1", "TrainJob", "trainjobs", "install Kubeflow Trainer"
    ),
}
# Without --target: the first of these the cluster has. Volcano runs the job as written; a
# PyTorchJob keeps master and workers apart; JobSet needs only its controller; a TrainJob can
# express the fewest jobs (one image and command for every node).
PREFERENCE = ("volcano", "kubeflow", "jobset", "trainjob")
# Objects the `pods` target renders beside its pods, deleted with the job.
SIDE_KINDS = (
    ("v1", "configmaps"),
    ("v1", "services"),
    ("networking.k8s.io/v1", "networkpolicies"),
    ("scheduling.volcano.sh/v1beta1", "podgroups"),
)


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
        return [t for t in PREFERENCE if self.has(TOP_KINDS[t])]

    def choose_target(self, wanted: str | None) -> str:
        """The target named (if the cluster has its kind), else the first the cluster has."""
        if wanted == "pods":
            return wanted
        if wanted:
            kind = TOP_KINDS.get(wanted)
            if kind is None:
                names = ", ".join((*PREFERENCE, "pods"))
                raise EngineError(f"--target: no target {wanted!r} (targets: {names})")
            if not self.has(kind):
                others = [t for t in self.available_targets() if t != wanted] or ["pods"]
                raise EngineError(
                    f"this cluster has no {kind.label}: {kind.install} or use --target {others[0]}"
                )
            return wanted
        available = self.available_targets()
        if not available:
            kinds = ", ".join(TOP_KINDS[t].label for t in PREFERENCE)
            raise EngineError(
                f"this cluster has none of {kinds}: install Volcano, the Kubeflow training operator, "
                "JobSet or Kubeflow Trainer, or use --target pods"
            )
        return available[0]

    def plural(self, api_version: str, kind: str, what: str) -> str:
        resource = self.resources(api_version).get(kind)
        if resource is None:
            raise EngineError(f"this cluster has no {api_version} {kind} (needed for {what})")
        return str(resource["name"])
