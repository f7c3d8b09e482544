"""The claim protection controller (kube-controller-manager ``pkg/controller/volume/pvcprotection``).

Every claim carries the ``kubernetes.io/pvc-protection`` finalizer (the admission plugin puts it
there, kubeadmission.py), so deleting a claim only marks it. This controller removes the finalizer,
and the claim goes, once no pod that has not ended uses it (``podUsesPVC``: a pod volume whose
``persistentVolumeClaim.claimName`` is the claim). Until then the claim is ``Terminating`` and its
name stays taken: a new claim of that name is refused as already existing.
"""

from __future__ import annotations

from typing import Any

from controllers import Controller, all_of, pod_phase, update
from kubeadmission import PVC_PROTECTION


def claims_of(pod: dict[str, Any]) -> set[str]:
    return {
        str(v["persistentVolumeClaim"]["claimName"])
        for v in (pod.get("spec") or {}).get("volumes") or []
        if v.get("persistentVolumeClaim")
    }


class ClaimProtection(Controller):
    def reconcile(self) -> None:
        deleting = [
            c
            for c in all_of(self.api, "v1", "PersistentVolumeClaim")
            if c["metadata"].get("deletionTimestamp")
        ]
        if not deleting:
            return
        used: set[tuple[str, str]] = set()
        for pod in all_of(self.api, "v1", "Pod"):
            if pod_phase(pod) not in ("Succeeded", "Failed"):
                namespace = pod["metadata"].get("namespace", "default")
                used |= {(namespace, name) for name in claims_of(pod)}
        for claim in deleting:
            meta = claim["metadata"]
            if (meta.get("namespace", "default"), meta["name"]) in used:
                continue
            meta["finalizers"] = [f for f in meta.get("finalizers") or [] if f != PVC_PROTECTION]
            update(self.api, claim)
