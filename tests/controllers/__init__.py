"""Small stand-ins for the controllers of a cluster, acting on the fake API server (tests/kubeapi.py).

Each module follows the upstream code it names, reduced to what torchjob can observe: the objects
a controller creates, the status it writes, what it deletes and when. They are level-triggered as
real controllers are: a ``ControlPlane`` thread wakes on every change the server records (what an
informer would deliver) and at least every ``period`` seconds (what a requeue-after does), and
calls ``reconcile()`` on each controller, which reads the current objects and writes what differs.

- ``scheduler``: kube-scheduler (binds pods of its own ``schedulerName``) and Volcano's scheduler
  (PodGroups: enqueue, gang binding, Unschedulable conditions).
- ``kubelet``: runs bound pods through Running to Succeeded/Failed as a test's script says.
- ``volcano``: Volcano's job controller and its TTL garbage collector.
- ``kubeflow``: the training operator v1 for PyTorchJob.
- ``batchjob`` and ``jobset``: the Job controller (Indexed Jobs, backoffLimit) and JobSet's.
- ``trainjob``: Kubeflow Trainer v2 (a TrainJob becomes a JobSet).
- ``storage``: the claim protection controller (a claim in use is deleted only once no pod uses it).
- ``envs`` and ``dns``: what a pod's processes see (env, torchrun's ranks) and the cluster's DNS.

A controller creates what it makes through ``create``: the server may refuse it (a name too long,
a webhook), as it refuses a real controller, which records an Event and tries again later.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import TYPE_CHECKING, Any

from kubeadmission import Refused
from kubeapi import now_iso

if TYPE_CHECKING:
    from kubeapi import FakeKubeAPI


class Controller:
    """One controller: ``reconcile`` brings what it owns to what it wants, idempotently."""

    def __init__(self, api: FakeKubeAPI) -> None:
        self.api = api

    def reconcile(self) -> None:
        raise NotImplementedError


class ControlPlane:
    """Runs controllers in one thread until stopped; an exception in one fails the test at stop."""

    def __init__(self, api: FakeKubeAPI, *controllers: Controller, period: float = 0.05) -> None:
        self.api, self.controllers, self.period = api, list(controllers), period
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="control-plane", daemon=True)

    def __enter__(self) -> ControlPlane:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        assert not self._thread.is_alive(), "the control plane did not stop"
        if self.errors:
            raise self.errors[0]

    def _run(self) -> None:
        position = 0
        while not self._stop.is_set() and not self.api.stopping:
            position, _ = self.api.events_after(position, self.period)
            for controller in self.controllers:
                try:
                    controller.reconcile()
                except BaseException as err:  # reported when the test stops us
                    self.errors.append(err)
                    return


# ---------------------------------------------------------------------- helpers shared by controllers


def all_of(api: FakeKubeAPI, api_version: str, kind: str) -> list[dict[str, Any]]:
    """Every object of a kind, in every namespace, as a lister returns them (copies)."""
    plural = api.plural(api_version, kind)
    with api.lock:
        return [
            copy.deepcopy(o) for (v, p, _, _), o in api.objects.items() if (v, p) == (api_version, plural)
        ]


def owner_ref(owner: dict[str, Any]) -> dict[str, Any]:
    meta = owner["metadata"]
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def create(api: FakeKubeAPI, obj: dict[str, Any]) -> dict[str, Any] | None:
    """Create ``obj`` as a controller does; None when the server refuses it (kept in
    ``api.refused``, as a real controller's Event would say)."""
    try:
        return api.put(obj)
    except Refused as err:
        with api.lock:
            api.refused.append(f"{obj['kind']} {obj['metadata']['name']}: {err.message}")
        return None


def owned(api: FakeKubeAPI, api_version: str, kind: str, owner: dict[str, Any]) -> list[dict[str, Any]]:
    uid = owner["metadata"]["uid"]
    return [
        o
        for o in all_of(api, api_version, kind)
        if o["metadata"].get("namespace") == owner["metadata"].get("namespace")
        and any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])
    ]


def update(api: FakeKubeAPI, obj: dict[str, Any]) -> bool:
    """Write ``obj`` back unless it was deleted (or replaced) meanwhile: an Update, never a create."""
    meta = obj["metadata"]
    with api.lock:
        current = api.get(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace", "default"))
        if current is None or current["metadata"]["uid"] != meta["uid"]:
            return False
        api.put(obj)
    return True


def update_status(api: FakeKubeAPI, obj: dict[str, Any], status: dict[str, Any]) -> None:
    """Write ``status`` when it differs from the stored one (a controller's UpdateStatus)."""
    meta = obj["metadata"]
    with api.lock:
        current = api.get(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace", "default"))
        if current is None or current["metadata"]["uid"] != meta["uid"] or current.get("status") == status:
            return
        current["status"] = status
        api.put(current)


def set_condition(status: dict[str, Any], kind: str, reason: str, message: str, value: str = "True") -> bool:
    """Set one condition of ``status`` (a new transition time only when its status changes)."""
    conditions = status.setdefault("conditions", [])
    for condition in conditions:
        if condition.get("type") == kind:
            if condition.get("status") == value:
                return False
            condition.update(status=value, reason=reason, message=message, lastTransitionTime=now_iso())
            return True
    conditions.append(
        {"type": kind, "status": value, "reason": reason, "message": message, "lastTransitionTime": now_iso()}
    )
    return True


def has_condition(obj: dict[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def pod_phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


class Clock:
    """When each object reached a state, by uid, on this process's monotonic clock (TTLs)."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def since(self, uid: str) -> float:
        return time.monotonic() - self._since.setdefault(uid, time.monotonic())
