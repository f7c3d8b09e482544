"""Kubernetes' Job controller (``pkg/controller/job``) for the Indexed Jobs JobSet creates.

- One pod per completion index not yet succeeded and without a running pod, named
  ``<job>-<index>-<5 random characters>``, with the index as the label and annotation
  ``batch.kubernetes.io/job-completion-index`` and, when the template has a subdomain, the
  hostname ``<job>-<index>``.
- ``backoffLimit`` (6 when unset): under ``restartPolicy: Never`` every failed pod counts and a new
  pod replaces it; under ``OnFailure`` the restarts of the containers of its running pods count
  (``pastBackoffLimitOnFailure``). Past the limit the Job gets ``Failed`` with reason
  ``BackoffLimitExceeded`` and its running pods are deleted.
- ``activeDeadlineSeconds``: counted from the Job's start; past it the Job gets ``Failed`` with
  reason ``DeadlineExceeded`` and its active pods are deleted (``pastActiveDeadline``).
- ``Complete`` once every index succeeded.
"""

from __future__ import annotations

import copy
import secrets
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

INDEX = "batch.kubernetes.io/job-completion-index"
DEFAULT_BACKOFF_LIMIT = 6


class BatchJobs(Controller):
    def __init__(self, api: FakeKubeAPI) -> None:
        super().__init__(api)
        self.started = Clock()

    def reconcile(self) -> None:
        for job in all_of(self.api, "batch/v1", "Job"):
            if not job["metadata"].get("deletionTimestamp") and not (
                has_condition(job, "Complete") or has_condition(job, "Failed")
            ):
                self.sync(job)

    def sync(self, job: dict[str, Any]) -> None:
        meta, spec = job["metadata"], job["spec"]
        completions = int(spec.get("completions") or 1)
        limit = int(spec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT))
        template = spec["template"]
        policy = template["spec"].get("restartPolicy") or "OnFailure"
        pods = owned(self.api, "v1", "Pod", job)
        status = copy.deepcopy(job.get("status") or {})
        failed = sum(1 for p in pods if pod_phase(p) == "Failed")
        if policy == "OnFailure":
            failed += sum(
                int(c.get("restartCount") or 0)
                for p in pods
                if pod_phase(p) == "Running"
                for c in (p.get("status") or {}).get("containerStatuses") or []
            )
        succeeded = {p["metadata"]["labels"][INDEX] for p in pods if pod_phase(p) == "Succeeded"}
        active = [p for p in pods if pod_phase(p) in ("Pending", "Running")]
        status.update(
            active=len(active),
            ready=sum(1 for p in active if pod_phase(p) == "Running"),
            succeeded=len(succeeded),
            failed=failed,
        )
        deadline = spec.get("activeDeadlineSeconds")
        if deadline is not None and self.started.since(meta["uid"]) >= int(deadline):
            set_condition(
                status, "Failed", "DeadlineExceeded", "Job was active longer than specified deadline"
            )
            for pod in active:
                self.api.delete("v1", "Pod", pod["metadata"]["name"], meta["namespace"])
        elif (failed > limit) if policy == "Never" else (failed >= limit if limit else failed > 0):
            set_condition(
                status, "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"
            )
            for pod in active:
                self.api.delete("v1", "Pod", pod["metadata"]["name"], meta["namespace"])
        elif len(succeeded) >= completions:
            set_condition(
                status, "Complete", "CompletionsReached", "Reached expected number of succeeded pods"
            )
        else:
            busy = {p["metadata"]["labels"][INDEX] for p in active} | succeeded
            for index in range(completions):
                if str(index) not in busy:
                    self.create_pod(job, index)
        update_status(self.api, job, status)

    def create_pod(self, job: dict[str, Any], index: int) -> None:
        meta = job["metadata"]
        template = copy.deepcopy(job["spec"]["template"])
        labels = {
            **(template.get("metadata") or {}).get("labels", {}),
            INDEX: str(index),
            "job-name": meta["name"],
        }
        annotations = {**(template.get("metadata") or {}).get("annotations", {}), INDEX: str(index)}
        pod_spec = template["spec"]
        if pod_spec.get("subdomain"):
            pod_spec["hostname"] = f"{meta['name']}-{index}"
        create(
            self.api,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{meta['name']}-{index}-{secrets.token_hex(3)[:5]}",
                    "namespace": meta["namespace"],
                    "labels": labels,
                    "annotations": annotations,
                    "ownerReferences": [owner_ref(job)],
                },
                "spec": pod_spec,
                "status": {"phase": "Pending"},
            },
        )
