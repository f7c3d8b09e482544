"""A kubelet stand-in: runs every bound pod through Running to Succeeded or Failed as a script says.

The script maps a pod (its ``spec.hostname`` when set, as Indexed Jobs set it, else its name) to
the exit code of each attempt of its first container; attempts past the list repeat the last
code, pods not named exit 0. Other containers exit 0. As the kubelet does
(``pkg/kubelet/kuberuntime``): init containers run first; ``restartPolicy`` ``OnFailure``
restarts a failed container in place (``restartCount`` + 1, the old log becomes the previous
one, the pod stays ``Running``), ``Always`` restarts it whatever its code, ``Never`` ends the pod
``Failed`` or ``Succeeded``. Each attempt writes a few log lines and closes its log on exit.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from controllers import Controller, all_of, pod_phase, update
from kubeapi import now_iso

if TYPE_CHECKING:
    from kubeapi import FakeKubeAPI


def who(pod: dict[str, Any]) -> str:
    return str(pod["spec"].get("hostname") or pod["metadata"]["name"])


class Kubelet(Controller):
    def __init__(
        self,
        api: FakeKubeAPI,
        exits: dict[str, list[int]] | None = None,
        *,
        seconds: float = 0.4,
        durations: dict[str, float] | None = None,
    ) -> None:
        super().__init__(api)
        self.exits = exits or {}
        self.seconds = seconds  # how long each attempt runs
        self.durations = durations or {}  # ... of the pods named here
        self.started: dict[str, float] = {}  # pod uid -> when its current attempt started
        self.names: dict[str, tuple[str, list[str]]] = {}  # pod uid -> its name and containers

    def code(self, pod: dict[str, Any], attempt: int) -> int:
        codes = self.exits.get(who(pod)) or [0]
        return codes[min(attempt, len(codes) - 1)]

    def reconcile(self) -> None:
        now = time.monotonic()
        pods = all_of(self.api, "v1", "Pod")
        present = {p["metadata"]["uid"] for p in pods}
        for uid in [u for u in self.names if u not in present]:  # deleted: its containers are killed
            name, containers = self.names.pop(uid)
            self.started.pop(uid, None)
            for container in containers:
                self.api.end_log(name, container)
        for pod in pods:
            if not pod["spec"].get("nodeName") or pod_phase(pod) in ("Succeeded", "Failed"):
                continue
            uid = pod["metadata"]["uid"]
            if pod_phase(pod) == "Pending":
                self.names[uid] = (pod["metadata"]["name"], [c["name"] for c in pod["spec"]["containers"]])
                self._start(pod, attempt=0)
                self.started[uid] = now
            elif uid in self.started and now - self.started[uid] >= self.durations.get(
                who(pod), self.seconds
            ):
                self._exit(pod)
                self.started[uid] = now

    def _lines(self, pod: dict[str, Any], attempt: int) -> None:
        name = pod["metadata"]["name"]
        for container in pod["spec"]["containers"]:
            key = (name, container["name"])
            with self.api.lock:  # a new attempt: the last one's log becomes the previous log
                if attempt:
                    self.api.previous_logs[key] = self.api.logs.get(key, [])
                self.api.logs[key] = []
                self.api.logs_closed.discard(key)
            self.api.log(name, container["name"], f"{who(pod)} attempt {attempt}: training")

    def _start(self, pod: dict[str, Any], attempt: int) -> None:
        started = now_iso()
        self._lines(pod, attempt)
        status = pod.setdefault("status", {})
        status.update(phase="Running", startTime=started, podIP="10.0.0.1")
        status["initContainerStatuses"] = [
            {
                "name": c["name"],
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": started}},
            }
            for c in pod["spec"].get("initContainers") or []
        ]
        last = {c["name"]: c.get("lastState") for c in status.get("containerStatuses") or []}
        status["containerStatuses"] = [
            {
                "name": c["name"],
                "restartCount": attempt,
                "state": {"running": {"startedAt": started}},
                **({"lastState": last[c["name"]]} if last.get(c["name"]) else {}),
            }
            for c in pod["spec"]["containers"]
        ]
        update(self.api, pod)

    def _exit(self, pod: dict[str, Any]) -> None:
        status = pod["status"]
        attempt = int(status["containerStatuses"][0].get("restartCount") or 0)
        code = self.code(pod, attempt)
        policy = pod["spec"].get("restartPolicy") or "Always"
        name = pod["metadata"]["name"]
        ended = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "finishedAt": now_iso(),
        }
        if policy == "Always" or (policy == "OnFailure" and code != 0):
            for container in status["containerStatuses"]:
                container["lastState"] = {"terminated": dict(ended)}
            self._start(pod, attempt + 1)  # the same pod, its container once more
            return
        for container in pod["spec"]["containers"]:
            self.api.log(name, container["name"], f"{who(pod)} attempt {attempt}: exit {code}")
            self.api.end_log(name, container["name"])
        for i, container in enumerate(status["containerStatuses"]):
            container["state"] = {"terminated": dict(ended, exitCode=code if i == 0 else 0)}
        status["phase"] = "Succeeded" if code == 0 else "Failed"
        update(self.api, pod)
