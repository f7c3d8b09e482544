"""Kubeflow Trainer v2 for ``trainer.kubeflow.org/v1alpha1`` TrainJobs on ``torch-distributed``.

From kubeflow/trainer ``master`` (``pkg/runtime/framework/plugins/{torch,jobset}``, the
``torch-distributed`` ClusterTrainingRuntime in ``manifests/base/runtimes``): one JobSet named
as the TrainJob and owned by it, with a replicated job ``node`` of one Job whose
``parallelism = completions = numNodes``; the ``node`` container takes the trainer's image,
command, args and env, the port 29500 and ``PET_NNODES``, ``PET_NPROC_PER_NODE``,
``PET_NODE_RANK`` (the completion index), ``PET_MASTER_ADDR=<job>-node-0-0.<job>`` and
``PET_MASTER_PORT=29500``. ``runtimePatches`` are merged onto the pod template (labels,
annotations, pod spec fields; containers by name). The TrainJob's ``Complete``/``Failed``
conditions are the JobSet's ``Completed``/``Failed`` (``JobSet.Status``). ``activeDeadlineSeconds``
counts from the TrainJob's creation: past it the TrainJob is ``Failed`` (``DeadlineExceeded``) and
its JobSet deleted. The webhook refuses the runtime's own ``PET_*`` variables in ``trainer.env``
(the torch plugin's ``Validate``).
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
    owner_ref,
    set_condition,
    update_status,
)

if TYPE_CHECKING:
    from kubeapi import FakeKubeAPI

API = "trainer.kubeflow.org/v1alpha1"
JOBSET = "jobset.x-k8s.io/v1alpha2"
PORT = 29500


def _merge_containers(base: list[dict[str, Any]], patch: list[dict[str, Any]]) -> None:
    for change in patch:
        container = next(c for c in base if c["name"] == change["name"])
        for key, value in change.items():
            if isinstance(value, list):
                container[key] = [*(container.get(key) or []), *value]
            elif key != "name":
                container[key] = value


RESERVED = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")


def validate(job: dict[str, Any]) -> str | None:
    reserved = [
        e["name"] for e in (job["spec"].get("trainer") or {}).get("env") or [] if e["name"] in RESERVED
    ]
    if reserved:
        return f"spec.trainer.env: must not have reserved envs, invalid envs configured: {reserved}"
    return None


class TrainJobs(Controller):
    def __init__(self, api: FakeKubeAPI) -> None:
        super().__init__(api)
        self.created = Clock()
        api.webhooks.setdefault((API, "TrainJob"), []).append(validate)

    def reconcile(self) -> None:
        for job in all_of(self.api, API, "TrainJob"):
            if job["metadata"].get("deletionTimestamp"):
                continue
            meta = job["metadata"]
            js = self.api.get(JOBSET, "JobSet", meta["name"], meta["namespace"])
            finished = has_condition(job, "Complete") or has_condition(job, "Failed")
            deadline = job["spec"].get("activeDeadlineSeconds")
            if not finished and deadline is not None and self.created.since(meta["uid"]) >= int(deadline):
                status = copy.deepcopy(job.get("status") or {})
                set_condition(status, "Failed", "DeadlineExceeded", "TrainJob exceeded its active deadline")
                update_status(self.api, job, status)
                if js is not None:
                    self.api.delete(JOBSET, "JobSet", meta["name"], meta["namespace"])
                continue
            if js is None and not finished:
                create(self.api, self.jobset(job))
            elif js is not None:
                status = copy.deepcopy(job.get("status") or {})
                conditions = [
                    c for c in status.get("conditions") or [] if c["type"] not in ("Complete", "Failed")
                ]
                for condition in (js.get("status") or {}).get("conditions") or []:
                    if condition["status"] == "True" and condition["type"] in ("Completed", "Failed"):
                        kind = "Complete" if condition["type"] == "Completed" else "Failed"
                        conditions.append({**condition, "type": kind})
                status["conditions"] = conditions
                update_status(self.api, job, status)

    def jobset(self, job: dict[str, Any]) -> dict[str, Any]:
        meta, trainer = job["metadata"], job["spec"].get("trainer") or {}
        nodes = int(trainer.get("numNodes") or 1)
        env = [
            *(trainer.get("env") or []),
            {"name": "PET_NNODES", "value": str(nodes)},
            {"name": "PET_NPROC_PER_NODE", "value": str(trainer.get("numProcPerNode") or 1)},
            {
                "name": "PET_NODE_RANK",
                "valueFrom": {
                    "fieldRef": {
                        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
                    }
                },
            },
            {"name": "PET_MASTER_ADDR", "value": f"{meta['name']}-node-0-0.{meta['name']}"},
            {"name": "PET_MASTER_PORT", "value": str(PORT)},
        ]
        container = {
            "name": "node",
            "image": trainer.get("image") or "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime",
            "env": env,
            "ports": [{"containerPort": PORT}],
        }
        for key in ("command", "args"):
            if key in trainer:
                container[key] = trainer[key]
        pod: dict[str, Any] = {"metadata": {}, "spec": {"containers": [container]}}
        for patch in job["spec"].get("runtimePatches") or []:
            for rjob in ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec", {}).get(
                "replicatedJobs"
            ) or []:
                patched = ((rjob.get("template") or {}).get("spec") or {}).get("template") or {}
                for key in ("labels", "annotations"):
                    pod["metadata"][key] = {
                        **pod["metadata"].get(key, {}),
                        **(patched.get("metadata") or {}).get(key, {}),
                    }
                for key, value in (patched.get("spec") or {}).items():
                    if key in ("containers", "initContainers"):
                        _merge_containers(pod["spec"].setdefault(key, []), value)
                    else:
                        pod["spec"][key] = value
        return {
            "apiVersion": JOBSET,
            "kind": "JobSet",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "ownerReferences": [owner_ref(job)],
            },
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "node",
                        "replicas": 1,
                        "template": {
                            "metadata": {
                                "labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
                            },
                            "spec": {"parallelism": nodes, "completions": nodes, "template": pod},
                        },
                    }
                ],
            },
        }
