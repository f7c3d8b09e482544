"""JobSet's controller (kubernetes-sigs/jobset ``pkg/controllers``) for ``jobset.x-k8s.io/v1alpha2``.

- Webhook defaults: ``successPolicy {operator: All}``, DNS hostnames with the JobSet's name as
  subdomain, pod ``restartPolicy: OnFailure`` when unset, ``completionMode: Indexed``.
- ``constructJob``: ``replicas`` child Jobs per replicated job, ``<jobset>-<rjob>-<index>``, the
  Job and its pod template labelled and annotated with the JobSet's name, the replicated job,
  its job index, the global job index (``globalJobIndex``: the replicas of the replicated jobs
  before it plus the index) and the restart attempt; the pods get the subdomain. A headless
  Service named after the subdomain. ``startupPolicy: InOrder`` creates a replicated job only
  once every Job of the ones before it is ready.
- ``failure_policy.go``: a failed child Job fails the JobSet (``FailedJobs``) when there is no
  failure policy; with one, the first rule whose ``onJobFailureReasons`` (and target replicated
  jobs) match the Job's failure decides: ``FailJobSet`` fails it (``FailJobSetFailurePolicyAction``);
  no rule, or ``RestartJobSet``, restarts it (``status.restarts`` + 1, the old Jobs deleted and
  made again, their pods labelled with the new restart attempt) until ``maxRestarts``, then fails
  (``ReachedMaxRestarts``).
- ``jobset_webhook.go``: refuses a JobSet whose longest pod name
  (``<jobset>-<rjob>-<replicas-1>-<completions-1>-xxxxx``) is not a DNS-1035 label of 63
  characters at most, or whose failure-policy rule names a job failure reason Jobs do not have.
- ``success_policy.go``: ``Completed`` (``AllJobsCompleted``) once the Jobs the policy targets
  succeeded: all of them, or any one for ``operator: Any``; active Jobs are then deleted.
- ``ttl_after_finished.go``: a finished JobSet is deleted (foreground) ``ttlSecondsAfterFinished``
  after it finished.
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
    set_condition,
    update_status,
)

if TYPE_CHECKING:
    from kubeapi import FakeKubeAPI

API = "jobset.x-k8s.io/v1alpha2"
KEY = "jobset.sigs.k8s.io"


def global_index(js: dict[str, Any], rjob: str, index: int) -> int:
    before = 0
    for replicated in js["spec"]["replicatedJobs"]:
        if replicated["name"] == rjob:
            return before + index
        before += int(replicated.get("replicas", 1))
    raise AssertionError(f"no replicated job {rjob}")


JOB_FAILURE_REASONS = (
    "BackoffLimitExceeded",
    "DeadlineExceeded",
    "FailedIndexes",
    "MaxFailedIndexesExceeded",
    "PodFailurePolicy",
)


def validate(js: dict[str, Any]) -> str | None:
    """The JobSet webhook's refusals that a rendered JobSet could meet."""
    name = js["metadata"]["name"]
    for rjob in js["spec"]["replicatedJobs"]:
        job_spec = rjob["template"]["spec"]
        longest = (
            f"{name}-{rjob['name']}-{int(rjob.get('replicas', 1)) - 1}-"
            f"{max(int(job_spec.get('completions') or 1), int(job_spec.get('parallelism') or 1)) - 1}-abcde"
        )
        if len(longest) > 63:
            return f"spec.replicatedJobs: Invalid value: {longest!r}: must be no more than 63 characters"
    for rule in (js["spec"].get("failurePolicy") or {}).get("rules") or []:
        for reason in rule.get("onJobFailureReasons") or []:
            if reason not in JOB_FAILURE_REASONS:
                return f"invalid job failure reason '{reason}' in failure policy is not recognized"
    return None


class JobSets(Controller):
    def __init__(self, api: FakeKubeAPI) -> None:
        super().__init__(api)
        self.finished = Clock()
        api.webhooks.setdefault((API, "JobSet"), []).append(validate)

    def reconcile(self) -> None:
        for js in all_of(self.api, API, "JobSet"):
            if not js["metadata"].get("deletionTimestamp"):
                self.sync(js)

    def sync(self, js: dict[str, Any]) -> None:
        meta, spec = js["metadata"], js["spec"]
        status = copy.deepcopy(js.get("status") or {})
        restarts = int(status.get("restarts") or 0)
        jobs = owned(self.api, "batch/v1", "Job", js)
        if has_condition(js, "Completed") or has_condition(js, "Failed"):
            for job in jobs:
                if not (has_condition(job, "Complete") or has_condition(job, "Failed")):
                    self.api.delete("batch/v1", "Job", job["metadata"]["name"], meta["namespace"])
            ttl = spec.get("ttlSecondsAfterFinished")
            if ttl is not None and self.finished.since(meta["uid"]) >= ttl:
                self.api.delete(API, "JobSet", meta["name"], meta["namespace"], foreground=True)
            return
        current = []
        for job in jobs:
            if int(job["metadata"]["labels"][f"{KEY}/restart-attempt"]) < restarts:
                self.api.delete("batch/v1", "Job", job["metadata"]["name"], meta["namespace"])
            else:
                current.append(job)
        failed = [j for j in current if has_condition(j, "Failed")]
        succeeded = [j for j in current if has_condition(j, "Complete")]
        policy = spec.get("failurePolicy")
        if failed:
            first = failed[0]["metadata"]["name"]
            rule = self.matching_rule(policy, failed)
            if rule is not None and rule.get("action") == "FailJobSet":
                set_condition(
                    status,
                    "Failed",
                    "FailJobSetFailurePolicyAction",
                    f"applying FailJobSet failure policy action (first failed job: {first})",
                )
            elif policy is None:
                set_condition(
                    status,
                    "Failed",
                    "FailedJobs",
                    f"jobset failed due to one or more job failures (first failed job: {first})",
                )
            elif int(status.get("restartsCountTowardsMax") or 0) >= int(policy.get("maxRestarts") or 0):
                set_condition(
                    status,
                    "Failed",
                    "ReachedMaxRestarts",
                    "jobset failed due to reaching max number of restarts",
                )
            else:
                status["restarts"] = restarts + 1
                status["restartsCountTowardsMax"] = int(status.get("restartsCountTowardsMax") or 0) + 1
        elif succeeded and self.succeeded(js, succeeded):
            set_condition(status, "Completed", "AllJobsCompleted", "jobset completed successfully")
        else:
            self.create_jobs(js, current, restarts)
        if has_condition({"status": status}, "Completed") or has_condition({"status": status}, "Failed"):
            self.finished.since(meta["uid"])
        update_status(self.api, js, status)

    @staticmethod
    def matching_rule(policy: dict[str, Any] | None, failed: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The first rule matching some failed Job's failure reason and replicated job."""
        for rule in (policy or {}).get("rules") or []:
            for job in failed:
                reason = next(
                    (
                        c.get("reason")
                        for c in job["status"].get("conditions") or []
                        if c.get("type") == "Failed"
                    ),
                    "",
                )
                reasons = rule.get("onJobFailureReasons") or []
                targets = rule.get("targetReplicatedJobs") or []
                if (not reasons or reason in reasons) and (
                    not targets or job["metadata"]["labels"][f"{KEY}/replicatedjob-name"] in targets
                ):
                    return dict(rule)
        return None

    @staticmethod
    def succeeded(js: dict[str, Any], done: list[dict[str, Any]]) -> bool:
        policy = js["spec"].get("successPolicy") or {"operator": "All"}
        targets = policy.get("targetReplicatedJobs") or [r["name"] for r in js["spec"]["replicatedJobs"]]
        matching = [j for j in done if j["metadata"]["labels"][f"{KEY}/replicatedjob-name"] in targets]
        if policy.get("operator") == "Any":
            return bool(matching)
        wanted = sum(int(r.get("replicas", 1)) for r in js["spec"]["replicatedJobs"] if r["name"] in targets)
        return len(matching) >= wanted

    def create_jobs(self, js: dict[str, Any], current: list[dict[str, Any]], restarts: int) -> None:
        meta, spec = js["metadata"], js["spec"]
        subdomain = (spec.get("network") or {}).get("subdomain") or meta["name"]
        if self.api.get("v1", "Service", subdomain, meta["namespace"]) is None:
            create(
                self.api,
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {
                        "name": subdomain,
                        "namespace": meta["namespace"],
                        "ownerReferences": [owner_ref(js)],
                    },
                    "spec": {
                        "clusterIP": "None",
                        "selector": {f"{KEY}/jobset-name": meta["name"]},
                        "publishNotReadyAddresses": True,
                    },
                },
            )
        names = {j["metadata"]["name"]: j for j in current}
        in_order = (spec.get("startupPolicy") or {}).get("startupPolicyOrder") == "InOrder"
        total = sum(int(r.get("replicas", 1)) for r in spec["replicatedJobs"])
        for rjob in spec["replicatedJobs"]:
            mine = [f"{meta['name']}-{rjob['name']}-{i}" for i in range(int(rjob.get("replicas", 1)))]
            for index, name in enumerate(mine):
                if name in names:
                    continue
                ids = {
                    f"{KEY}/jobset-name": meta["name"],
                    f"{KEY}/jobset-uid": meta["uid"],
                    f"{KEY}/replicatedjob-name": rjob["name"],
                    f"{KEY}/replicatedjob-replicas": str(rjob.get("replicas", 1)),
                    f"{KEY}/global-replicas": str(total),
                    f"{KEY}/job-index": str(index),
                    f"{KEY}/job-global-index": str(global_index(js, rjob["name"], index)),
                    f"{KEY}/restart-attempt": str(restarts),
                }
                template = copy.deepcopy(rjob["template"])
                job_spec = template["spec"]
                job_spec.setdefault("completionMode", "Indexed")
                pod = job_spec["template"]
                pod_meta = pod.setdefault("metadata", {})
                pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **ids}
                pod_meta["annotations"] = {**(pod_meta.get("annotations") or {}), **ids}
                pod["spec"].setdefault("restartPolicy", "OnFailure")
                pod["spec"]["subdomain"] = subdomain
                job_meta = template.get("metadata") or {}
                create(
                    self.api,
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "metadata": {
                            "name": name,
                            "namespace": meta["namespace"],
                            "labels": {**(job_meta.get("labels") or {}), **ids},
                            "annotations": {**(job_meta.get("annotations") or {}), **ids},
                            "ownerReferences": [owner_ref(js)],
                        },
                        "spec": job_spec,
                    },
                )
            if in_order and not all(self.ready(names.get(n)) for n in mine):
                return  # the next replicated job waits until these are ready

    @staticmethod
    def ready(job: dict[str, Any] | None) -> bool:
        if job is None:
            return False
        status, spec = job.get("status") or {}, job["spec"]
        wanted = int(spec.get("parallelism") or 1)
        return int(status.get("ready") or 0) + int(status.get("succeeded") or 0) >= wanted
