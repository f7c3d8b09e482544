"""Schedulers: each binds only the pods whose ``spec.schedulerName`` is its own.

``Scheduler`` is kube-scheduler reduced to a number of pod slots: a pod that fits is bound
(``spec.nodeName``, ``PodScheduled=True``), one that does not gets ``PodScheduled=False`` with
reason ``Unschedulable`` and a message in kube-scheduler's form. A pod asking for a scheduler no
one runs is never touched: no node, no condition. A pod whose claim does not exist, or is being
deleted, is not bound either (the ``VolumeBinding`` plugin): ``persistentvolumeclaim "x" not found``.

``VolcanoScheduler`` is Volcano's scheduler (volcano-sh/volcano ``pkg/scheduler``): a PodGroup
starts ``Pending``; the enqueue action moves it to ``Inqueue`` when its ``minMember`` fits (only
then does Volcano's job controller create the pods, see ``volcano.py``); when it does not, the
gang plugin writes the condition ``Unschedulable`` with reason ``NotEnoughResources`` and the
message ``"<n>/<m> tasks in gang unschedulable: <fit error>"`` (``plugins/gang/gang.go``). Pods
are bound all at once when ``minMember`` of the group's pods exist and fit, and the group becomes
``Running`` (``framework/session.go`` ``getPodGroupPhase``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from controllers import Controller, all_of, pod_phase, update
from kubeapi import now_iso

if TYPE_CHECKING:
    from kubeapi import FakeKubeAPI

GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
PODGROUP_API = "scheduling.volcano.sh/v1beta1"


def _fit_error(slots: int | None) -> str:
    return f"0/1 nodes are available: 1 Too many pods (the node holds {slots})."


class Scheduler(Controller):
    def __init__(self, api: FakeKubeAPI, name: str = "default-scheduler", slots: int | None = None) -> None:
        super().__init__(api)
        self.name, self.slots = name, slots

    def mine(self, pod: dict[str, Any]) -> bool:
        return (pod["spec"].get("schedulerName") or "default-scheduler") == self.name

    def busy(self) -> int:
        return sum(
            1
            for p in all_of(self.api, "v1", "Pod")
            if p["spec"].get("nodeName") and pod_phase(p) not in ("Succeeded", "Failed")
        )

    def bind(self, pod: dict[str, Any]) -> None:
        pod["spec"]["nodeName"] = "node-1"
        status = pod.setdefault("status", {"phase": "Pending"})
        status["conditions"] = [
            c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"
        ] + [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now_iso()}]
        update(self.api, pod)

    def unschedulable(self, pod: dict[str, Any], message: str) -> None:
        status = pod.setdefault("status", {"phase": "Pending"})
        if any(c.get("reason") == "Unschedulable" for c in status.get("conditions") or []):
            return
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": now_iso(),
        }
        status["conditions"] = [condition]
        update(self.api, pod)

    def waiting(self) -> list[dict[str, Any]]:
        pods = [
            p
            for p in all_of(self.api, "v1", "Pod")
            if self.mine(p) and not p["spec"].get("nodeName") and pod_phase(p) == "Pending"
        ]
        return sorted(pods, key=lambda p: p["metadata"]["name"])

    def claim_problem(self, pod: dict[str, Any]) -> str | None:
        from controllers.storage import claims_of

        namespace = pod["metadata"].get("namespace", "default")
        for name in sorted(claims_of(pod)):
            claim = self.api.get("v1", "PersistentVolumeClaim", name, namespace)
            if claim is None:
                return f'0/1 nodes are available: persistentvolumeclaim "{name}" not found.'
            if claim["metadata"].get("deletionTimestamp"):
                return f'0/1 nodes are available: persistentvolumeclaim "{name}" is being deleted.'
        return None

    def reconcile(self) -> None:
        busy = self.busy()
        for pod in self.waiting():
            problem = self.claim_problem(pod)
            if problem is not None:
                self.unschedulable(pod, problem)
            elif self.slots is None or busy < self.slots:
                self.bind(pod)
                busy += 1
            else:
                self.unschedulable(pod, _fit_error(self.slots))


class VolcanoScheduler(Scheduler):
    def __init__(self, api: FakeKubeAPI, slots: int | None = None) -> None:
        super().__init__(api, "volcano", slots)

    def reconcile(self) -> None:
        free = None if self.slots is None else self.slots - self.busy()
        waiting = self.waiting()
        for group in all_of(self.api, PODGROUP_API, "PodGroup"):
            meta, status = group["metadata"], dict(group.get("status") or {})
            members = [
                p
                for p in waiting
                if (p["metadata"].get("annotations") or {}).get(GROUP_ANNOTATION) == meta["name"]
                and p["metadata"].get("namespace") == meta.get("namespace")
            ]
            need = int(group["spec"].get("minMember") or 1)
            phase = status.get("phase") or ""
            if phase in ("", "Pending"):
                if free is None or need <= free:
                    status["phase"] = "Inqueue"
                else:
                    status["phase"] = "Pending"
                    message = f"{need}/{len(members)} tasks in gang unschedulable: {_fit_error(self.slots)}"
                    status["conditions"] = [
                        {
                            "type": "Unschedulable",
                            "status": "True",
                            "reason": "NotEnoughResources",
                            "message": message,
                            "transitionID": "session-1",
                            "lastTransitionTime": now_iso(),
                        }
                    ]
            elif (
                members
                and (phase == "Running" or len(members) >= need)
                and (free is None or len(members) <= free)
            ):
                for pod in members:
                    self.bind(pod)
                free = None if free is None else free - len(members)
                status["phase"] = "Running"
                status["conditions"] = [
                    {
                        "type": "Scheduled",
                        "status": "True",
                        "reason": "tasks in gang are ready to be scheduled",
                        "lastTransitionTime": now_iso(),
                    }
                ]
            if status != (group.get("status") or {}):
                group["status"] = status
                update(self.api, group)
