"""A PyTorchJob's, a JobSet's and a TrainJob's restart and success rules as their controllers apply
them, run in this process through the controller and the kubelet every engine shares, over the
smallest container runtime (tests/fake_pods.py): containers are short shell commands.

- the training operator: a failed Never pod fails the job, the master's success ends it, an
  elastic job ends with its first worker, ``backoffLimit`` counts in-place restarts, an
  ``ExitCode`` replica's pod killed by a signal is made again;
- JobSet: no failure policy fails the set at a failed Job; ``maxRestarts`` restarts it; a rule's
  ``FailJobSet`` fails it at once; ``successPolicy: Any`` ends it with one Job of the targets;
- a TrainJob fails as its runtime's JobSet does (its Job's ``backoffLimit``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fake_pods import FakeHost
from torchjob.jobs import load_jobs_from_text
from torchjob.reports import JobReport

pytestmark = pytest.mark.timeout(60)

SLEEP = ["sh", "-c", "sleep 30"]


def _run(doc: dict[str, Any], tmp_path: Path) -> tuple[JobReport, FakeHost]:
    (loaded,) = load_jobs_from_text(yaml.safe_dump(doc), "job.yaml")
    host = FakeHost(loaded.job, tmp_path)
    return host.run(), host


def _replica(command: list[str], policy: str | None = None, replicas: int = 1) -> dict[str, Any]:
    spec: dict[str, Any] = {"replicas": replicas}
    if policy is not None:
        spec["restartPolicy"] = policy
    spec["template"] = {"spec": {"containers": [{"name": "pytorch", "image": "t:1", "command": command}]}}
    return spec


def _pytorchjob(replicas: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "ptj"},
        "spec": {**spec, "pytorchReplicaSpecs": replicas},
    }


def _phases(report: JobReport) -> dict[str, str]:
    return {p.short: p.phase for p in report.pods}


def test_the_masters_failure_fails_a_pytorchjob_and_stops_its_workers(tmp_path: Path) -> None:
    doc = _pytorchjob(
        {
            "Master": _replica(["sh", "-c", "sleep 0.3; exit 3"], "Never"),
            "Worker": _replica(SLEEP, "Never", 2),
        }
    )
    report, _ = _run(doc, tmp_path)
    assert report.phase == "Failed"
    assert report.reason.startswith("rank 0 (pod master-0) failed with exit code 3; nothing was restarted"), (
        report.reason
    )
    assert report.retry_count == 0
    assert all(phase != "Running" for phase in _phases(report).values())


def test_the_masters_success_ends_a_pytorchjob_whatever_its_workers_do(tmp_path: Path) -> None:
    doc = _pytorchjob({"Master": _replica(["true"], "OnFailure"), "Worker": _replica(SLEEP, "OnFailure", 2)})
    report, _ = _run(doc, tmp_path)
    assert report.phase == "Completed", report.reason
    assert _phases(report)["master-0"] == "Succeeded"


def test_an_elastic_pytorchjob_ends_with_its_first_worker(tmp_path: Path) -> None:
    command = [
        "sh",
        "-c",
        'if [ "$PET_NNODES" = 1:2 ] && [ -n "$PET_RDZV_ENDPOINT" ]; then exit 0; fi; exit 9',
    ]
    doc = _pytorchjob(
        {"Worker": _replica(command, "OnFailure", 2)}, elasticPolicy={"minReplicas": 1, "maxReplicas": 2}
    )
    report, _ = _run(doc, tmp_path)
    assert report.phase == "Completed", report.reason
    assert "minSuccess 1 reached" in report.reason


def test_a_pytorchjobs_backoff_limit_counts_in_place_restarts(tmp_path: Path) -> None:
    doc = _pytorchjob(
        {"Master": _replica(["sh", "-c", "exit 4"], "OnFailure"), "Worker": _replica(SLEEP, "Never")},
        runPolicy={"backoffLimit": 1},
    )
    report, _ = _run(doc, tmp_path)
    assert report.phase == "Failed"
    assert "task master restarted containers 1 times" in report.reason, report.reason
    master = next(p for p in report.pods if p.short == "master-0")
    assert master.restarts == 1


def test_an_exitcode_replica_makes_a_killed_pod_again(tmp_path: Path) -> None:
    # The first attempt is killed by SIGKILL (137: retried); the second exits 0.
    script = 'if [ -e "$MARK" ]; then exit 0; fi; touch "$MARK"; kill -9 $$$$'  # $$: Kubernetes' escape of $
    master = _replica(["sh", "-c", script], "ExitCode")
    master["template"]["spec"]["containers"][0]["env"] = [{"name": "MARK", "value": str(tmp_path / "mark")}]
    report, _ = _run(_pytorchjob({"Master": master}), tmp_path)
    assert report.phase == "Completed", report.reason
    assert next(p for p in report.pods if p.short == "master-0").attempt == 1
    # ... and a program's own error (1-127) fails the job.
    failing = _pytorchjob({"Master": _replica(["sh", "-c", "exit 2"], "ExitCode")})
    report, _ = _run(failing, tmp_path / "again")
    assert report.phase == "Failed" and "exit code 2" in report.reason


def _jobset(*rjobs: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "js"},
        "spec": {**spec, "replicatedJobs": list(rjobs)},
    }


def _rjob(name: str, command: list[str], policy: str = "Never", pods: int = 1, **job: Any) -> dict[str, Any]:
    template = {
        "spec": {"restartPolicy": policy, "containers": [{"name": "c", "image": "c:1", "command": command}]}
    }
    return {
        "name": name,
        "template": {
            "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0, **job, "template": template}
        },
    }


def test_a_failed_job_fails_a_jobset_without_a_failure_policy(tmp_path: Path) -> None:
    report, _ = _run(_jobset(_rjob("a", ["sh", "-c", "exit 5"]), _rjob("b", SLEEP)), tmp_path)
    assert report.phase == "Failed" and report.retry_count == 0
    assert "pod a-0-0 failed with exit code 5" in report.reason


def test_a_jobset_restarts_max_restarts_times_then_fails(tmp_path: Path) -> None:
    doc = _jobset(
        _rjob("a", ["sh", "-c", "sleep 0.2; exit 5"]), _rjob("b", SLEEP), failurePolicy={"maxRestarts": 1}
    )
    report, _ = _run(doc, tmp_path)
    assert report.phase == "Failed"
    assert report.retry_count == 1, report.reason  # one restart of the whole set


def test_a_failjobset_rule_fails_the_set_at_once(tmp_path: Path) -> None:
    rule = {"name": "stop", "action": "FailJobSet", "targetReplicatedJobs": ["a"]}
    doc = _jobset(
        _rjob("a", ["sh", "-c", "exit 5"]),
        _rjob("b", SLEEP),
        failurePolicy={"maxRestarts": 3, "rules": [rule]},
    )
    report, _ = _run(doc, tmp_path)
    assert report.phase == "Failed" and report.retry_count == 0


def test_success_policy_any_ends_the_set_with_one_job_of_its_targets(tmp_path: Path) -> None:
    doc = _jobset(
        _rjob("leader", SLEEP),
        {**_rjob("workers", ["true"], pods=2), "replicas": 2},
        successPolicy={"operator": "Any", "targetReplicatedJobs": ["workers"]},
    )
    report, _ = _run(doc, tmp_path)
    assert report.phase == "Completed", report.reason
    assert _phases(report)["leader-0-0"] != "Succeeded"


def test_a_trainjob_fails_as_its_runtimes_job_does(tmp_path: Path) -> None:
    runtime = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "strict"},
        "spec": {
            "mlPolicy": {"torch": {}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "metadata": {
                                    "labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
                                },
                                "spec": {
                                    "backoffLimit": 0,
                                    "template": {"spec": {"containers": [{"name": "node", "image": "n:1"}]}},
                                },
                            },
                        }
                    ]
                }
            },
        },
    }
    job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "tj"},
        "spec": {
            "runtimeRef": {"name": "strict"},
            "trainer": {
                "numNodes": 2,
                "command": ["sh", "-c", 'if [ "$PET_NODE_RANK" = 1 ]; then exit 6; fi; sleep 30'],
            },
        },
    }
    (loaded,) = load_jobs_from_text(yaml.safe_dump_all([runtime, job]), "job.yaml")
    report = FakeHost(loaded.job, tmp_path).run()
    assert report.phase == "Failed"
    # OnFailure (JobSet's default): the first in-place restart passes the Job's backoffLimit 0.
    assert "task node-0 restarted containers 1 times" in report.reason, report.reason
