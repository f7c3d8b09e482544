"""Numbers of a PyTorchJob, TrainJob or JobSet below what upstream takes: refused where upstream's
API server or controller would never run the job, each in one line at the user's own field, exit 2
(``validate`` and ``run`` alike); taken as upstream takes them where it runs the job.

- PyTorchJob ``runPolicy``: the CRD and the operator's webhook take any number, but the operator
  fails a job of a negative ``backoffLimit`` before it makes a pod, and one whose
  ``activeDeadlineSeconds`` is 0 or less as it starts;
- TrainJob ``activeDeadlineSeconds``: the CRD's minimum of 1;
- JobSet: a Job's ``backoffLimit``, ``activeDeadlineSeconds``, ``parallelism``, ... below 0 are
  refused by the API server when JobSet creates the Job (a TrainJob's runtime's too);
  ``failurePolicy.maxRestarts`` below 0 is taken and acts as 0.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from fake_pods import FakeHost
from support import Ran
from torchjob.jobs import load_jobs_from_text

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent
KINDS = REPO / "examples" / "kinds"


def _refused(run_main: Callable[..., Ran], file: Path) -> list[str]:
    """What ``validate`` and ``run --dry-run`` say of ``file``: the same lines, exit 2."""
    said = []
    for argv in (("validate", str(file)), ("run", "--dry-run", str(file))):
        result = run_main(*argv)
        assert result.returncode == 2, (argv, result.stdout + result.stderr)
        assert "Traceback" not in result.stderr
        said.append(result.stderr.splitlines())
    assert said[0] == said[1]
    return said[0]


def _pytorchjob(tmp_path: Path, run_policy: str) -> Path:
    text = (KINDS / "pytorchjob.yaml").read_text()
    file = tmp_path / "ptj.yaml"
    file.write_text(
        text.replace("spec:\n  pytorchReplicaSpecs:", f"spec:\n{run_policy}  pytorchReplicaSpecs:", 1)
    )
    return file


def test_a_pytorchjobs_negative_backoff_limit_and_deadline_are_refused_at_their_fields(
    tmp_path: Path, run_main: Callable[..., Ran]
) -> None:
    file = _pytorchjob(tmp_path, "  runPolicy:\n    backoffLimit: -1\n    activeDeadlineSeconds: -5\n")
    line = file.read_text().splitlines().index("    backoffLimit: -1") + 1
    assert _refused(run_main, file) == [
        f"{file}:{line}: spec.runPolicy.backoffLimit: expected an integer >= 0, got -1 (a negative "
        "limit fails the job before the operator makes a pod)",
        f"{file}:{line + 1}: spec.runPolicy.activeDeadlineSeconds: expected an integer >= 1, got -5 "
        "(the operator fails the job as soon as it starts)",
    ]


def test_a_pytorchjobs_deadline_of_0_is_refused_and_the_least_numbers_upstream_runs_are_taken(
    tmp_path: Path, run_main: Callable[..., Ran]
) -> None:
    """A deadline of 0 has passed when the job starts (here 0 meant no deadline at all)."""
    file = _pytorchjob(tmp_path, "  runPolicy: {activeDeadlineSeconds: 0}\n")
    (line,) = _refused(run_main, file)
    assert ": spec.runPolicy.activeDeadlineSeconds: expected an integer >= 1, got 0 (" in line, line
    file = _pytorchjob(tmp_path, "  runPolicy: {backoffLimit: 0, activeDeadlineSeconds: 1}\n")
    result = run_main("validate", str(file))
    assert result.returncode == 0, result.stderr
    (loaded,) = load_jobs_from_text(file.read_text())
    assert loaded.job.run_policy is not None
    assert (loaded.job.run_policy.backoff_limit, loaded.job.run_policy.active_deadline_seconds) == (0, 1)


def test_a_trainjobs_deadline_below_1_is_refused_as_its_crd_does(
    tmp_path: Path, run_main: Callable[..., Ran]
) -> None:
    text = (KINDS / "trainjob.yaml").read_text()
    file = tmp_path / "tj.yaml"
    file.write_text(
        text.replace("spec:\n  runtimeRef:", "spec:\n  activeDeadlineSeconds: -5\n  runtimeRef:", 1)
    )
    line = file.read_text().splitlines().index("  activeDeadlineSeconds: -5") + 1
    assert _refused(run_main, file) == [
        f"{file}:{line}: spec.activeDeadlineSeconds: expected an integer >= 1, got -5"
    ]


JOB_FIELDS = (
    "backoffLimit",
    "activeDeadlineSeconds",
    "parallelism",
    "completions",
    "backoffLimitPerIndex",
    "maxFailedIndexes",
    "ttlSecondsAfterFinished",
)


@pytest.mark.parametrize("key", JOB_FIELDS)
def test_a_jobsets_job_field_below_0_is_refused_as_the_api_server_refuses_the_job(
    key: str, tmp_path: Path, run_main: Callable[..., Ran]
) -> None:
    text = (KINDS / "jobset.yaml").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith(f"{key}:")]
    at = (
        lines.index("          backoffLimit: 0")
        if key != "backoffLimit"
        else lines.index("          completions: 2")
    )
    lines.insert(at + 1, f"          {key}: -1")
    file = tmp_path / "js.yaml"
    file.write_text("\n".join(lines) + "\n")
    assert _refused(run_main, file) == [
        f"{file}:{at + 2}: spec.replicatedJobs[0].template.spec.{key}: expected an integer >= 0, got -1 "
        "(the API server refuses such a Job)"
    ]


def test_a_replicated_job_of_no_jobs_is_not_refused_for_its_jobs_numbers(
    run_main: Callable[..., Ran],
) -> None:
    """JobSet's webhook does not check a Job's fields: of 0 replicas no Job is made, none refused."""
    doc = yaml.safe_load((KINDS / "jobset.yaml").read_text())
    spare = {**doc["spec"]["replicatedJobs"][0], "name": "spare", "replicas": 0}
    spare["template"] = {**spare["template"], "spec": {**spare["template"]["spec"], "backoffLimit": -1}}
    doc["spec"]["replicatedJobs"].append(spare)
    (loaded,) = load_jobs_from_text(yaml.safe_dump(doc), "js.yaml")
    assert [t.name for t in loaded.job.spec.tasks] == ["workers-0"]


def test_a_trainjob_runtimes_job_field_below_0_is_told_in_the_runtime(
    tmp_path: Path, run_main: Callable[..., Ran]
) -> None:
    text = (KINDS / "trainjob-runtime.yaml").read_text()
    anchor = "            spec:\n              template:\n"
    assert text.count(anchor) == 1
    file = tmp_path / "tj.yaml"
    file.write_text(
        text.replace(anchor, "            spec:\n              backoffLimit: -2\n              template:\n")
    )
    line = file.read_text().splitlines().index("              backoffLimit: -2") + 1
    assert _refused(run_main, file) == [
        f"{file}:{line}: spec.template.spec.replicatedJobs[0].template.spec.backoffLimit: expected an "
        "integer >= 0, got -2 (the API server refuses such a Job) (in document 1)"
    ]


def _jobset(max_restarts: int) -> dict[str, Any]:
    failing = {
        "restartPolicy": "Never",
        "containers": [{"name": "c", "image": "c:1", "command": ["sh", "-c", "exit 5"]}],
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "js"},
        "spec": {
            "failurePolicy": {"maxRestarts": max_restarts},
            "replicatedJobs": [
                {"name": "a", "template": {"spec": {"backoffLimit": 0, "template": {"spec": failing}}}}
            ],
        },
    }


def test_a_negative_max_restarts_fails_the_set_at_its_first_failed_job(tmp_path: Path) -> None:
    """JobSet fails the set once its restarts reach maxRestarts: -1 as 0 (it restarted twice here)."""
    for given in (-1, 0):
        (loaded,) = load_jobs_from_text(yaml.safe_dump(_jobset(given)), "js.yaml")
        report = FakeHost(loaded.job, tmp_path / str(given)).run()
        assert report.phase == "Failed", given
        assert report.retry_count == 0, (given, report.reason)
