"""A kubelet stand-in: runs every bound pod through Running to Succeeded or Failed as a script says.

The script maps a pod (its ``spec.hostname`` when set, as Indexed Jobs set it, else its name) to
the exit code of each run of its first container, counted over every pod of that name (a
restarted job's pods made again count on); runs past the list repeat the last code, pods not
named exit 0. Other containers exit 0. As the kubelet does
(``pkg/kubelet/kuberuntime``): init containers run first; ``restartPolicy`` ``OnFailure``
restarts a failed container in place (``restartCount`` + 1, the old log becomes the previous
one, the pod stays ``Running``), ``Always`` restarts it whatever its code, ``Never`` ends the pod
``Failed`` or ``Succeeded``. ``evictions`` names pods whose first runs end by eviction instead:
the whole pod ``Failed`` (reason ``Evicted``), whatever its restart policy, as when a node is
drained. Each attempt writes ``lines`` log lines (``<who> attempt <n>: training <k>``; a pod made
again under the same name says ``<who> pod #<m> attempt <n>``) and closes its log on exit.

Each start also reads what the pod's training processes see (envs.py) and dials their master
address through the cluster's DNS (dns.py): an address that does not resolve ends the attempt
with exit code 1 and the line ``<who>: cannot resolve <address>``, as a rendezvous would after
its timeout. ``processes`` keeps, by pod name, what the latest start of each pod saw.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from controllers import Controller, all_of, pod_phase, update
from controllers.dns import resolve
from controllers.envs import Process, processes
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
        evictions: dict[str, int] | None = None,
        lines: int = 1,
    ) -> None:
        super().__init__(api)
        self.exits = exits or {}
        self.seconds = seconds  # how long each attempt runs
        self.durations = durations or {}  # ... of the pods named here
        self.evictions = dict(evictions or {})  # pods whose next runs are evicted, how many times
        self.lines = lines
        self.started: dict[str, float] = {}  # pod uid -> when its current attempt started
        self.names: dict[str, tuple[str, list[str]]] = {}  # pod uid -> its name and containers
        self.incarnations: dict[str, int] = {}  # pod name -> how many pods of that name started
        self.unresolved: dict[str, str] = {}  # pod uid -> the address its attempt could not resolve
        self.processes: dict[str, list[Process]] = {}  # pod name -> what its last start saw
        self.runs: dict[str, int] = {}  # who -> how many runs of its first container started

    def code(self, pod: dict[str, Any]) -> int:
        codes = self.exits.get(who(pod)) or [0]
        return codes[min(self.runs.get(who(pod), 1) - 1, len(codes) - 1)]

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
            if pod["metadata"].get("deletionTimestamp"):
                continue
            uid = pod["metadata"]["uid"]
            if pod_phase(pod) == "Pending":
                name = pod["metadata"]["name"]
                self.names[uid] = (name, [c["name"] for c in pod["spec"]["containers"]])
                self.incarnations[name] = self.incarnations.get(name, 0) + 1
                self._start(pod, attempt=0)
                self.started[uid] = now
            elif uid in self.started and now - self.started[uid] >= self.durations.get(
                who(pod), self.seconds
            ):
                self._exit(pod)
                self.started[uid] = now

    def _text(self, pod: dict[str, Any], attempt: int) -> str:
        made = self.incarnations.get(pod["metadata"]["name"], 1)
        again = f" pod #{made}" if made > 1 else ""
        return f"{who(pod)}{again} attempt {attempt}"

    def _lines(self, pod: dict[str, Any], attempt: int) -> None:
        name = pod["metadata"]["name"]
        for container in pod["spec"]["containers"]:
            self.api.restart_log(name, container["name"])  # the last run's log becomes the previous one
            texts = [f"{self._text(pod, attempt)}: training"]
            texts += [f"{self._text(pod, attempt)}: training {k}" for k in range(1, self.lines)]
            self.api.log(name, container["name"], *texts)

    def _dial(self, pod: dict[str, Any]) -> None:
        """What the pod's processes see, and whether their master address resolves."""
        seen = processes(pod, self.api)
        self.processes[pod["metadata"]["name"]] = seen
        uid = pod["metadata"]["uid"]
        self.unresolved.pop(uid, None)
        namespace = pod["metadata"].get("namespace", "default")
        for process in seen:
            if process.master_addr and not resolve(self.api, namespace, process.master_addr):
                self.unresolved[uid] = process.master_addr
                return

    def _start(self, pod: dict[str, Any], attempt: int) -> None:
        started = now_iso()
        self.runs[who(pod)] = self.runs.get(who(pod), 0) + 1
        self._dial(pod)
        self._lines(pod, attempt)
        status = pod.setdefault("status", {})
        status.update(phase="Running", startTime=status.get("startTime") or started, podIP="10.0.0.1")
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
        uid = pod["metadata"]["uid"]
        name = pod["metadata"]["name"]
        unresolved = self.unresolved.get(uid)
        code = 1 if unresolved else self.code(pod)
        if self.evictions.get(who(pod), 0) > 0:
            self.evictions[who(pod)] -= 1
            self._evict(pod)
            return
        policy = pod["spec"].get("restartPolicy") or "Always"
        ended = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "finishedAt": now_iso(),
        }
        if unresolved:
            for container in pod["spec"]["containers"]:
                self.api.log(name, container["name"], f"{who(pod)}: cannot resolve {unresolved}")
        if policy == "Always" or (policy == "OnFailure" and code != 0):
            for container in status["containerStatuses"]:
                container["lastState"] = {"terminated": dict(ended)}
            self._start(pod, attempt + 1)  # the same pod, its container once more
            return
        for container in pod["spec"]["containers"]:
            self.api.log(name, container["name"], f"{self._text(pod, attempt)}: exit {code}")
            self.api.end_log(name, container["name"])
        for i, container in enumerate(status["containerStatuses"]):
            container["state"] = {"terminated": dict(ended, exitCode=code if i == 0 else 0)}
        status["phase"] = "Succeeded" if code == 0 else "Failed"
        update(self.api, pod)

    def _evict(self, pod: dict[str, Any]) -> None:
        """The node drained: the pod fails as a whole, its containers killed (137)."""
        name, status = pod["metadata"]["name"], pod["status"]
        for container in pod["spec"]["containers"]:
            self.api.log(name, container["name"], f"{self._text(pod, 0)}: evicted")
            self.api.end_log(name, container["name"])
        killed = {"exitCode": 137, "reason": "Error", "finishedAt": now_iso()}
        for container in status["containerStatuses"]:
            container["state"] = {"terminated": dict(killed)}
        status.update(phase="Failed", reason="Evicted", message="The node was low on resource: memory.")
        update(self.api, pod)
