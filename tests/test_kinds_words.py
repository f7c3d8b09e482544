"""A PyTorchJob's, TrainJob's or JobSet's problems are told in its own words, at its own fields:
the Volcano Job it becomes and the targets that render it never show through (its tasks, the
pytorch plugin, ``spec.tasks[i]``). Through the real CLI: ``render --target`` and
``validate --target``, one line per problem, exit 2."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from support import Ran
from torchjob.jobs import load_jobs_from_text

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent
KINDS = REPO / "examples" / "kinds"

PYTORCHJOB = """\
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: roles
spec:
  pytorchReplicaSpecs:
    Master:
      template:
        spec:
          containers: [{name: pytorch, image: train:1, command: [python, train.py]}]
    Worker:
      replicas: 2
      template:
        spec:
          containers: [{name: pytorch, image: train:2, command: [python, train.py]}]
"""


def _refused(run_main: Callable[..., Ran], file: Path, target: str) -> list[str]:
    """What ``render --target`` and ``validate --target`` say of ``file``: the same lines, exit 2."""
    lines = []
    for command in ("render", "validate"):
        result = run_main(command, "--target", target, str(file))
        assert result.returncode == 2, (command, result.stdout + result.stderr)
        assert result.stdout == ""
        assert "Traceback" not in result.stderr
        lines.append([line for line in result.stderr.splitlines() if ": warning: " not in line])
    assert lines[0] == lines[1]
    return lines[0]


def test_an_elastic_range_a_target_lacks_is_told_at_the_elastic_policy(
    run_main: Callable[..., Ran],
) -> None:
    file = KINDS / "pytorchjob-elastic.yaml"
    for target, why in (("jobset", "a JobSet has a fixed number of pods"), ("trainjob", "no elastic")):
        (line,) = _refused(run_main, file, target)
        assert line.startswith(
            f"{file}:9: spec.elasticPolicy: an elastic range of 1:2 nodes cannot be expressed by "
            f"target {target!r} ("
        ), line
        assert why in line and line.endswith("use --target pods or volcano or kubeflow"), line


def test_workers_unlike_the_master_are_told_as_the_pytorchjobs_replica_specs(
    tmp_path: Path, run_main: Callable[..., Ran]
) -> None:
    file = tmp_path / "roles.yaml"
    file.write_text(PYTORCHJOB)
    assert _refused(run_main, file, "trainjob") == [
        f"{file}:11: spec.pytorchReplicaSpecs.Worker: a Worker whose pod template differs from the "
        "Master's cannot be expressed by target 'trainjob' (every node of a TrainJob runs one image "
        "and command); use --target pods or volcano or kubeflow or jobset"
    ]


def test_a_jobset_without_a_master_is_told_at_its_replicated_jobs(
    tmp_path: Path, run_main: Callable[..., Ran]
) -> None:
    text = (KINDS / "jobset.yaml").read_text()
    file = tmp_path / "jobset.yaml"
    file.write_text("\n".join(line for line in text.splitlines() if "MASTER_ADDR" not in line) + "\n")
    for target in ("kubeflow", "trainjob"):
        (line,) = _refused(run_main, file, target)
        assert line.startswith(
            f"{file}:11: spec.replicatedJobs: a JobSet without one master pod and one replicated job "
            f"of workers cannot be expressed by target {target!r} (it needs to know them: MASTER_ADDR"
        ), line
        assert "pytorch plugin" not in line and "task" not in line, line


def test_a_jobset_of_no_pods_renders_without_a_master(tmp_path: Path, run_main: Callable[..., Ran]) -> None:
    """Its MASTER_ADDR names a pod a Job of completions 0 never makes: no master, for the targets
    that need none, and not torchjob's own internal error ('could not convert')."""
    file = tmp_path / "jobset.yaml"
    file.write_text((KINDS / "jobset.yaml").read_text().replace("completions: 2", "completions: 0"))
    file.write_text(file.read_text().replace("parallelism: 2", "parallelism: 0"))
    result = run_main("render", "--target", "volcano", str(file))
    assert result.returncode == 0, result.stderr
    (line,) = _refused(run_main, file, "kubeflow")
    assert "could not convert" not in line and "without one master pod" in line, line


def test_a_success_target_named_twice_counts_its_jobs_once() -> None:
    """It was refused as the Volcano Job's minSuccess (4 of 3 pods), or a second TaskCompleted
    policy at spec.tasks[1].policies[1]: JobSet reads it as the one replicated job."""
    text = (KINDS / "jobset.yaml").read_text()
    for operator in ("All", "Any"):
        twice = text.replace(
            "spec:\n  replicatedJobs:",
            f"spec:\n  successPolicy: {{operator: {operator}, targetReplicatedJobs: [workers, workers]}}\n"
            "  replicatedJobs:",
        )
        (loaded,) = load_jobs_from_text(twice, "jobset.yaml")
        (once,) = load_jobs_from_text(twice.replace("[workers, workers]", "[workers]"), "jobset.yaml")
        assert loaded.job.spec.min_success == once.job.spec.min_success
        assert [t.policies for t in loaded.job.spec.tasks] == [t.policies for t in once.job.spec.tasks]


THREE = """\
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: three}
spec:
  replicatedJobs:
    - name: driver
      template: {spec: {template: {spec: {containers: [{name: c, image: busybox, command: ["true"],
        env: &wired [{name: MASTER_ADDR, value: three-driver-0-0.three},
                     {name: MASTER_PORT, value: "2222"}]}]}}}}
    - name: workers
      template: {spec: {completions: 2, parallelism: 2, template: {spec: {containers: [
        {name: c, image: busybox, command: ["true"], env: *wired}]}}}}
    - name: extra
      replicas: 2
      template: {spec: {template: {spec: {containers: [{name: c, image: busybox, command: ["true"]}]}}}}
"""


def test_a_replicated_job_beside_the_master_and_workers_is_told_once_at_its_field(
    tmp_path: Path, run_main: Callable[..., Ran]
) -> None:
    """The workers are the replicated job whose env joins the master's rendezvous; the other one,
    two Jobs here, is told once, in the JobSet's words. It was torchjob's internal error ('could
    not convert ... --worker names task 'worker'') for every target, Volcano's too."""
    file = tmp_path / "three.yaml"
    file.write_text(THREE)
    assert _refused(run_main, file, "kubeflow") == [
        f"{file}:13: spec.replicatedJobs[2]: replicated job 'extra' (neither the master's nor the "
        "workers') cannot be expressed by target 'kubeflow' (it has only a master and workers); "
        "use --target pods or volcano or jobset"
    ]
    for target in ("volcano", "pods", "jobset"):
        result = run_main("render", "--target", target, str(file))
        assert result.returncode == 0, (target, result.stderr)
