"""Volcano's job controller and its TTL garbage collector, for ``batch.volcano.sh/v1alpha1`` Jobs.

From volcano-sh/volcano ``pkg/controllers/job``:

- ``initiateJob``: the job's status starts ``Pending`` and its PodGroup is created, named
  ``<job>-<job uid>`` (``generateRelatedPodGroupName``), with the job's labels and annotations, an
  owner reference, ``minMember = spec.minAvailable``, the queue and priority class
  (``createOrUpdatePodGroup``).
- ``syncJob``: pods are created only once the PodGroup's phase is neither ``""`` nor
  ``Pending``; each is ``<job>-<task>-<index>`` with the task and index labels and annotations,
  the job's version and retry count (``volcano.sh/job-retry-count``) and the PodGroup annotation,
  the job's scheduler unless the template names one (``createJobPod``). Plugins
  (``plugins/``): ``pytorch`` gives every container ``MASTER_ADDR``, ``MASTER_PORT``,
  ``WORLD_SIZE``, and ``RANK`` to the master and workers only; ``svc`` sets each pod's hostname
  (its name) and subdomain (the job's name) and makes the headless Service ``<job>``; ``env``
  gives every container and init container ``VK_TASK_INDEX`` and ``VC_TASK_INDEX``.
- ``createJobIOIfNotExist``: a volume with a ``volumeClaim`` and no ``volumeClaimName`` gets a
  claim named ``<job>-volume-<random>``, owned by the job (it goes with the job).
- ``state/*.go``: Pending becomes Running once ``running + succeeded + failed >= minAvailable``;
  when every pod has ended the job is Completed if ``succeeded >= minAvailable``, else Failed. A
  pod that fails (``PodFailed``) or a task whose pods all succeeded (``TaskCompleted``) takes the
  first matching policy, task's before job's: ``RestartJob`` kills every pod, counts a retry and
  fails the job once ``retryCount >= maxRetry``; ``CompleteJob``/``AbortJob``/``TerminateJob``
  kill the running pods and end Completed/Aborted/Terminated.
- ``pkg/controllers/garbagecollector``: a job Completed, Failed or Terminated (not Aborted) with
  ``ttlSecondsAfterFinished`` is deleted (foreground) that many seconds after it finished.
"""

from __future__ import annotations

import copy
import secrets
from typing import TYPE_CHECKING, Any

from controllers import Clock, Controller, all_of, create, owned, owner_ref, pod_phase, update_status
from kubeapi import now_iso

if TYPE_CHECKING:
    from kubeapi import FakeKubeAPI

API = "batch.volcano.sh/v1alpha1"
PODGROUP_API = "scheduling.volcano.sh/v1beta1"
FINISHED = ("Completed", "Failed", "Terminated", "Aborted")
ENDING = {"Completing": "Completed", "Aborting": "Aborted", "Terminating": "Terminated"}


def _plugin_flags(args: list[str]) -> dict[str, str]:
    flags = {"master": "master", "worker": "worker", "port": "23456"}
    for arg in args:
        key, _, value = arg.lstrip("-").partition("=")
        flags[key] = value
    return flags


class VolcanoJobs(Controller):
    def __init__(self, api: FakeKubeAPI) -> None:
        super().__init__(api)
        self.finished = Clock()
        self.seen_failed: set[str] = set()  # pod uids whose PodFailed was handled
        self.completed_tasks: set[tuple[str, str]] = set()

    def reconcile(self) -> None:
        for job in all_of(self.api, API, "Job"):
            if not job["metadata"].get("deletionTimestamp"):
                self.sync(job)

    def group_name(self, job: dict[str, Any]) -> str:
        return f"{job['metadata']['name']}-{job['metadata']['uid']}"

    def sync(self, job: dict[str, Any]) -> None:
        meta, spec = job["metadata"], job["spec"]
        status = copy.deepcopy(job.get("status") or {})
        state = status.setdefault("state", {})
        phase = state.get("phase") or ""
        if not phase:
            phase = self.transition(status, "Pending")
        if phase in FINISHED:
            ttl = spec.get("ttlSecondsAfterFinished")
            if ttl is not None and phase != "Aborted" and self.finished.since(meta["uid"]) >= ttl:
                self.api.delete(API, "Job", meta["name"], meta["namespace"], foreground=True)
                return
            self.kill(job, keep_ended=True)
            update_status(self.api, job, status)
            return
        group = self.ensure_podgroup(job)
        self.ensure_claims(job)
        self.ensure_service(job)
        pods = {p["metadata"]["name"]: p for p in owned(self.api, "v1", "Pod", job)}
        if phase in ENDING:
            if not self.kill(job, keep_ended=True):
                phase = self.transition(status, ENDING[phase])
        elif phase == "Restarting":
            if not self.kill(job, keep_ended=False):
                if status.get("retryCount", 0) >= spec.get("maxRetry", 3):
                    phase = self.transition(status, "Failed", "the job reached its maxRetry")
                else:
                    phase = self.transition(status, "Pending")
        else:
            action = self.policy_action(job, pods)
            if action == "RestartJob":
                status["retryCount"] = status.get("retryCount", 0) + 1
                status["version"] = status.get("version", 0) + 1  # killPods bumps it
                self.kill(job, keep_ended=False)
                self.api.delete(PODGROUP_API, "PodGroup", group["metadata"]["name"], meta["namespace"])
                phase = self.transition(status, "Restarting")
            elif action in ("CompleteJob", "AbortJob", "TerminateJob"):
                ending = {"CompleteJob": "Completing", "AbortJob": "Aborting", "TerminateJob": "Terminating"}
                phase = self.transition(status, ending[action])
            else:
                if (group.get("status") or {}).get("phase") not in (None, "", "Pending"):
                    self.create_pods(job, group["metadata"]["name"], pods)
                phase = self.from_pods(job, status, phase, pods)
        if phase in FINISHED:
            self.finished.since(meta["uid"])  # the TTL counts from here
        update_status(self.api, job, status)

    def transition(self, status: dict[str, Any], phase: str, message: str = "") -> str:
        status["state"] = {
            "phase": phase,
            "lastTransitionTime": now_iso(),
            **({"message": message} if message else {}),
        }
        return phase

    def ensure_podgroup(self, job: dict[str, Any]) -> dict[str, Any]:
        meta = job["metadata"]
        name = self.group_name(job)
        group = self.api.get(PODGROUP_API, "PodGroup", name, meta["namespace"])
        if group is not None:
            return group
        spec = job["spec"]
        group = {
            "apiVersion": PODGROUP_API,
            "kind": "PodGroup",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": dict(meta.get("labels") or {}),
                "annotations": dict(meta.get("annotations") or {}),
                "ownerReferences": [owner_ref(job)],
            },
            "spec": {
                "minMember": spec.get("minAvailable") or sum(t.get("replicas", 1) for t in spec["tasks"]),
                "queue": spec.get("queue") or "default",
                **({"priorityClassName": spec["priorityClassName"]} if spec.get("priorityClassName") else {}),
            },
        }
        return self.api.put(group)

    def ensure_claims(self, job: dict[str, Any]) -> None:
        """Claims for the job's volumes that name none: made once, the name written back."""
        volumes = job["spec"].get("volumes") or []
        changed = False
        for volume in volumes:
            if volume.get("volumeClaimName") or not volume.get("volumeClaim"):
                continue
            name = f"{job['metadata']['name']}-volume-{secrets.token_hex(6)}"
            claim = {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {
                    "name": name,
                    "namespace": job["metadata"]["namespace"],
                    "ownerReferences": [owner_ref(job)],
                },
                "spec": volume["volumeClaim"],
            }
            create(self.api, claim)
            volume["volumeClaimName"] = name
            changed = True
        if changed:
            current = self.api.get(API, "Job", job["metadata"]["name"], job["metadata"]["namespace"])
            if current is not None and current["metadata"]["uid"] == job["metadata"]["uid"]:
                current["spec"]["volumes"] = volumes
                self.api.put(current)

    def ensure_service(self, job: dict[str, Any]) -> None:
        """The svc plugin's headless Service, named after the job."""
        if "svc" not in (job["spec"].get("plugins") or {}):
            return
        meta = job["metadata"]
        if self.api.get("v1", "Service", meta["name"], meta["namespace"]) is not None:
            return
        create(
            self.api,
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "ownerReferences": [owner_ref(job)],
                },
                "spec": {
                    "clusterIP": "None",
                    "selector": {
                        "volcano.sh/job-name": meta["name"],
                        "volcano.sh/job-namespace": meta["namespace"],
                    },
                },
            },
        )

    def create_pods(self, job: dict[str, Any], group: str, pods: dict[str, Any]) -> None:
        meta, spec = job["metadata"], job["spec"]
        flags = (
            _plugin_flags((spec.get("plugins") or {}).get("pytorch") or [])
            if "pytorch" in (spec.get("plugins") or {})
            else None
        )
        ranked = (
            []
            if flags is None
            else [t for t in spec["tasks"] if t["name"] in (flags["master"], flags["worker"])]
        )
        world = sum(t.get("replicas", 1) for t in ranked)
        for task in spec["tasks"]:
            for index in range(task.get("replicas", 1)):
                name = f"{meta['name']}-{task['name']}-{index}"
                if name in pods:
                    continue
                template = copy.deepcopy(task["template"])
                ids = {
                    "volcano.sh/job-name": meta["name"],
                    "volcano.sh/job-namespace": meta["namespace"],
                    "volcano.sh/task-spec": task["name"],
                    "volcano.sh/task-index": str(index),
                }
                labels = {**(template.get("metadata") or {}).get("labels", {}), **ids}
                annotations = {
                    **(template.get("metadata") or {}).get("annotations", {}),
                    **ids,
                    "volcano.sh/job-version": str((job.get("status") or {}).get("version", 0)),
                    "volcano.sh/job-retry-count": str((job.get("status") or {}).get("retryCount", 0)),
                    "scheduling.k8s.io/group-name": group,
                }
                pod_spec = template["spec"]
                pod_spec.setdefault("schedulerName", spec.get("schedulerName") or "volcano")
                self.mount_volumes(job, pod_spec)
                plugins = spec.get("plugins") or {}
                if flags is not None:
                    master = next(t for t in spec["tasks"] if t["name"] == flags["master"])
                    master_spec = master["template"].get("spec") or {}
                    host = master_spec.get("hostname") or f"{meta['name']}-{flags['master']}-0"
                    env = [
                        {
                            "name": "MASTER_ADDR",
                            "value": f"{host}.{master_spec.get('subdomain') or meta['name']}",
                        },
                        {"name": "MASTER_PORT", "value": flags["port"]},
                        {"name": "WORLD_SIZE", "value": str(world)},
                    ]
                    if task["name"] == flags["worker"]:
                        env.append({"name": "RANK", "value": str(index + 1)})
                    elif task["name"] == flags["master"]:
                        env.append({"name": "RANK", "value": "0"})
                    for container in pod_spec["containers"]:
                        container["env"] = [*(container.get("env") or []), *env]
                if "svc" in plugins:
                    pod_spec.setdefault("hostname", name)
                    pod_spec.setdefault("subdomain", meta["name"])
                if "env" in plugins:
                    index_env = [
                        {"name": "VK_TASK_INDEX", "value": str(index)},
                        {"name": "VC_TASK_INDEX", "value": str(index)},
                    ]
                    for container in [*pod_spec["containers"], *(pod_spec.get("initContainers") or [])]:
                        container["env"] = [*(container.get("env") or []), *index_env]
                create(
                    self.api,
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": name,
                            "namespace": meta["namespace"],
                            "labels": labels,
                            "annotations": annotations,
                            "ownerReferences": [owner_ref(job)],
                        },
                        "spec": pod_spec,
                        "status": {"phase": "Pending"},
                    },
                )

    @staticmethod
    def mount_volumes(job: dict[str, Any], pod_spec: dict[str, Any]) -> None:
        for i, volume in enumerate(job["spec"].get("volumes") or []):
            claim = volume.get("volumeClaimName")
            if not claim:
                continue
            name = f"volume-{i}"
            pod_spec.setdefault("volumes", []).append(
                {"name": name, "persistentVolumeClaim": {"claimName": claim}}
            )
            for container in pod_spec["containers"]:
                container.setdefault("volumeMounts", []).append(
                    {"name": name, "mountPath": volume["mountPath"]}
                )

    def kill(self, job: dict[str, Any], *, keep_ended: bool) -> bool:
        """Delete the job's pods (but those that ended, when ``keep_ended``); True while some remain."""
        left = False
        for pod in owned(self.api, "v1", "Pod", job):
            if keep_ended and pod_phase(pod) in ("Succeeded", "Failed"):
                continue
            self.api.delete("v1", "Pod", pod["metadata"]["name"], pod["metadata"]["namespace"])
            left = True
        return left

    def policy_action(self, job: dict[str, Any], pods: dict[str, dict[str, Any]]) -> str | None:
        """The action of the first policy matching a new PodFailed or TaskCompleted event."""
        spec = job["spec"]
        for pod in pods.values():
            uid = pod["metadata"]["uid"]
            if pod_phase(pod) != "Failed" or uid in self.seen_failed:
                continue
            self.seen_failed.add(uid)
            statuses = pod["status"].get("containerStatuses") or [{}]
            code = ((statuses[0].get("state") or {}).get("terminated") or {}).get("exitCode")
            task = next(
                t for t in spec["tasks"] if t["name"] == pod["metadata"]["labels"]["volcano.sh/task-spec"]
            )
            action = self.match([*task.get("policies", []), *spec.get("policies", [])], "PodFailed", code)
            if action:
                return action
        for task in spec["tasks"]:
            done = [
                p
                for p in pods.values()
                if p["metadata"]["labels"]["volcano.sh/task-spec"] == task["name"]
                and pod_phase(p) == "Succeeded"
            ]
            key = (job["metadata"]["uid"], task["name"])
            if len(done) >= task.get("replicas", 1) > 0 and key not in self.completed_tasks:
                self.completed_tasks.add(key)
                action = self.match(
                    [*task.get("policies", []), *spec.get("policies", [])], "TaskCompleted", None
                )
                if action:
                    return action
        return None

    @staticmethod
    def match(policies: list[dict[str, Any]], event: str, code: int | None) -> str | None:
        for policy in policies:
            events = set(policy.get("events") or []) | ({policy["event"]} if policy.get("event") else set())
            if event in events or "*" in events:
                return str(policy["action"])
            if code is not None and policy.get("exitCode") == code:
                return str(policy["action"])
        return None

    def from_pods(
        self, job: dict[str, Any], status: dict[str, Any], phase: str, pods: dict[str, dict[str, Any]]
    ) -> str:
        counts = {
            p: sum(1 for pod in pods.values() if pod_phase(pod) == p)
            for p in ("Pending", "Running", "Succeeded", "Failed")
        }
        status.update(
            pending=counts["Pending"],
            running=counts["Running"],
            succeeded=counts["Succeeded"],
            failed=counts["Failed"],
        )
        spec = job["spec"]
        total = sum(t.get("replicas", 1) for t in spec["tasks"])
        need = spec.get("minAvailable") or total
        started = counts["Running"] + counts["Succeeded"] + counts["Failed"]
        if phase == "Pending" and started >= need:
            phase = self.transition(status, "Running")
        if phase == "Running" and counts["Succeeded"] + counts["Failed"] == total:
            phase = self.transition(status, "Completed" if counts["Succeeded"] >= need else "Failed")
        return phase
