"""The Kubeflow training operator v1 for ``kubeflow.org/v1`` PyTorchJobs (kubeflow/trainer ``release-1.9``).

- Defaults (``SetDefaults_PyTorchJob``): ``cleanPodPolicy: None``, one replica, replica
  ``restartPolicy: OnFailure``.
- ``pkg/controller.v1/common/pod.go`` ``ReconcilePods``/``createNewPod``: one pod per replica
  index named ``<job>-<type>-<index>`` (``GenGeneralName``), labelled with the operator, job,
  replica type and index (``job-role: master`` on the master), its ``restartPolicy`` the
  replica's (``ExitCode`` becomes ``Never``); a pod that failed under ``OnFailure``/``Always`` is
  deleted so that the next sync makes it again, and the job gets ``Restarting``.
- ``service.go`` ``CreateNewService``: a headless Service of the same name for every pod.
- ``pytorch/envvar.go``: ``MASTER_ADDR=<job>-master-0``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``.
- ``pytorch/pytorchjob_controller.go`` ``UpdateJobStatus``: ``Running`` while the master runs,
  ``Succeeded`` once it succeeded (workers are not waited for), and for any replica type with
  failures and fewer running+succeeded than replicas: ``Restarting``, or ``Failed`` under
  ``Never``.
- ``pkg/core/job.go`` ``PastBackoffLimit``: the restart counts of the containers of the running
  pods of ``OnFailure``/``Always``/``ExitCode`` replicas, summed over all pods; the job fails when
  that sum reaches ``backoffLimit`` (exceeds it, for 0).
- ``common/job.go``: once finished, ``DeletePodsAndServices`` by ``cleanPodPolicy`` (``None``
  keeps everything, ``Running`` deletes running and pending pods, ``All`` every pod, each with
  its Service), and ``CleanupJob`` deletes the job ``ttlSecondsAfterFinished`` after its
  completion time.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from controllers import (
    Clock,
    Controller,
    all_of,
    has_condition,
    owned,
    owner_ref,
    pod_phase,
    set_condition,
    update_status,
)

if TYPE_CHECKING:
    from kubeapi import FakeKubeAPI

API = "kubeflow.org/v1"
LABELS = "training.kubeflow.org"


class PyTorchJobs(Controller):
    def __init__(self, api: FakeKubeAPI) -> None:
        super().__init__(api)
        self.finished = Clock()

    def reconcile(self) -> None:
        for job in all_of(self.api, API, "PyTorchJob"):
            if not job["metadata"].get("deletionTimestamp"):
                self.sync(job)

    def sync(self, job: dict[str, Any]) -> None:
        meta, spec = job["metadata"], job["spec"]
        run = spec.get("runPolicy") or {}
        replicas = spec["pytorchReplicaSpecs"]
        status = copy.deepcopy(job.get("status") or {})
        set_condition(status, "Created", "PyTorchJobCreated", f"PyTorchJob {meta['name']} is created.")
        pods = owned(self.api, "v1", "Pod", job)
        if has_condition(job, "Succeeded") or has_condition(job, "Failed"):
            self.clean(job, run.get("cleanPodPolicy") or "None", pods)
            ttl = run.get("ttlSecondsAfterFinished")
            if ttl is not None and self.finished.since(meta["uid"]) >= ttl:
                self.api.delete(API, "PyTorchJob", meta["name"], meta["namespace"])
            return
        if self.past_backoff_limit(run, replicas, pods):
            self.fail(
                status, f"Job {meta['name']} has failed because it has reached the specified backoff limit"
            )
        else:
            self.sync_replicas(job, replicas, pods, status)
            self.update_status(job, replicas, owned(self.api, "v1", "Pod", job), status)
        if has_condition({"status": status}, "Succeeded") or has_condition({"status": status}, "Failed"):
            self.finished.since(meta["uid"])
        update_status(self.api, job, status)

    @staticmethod
    def restart_policy(replica: dict[str, Any]) -> str:
        policy = replica.get("restartPolicy") or "OnFailure"
        return "Never" if policy == "ExitCode" else str(policy)

    def sync_replicas(
        self,
        job: dict[str, Any],
        replicas: dict[str, Any],
        pods: list[dict[str, Any]],
        status: dict[str, Any],
    ) -> None:
        meta = job["metadata"]
        by_name = {p["metadata"]["name"]: p for p in pods}
        total = sum(int(r.get("replicas", 1)) for r in replicas.values())
        master_port = "23456"
        for container in (
            (replicas.get("Master") or {}).get("template", {}).get("spec", {}).get("containers", [])
        ):
            for port in container.get("ports") or []:
                if port.get("name") == "pytorchjob-port":
                    master_port = str(port["containerPort"])
        for rtype, replica in replicas.items():
            rt = rtype.lower()
            for index in range(int(replica.get("replicas", 1))):
                name = f"{meta['name']}-{rt}-{index}"
                labels = {
                    f"{LABELS}/operator-name": "pytorchjob-controller",
                    f"{LABELS}/job-name": meta["name"],
                    f"{LABELS}/replica-type": rt,
                    f"{LABELS}/replica-index": str(index),
                }
                if self.api.get("v1", "Service", name, meta["namespace"]) is None:
                    self.api.put(
                        {
                            "apiVersion": "v1",
                            "kind": "Service",
                            "metadata": {
                                "name": name,
                                "namespace": meta["namespace"],
                                "labels": labels,
                                "ownerReferences": [owner_ref(job)],
                            },
                            "spec": {"clusterIP": "None", "selector": labels},
                        }
                    )
                pod = by_name.get(name)
                if pod is not None and pod_phase(pod) == "Failed" and self.restart_policy(replica) != "Never":
                    self.api.delete("v1", "Pod", name, meta["namespace"])
                    set_condition(
                        status,
                        "Restarting",
                        "PyTorchJobRestarting",
                        f"job {meta['name']} is restarting because {rtype} replica(s) failed.",
                    )
                    set_condition(status, "Running", "PyTorchJobRestarting", "", value="False")
                    continue
                if pod is not None:
                    continue
                template = copy.deepcopy(replica["template"])
                pod_labels = {**(template.get("metadata") or {}).get("labels", {}), **labels}
                if rtype == "Master" or ("Master" not in replicas and index == 0):
                    pod_labels[f"{LABELS}/job-role"] = "master"
                pod_spec = template["spec"]
                pod_spec["restartPolicy"] = self.restart_policy(replica)
                rank = index + 1 if rtype == "Worker" and "Master" in replicas else index
                env = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
                if "Master" in replicas:
                    env += [
                        {"name": "MASTER_PORT", "value": master_port},
                        {"name": "MASTER_ADDR", "value": f"{meta['name']}-master-0"},
                        {"name": "WORLD_SIZE", "value": str(total)},
                        {"name": "RANK", "value": str(rank)},
                    ]
                for container in pod_spec["containers"]:
                    container["env"] = [*(container.get("env") or []), *env]
                self.api.put(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": name,
                            "namespace": meta["namespace"],
                            "labels": pod_labels,
                            "annotations": (template.get("metadata") or {}).get("annotations", {}),
                            "ownerReferences": [owner_ref(job)],
                        },
                        "spec": pod_spec,
                        "status": {"phase": "Pending"},
                    }
                )

    def update_status(
        self,
        job: dict[str, Any],
        replicas: dict[str, Any],
        pods: list[dict[str, Any]],
        status: dict[str, Any],
    ) -> None:
        name = job["metadata"]["name"]
        for rtype, replica in replicas.items():
            mine = [p for p in pods if p["metadata"]["labels"].get(f"{LABELS}/replica-type") == rtype.lower()]
            count = {
                ph: sum(1 for p in mine if pod_phase(p) == ph) for ph in ("Running", "Succeeded", "Failed")
            }
            wanted = int(replica.get("replicas", 1))
            if rtype == "Master" or "Master" not in replicas:
                if count["Running"] > 0:
                    set_condition(status, "Running", "PyTorchJobRunning", f"PyTorchJob {name} is running.")
                    set_condition(status, "Restarting", "PyTorchJobRunning", "", value="False")
                if wanted - count["Succeeded"] == 0:
                    set_condition(
                        status,
                        "Succeeded",
                        "PyTorchJobSucceeded",
                        f"PyTorchJob {name} is successfully completed.",
                    )
                    set_condition(status, "Running", "PyTorchJobSucceeded", "", value="False")
                    return
            broken = count["Failed"] > 0 and wanted > count["Succeeded"] + count["Running"]
            if broken and self.restart_policy(replica) == "Never":
                self.fail(
                    status,
                    f"PyTorchJob {name} is failed because {count['Failed']} {rtype} replica(s) failed.",
                )

    @staticmethod
    def fail(status: dict[str, Any], message: str) -> None:
        set_condition(status, "Failed", "PyTorchJobFailed", message)
        set_condition(status, "Running", "PyTorchJobFailed", "", value="False")

    def past_backoff_limit(
        self, run: dict[str, Any], replicas: dict[str, Any], pods: list[dict[str, Any]]
    ) -> bool:
        limit = run.get("backoffLimit")
        if limit is None:
            return False
        total = 0
        for rtype, replica in replicas.items():
            if (replica.get("restartPolicy") or "OnFailure") not in ("OnFailure", "Always", "ExitCode"):
                continue
            for pod in pods:
                if pod["metadata"]["labels"].get(f"{LABELS}/replica-type") != rtype.lower():
                    continue
                if pod_phase(pod) != "Running":
                    continue
                status = pod.get("status") or {}
                for c in (status.get("initContainerStatuses") or []) + (
                    status.get("containerStatuses") or []
                ):
                    total += int(c.get("restartCount") or 0)
        return total > 0 if limit == 0 else total >= limit

    def clean(self, job: dict[str, Any], policy: str, pods: list[dict[str, Any]]) -> None:
        if policy == "None":
            return
        for pod in pods:
            if policy == "Running" and pod_phase(pod) not in ("Running", "Pending"):
                continue
            name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
            self.api.delete("v1", "Pod", name, namespace)
            self.api.delete("v1", "Service", name, namespace)
