"""The Kubeflow training operator v1 for ``kubeflow.org/v1`` PyTorchJobs (kubeflow/trainer ``release-1.9``).

- Defaults (``SetDefaults_PyTorchJob``): ``cleanPodPolicy: None``, one replica, replica
  ``restartPolicy: OnFailure``, ``nprocPerNode: auto`` without an elastic policy.
- ``pkg/controller.v1/common/pod.go`` ``ReconcilePods``/``createNewPod``: one pod per replica
  index named ``<job>-<type>-<index>`` (``GenGeneralName``), labelled with the operator, job,
  replica type and index (``job-role: master`` on the master), its ``restartPolicy`` the
  replica's (``ExitCode`` becomes ``Never``); a pod that failed (phase ``Failed``: under
  ``OnFailure``/``Always`` only when evicted) is deleted so that the next sync makes it again
  under the same name, and the job gets ``Restarting``: under ``OnFailure``/``Always``, and under
  ``ExitCode`` for a retryable code (128 and above).
- ``service.go`` ``CreateNewService``: a headless Service of the same name for every pod.
- ``pytorch/envvar.go`` and ``master.go``: every container gets ``PYTHONUNBUFFERED``; with a
  Master, ``MASTER_PORT``/``PET_MASTER_PORT`` (the master's ``pytorchjob-port``),
  ``MASTER_ADDR``/``PET_MASTER_ADDR`` (``<job>-master-0``), ``WORLD_SIZE`` (replicas times
  ``nprocPerNode`` read as a number, 1 when it is not one), ``RANK`` and ``PET_NODE_RANK``;
  ``PET_NPROC_PER_NODE`` is ``nprocPerNode`` as written, and ``PET_NNODES`` the replicas.
- ``pytorch/pytorchjob_controller.go`` ``UpdateJobStatus``: ``Running`` while the master runs,
  ``Succeeded`` once it succeeded (workers are not waited for), and for any replica type with
  failures and fewer running+succeeded than replicas: ``Restarting``, or ``Failed`` under
  ``Never``.
- ``common/job.go``: past ``runPolicy.activeDeadlineSeconds`` (from the job's start) the job
  gets ``Failed`` ("... was active longer than specified deadline"), its pods cleaned by policy.
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
    create,
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
        self.started = Clock()

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
        deadline = run.get("activeDeadlineSeconds")
        if self.past_backoff_limit(run, replicas, pods):
            self.fail(
                status, f"Job {meta['name']} has failed because it has reached the specified backoff limit"
            )
        elif deadline is not None and self.started.since(meta["uid"]) >= int(deadline):
            self.fail(
                status, f"Job {meta['name']} has failed because it was active longer than specified deadline"
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

    @staticmethod
    def recreated(replica: dict[str, Any], pod: dict[str, Any]) -> bool:
        """Whether the operator deletes a failed pod to make it again (``ReconcilePods``)."""
        policy = replica.get("restartPolicy") or "OnFailure"
        if policy in ("OnFailure", "Always"):
            return True
        statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
        code = int(((statuses[0].get("state") or {}).get("terminated") or {}).get("exitCode") or 0)
        return policy == "ExitCode" and code >= 128

    @staticmethod
    def env(
        job: dict[str, Any], replicas: dict[str, Any], rtype: str, index: int, port: str
    ) -> list[dict[str, str]]:
        """What ``setPodEnv`` gives each container of a replica's pod."""
        total = sum(int(r.get("replicas", 1)) for r in replicas.values())
        nproc_text = job["spec"].get("nprocPerNode")
        if nproc_text is None and job["spec"].get("elasticPolicy") is None:
            nproc_text = "auto"  # SetDefaults_PyTorchJob
        nproc = int(nproc_text) if str(nproc_text or "").isdigit() else 1
        env = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
        if "Master" in replicas:
            rank = index + 1 if rtype == "Worker" else index
            master = f"{job['metadata']['name']}-master-0"
            env += [
                {"name": "MASTER_PORT", "value": port},
                {"name": "PET_MASTER_PORT", "value": port},
                {"name": "MASTER_ADDR", "value": master},
                {"name": "PET_MASTER_ADDR", "value": master},
                {"name": "WORLD_SIZE", "value": str(total * nproc)},
                {"name": "RANK", "value": str(rank)},
                {"name": "PET_NODE_RANK", "value": str(rank)},
            ]
        if nproc_text is not None:
            env.append({"name": "PET_NPROC_PER_NODE", "value": str(nproc_text)})
        if job["spec"].get("elasticPolicy") is None:
            env.append({"name": "PET_NNODES", "value": str(total)})
        return env

    def sync_replicas(
        self,
        job: dict[str, Any],
        replicas: dict[str, Any],
        pods: list[dict[str, Any]],
        status: dict[str, Any],
    ) -> None:
        meta = job["metadata"]
        by_name = {p["metadata"]["name"]: p for p in pods}
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
                    create(
                        self.api,
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
                        },
                    )
                pod = by_name.get(name)
                if pod is not None and pod_phase(pod) == "Failed" and self.recreated(replica, pod):
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
                env = self.env(job, replicas, rtype, index, master_port)
                for container in pod_spec["containers"]:
                    container["env"] = [*(container.get("env") or []), *env]
                create(
                    self.api,
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
                    },
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
