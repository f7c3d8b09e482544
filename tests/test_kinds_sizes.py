"""A job too large to run is refused from its counts, before any pod (or a JobSet's Job) is made.

Each size below would take minutes or hours to expand pod by pod (a JobSet makes one task per Job,
every task checked on its own; the local engine plans every pod): the refusal answering within
pytest-timeout's bound, with one line at the field that asked for it and exit code 2, is the
proof that nothing was expanded first. No test times anything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchjob.engines.local.localcheck import MAX_PROCESSES, process_limit
from torchjob.errors import SpecError
from torchjob.jobs import load_jobs_from_text

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(60)
CLUSTER = "the most pods one Kubernetes cluster is built for"
PROCS = "processes per node, one per CPU of the largest machine Linux runs"
CONTAINER = "{name: pytorch, image: x, command: [python, x.py]}"


def _jobset(replicas: int, parallelism: int = 1) -> str:
    return f"""\
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {{name: js}}
spec:
  replicatedJobs:
    - name: w
      replicas: {replicas}
      template:
        spec:
          parallelism: {parallelism}
          completions: {parallelism}
          template: {{spec: {{containers: [{CONTAINER}]}}}}
"""


def _pytorchjob(workers: int, nproc: str = "1", elastic: str = "") -> str:
    given = f'\n  nprocPerNode: "{nproc}"' if nproc else ""
    return f"""\
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {{name: ptj}}
spec:{given}{elastic}
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template: {{spec: {{containers: [{CONTAINER}]}}}}
    Worker:
      replicas: {workers}
      template: {{spec: {{containers: [{CONTAINER}]}}}}
"""


def _trainjob(nodes: int, nproc: int = 1) -> str:
    return f"""\
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {{name: tj}}
spec:
  runtimeRef: {{name: torch-distributed}}
  trainer: {{numNodes: {nodes}, numProcPerNode: {nproc}, image: x, command: [torchrun, x.py]}}
"""


def _volcano(replicas: int, min_available: int | None = None) -> str:
    extra = f"\n      minAvailable: {min_available}" if min_available is not None else ""
    return f"""\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {{name: vj}}
spec:
  tasks:
    - name: worker
      replicas: {replicas}{extra}
      template: {{spec: {{containers: [{CONTAINER}]}}}}
"""


def _problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as err:
        load_jobs_from_text(text, "job.yaml")
    return [p.format() for p in err.value.problems]


@pytest.mark.parametrize(
    ("text", "line"),
    [
        # a JobSet's Jobs are one task each: 2**31-1 of them were made one by one (hours) before
        # the webhook's bound was told
        (_jobset(2**31 - 1), f"job.yaml:5: spec.replicatedJobs: the replicated jobs make {2**31 - 1} pods"),
        (_jobset(100_000, 2), "job.yaml:5: spec.replicatedJobs: the replicated jobs make 200000 pods in all"),
        (_jobset(3, 10**9), "job.yaml:7: spec.replicatedJobs[0].replicas: replicas times parallelism is"),
        (_trainjob(10**9), f"job.yaml:6: spec.trainer.numNodes: expected at most 150000 nodes, {CLUSTER}"),
        (_trainjob(2, 10**6), f"job.yaml:6: spec.trainer.numProcPerNode: expected at most 8192 {PROCS}"),
        (_pytorchjob(10**6), "job.yaml:6: spec.pytorchReplicaSpecs: the replica specs make 1000001 pods"),
        (_pytorchjob(2, "100000"), f"job.yaml:5: spec.nprocPerNode: expected at most 8192 {PROCS}"),
        (
            _pytorchjob(2, "", "\n  elasticPolicy: {minReplicas: 1, maxReplicas: 2, nProcPerNode: 10000}"),
            f"job.yaml:5: spec.elasticPolicy.nProcPerNode: expected at most 8192 {PROCS}",
        ),
        (_volcano(10**6), "job.yaml:5: spec.tasks: the tasks have 1000000 replicas in all"),
        (_volcano(2, 10**6), "job.yaml:8: spec.tasks[0].minAvailable: expected at most replicas (2)"),
    ],
    ids=[
        "jobset-int32-replicas",
        "jobset-pods",
        "jobset-parallelism",
        "trainjob-numNodes",
        "trainjob-numProcPerNode",
        "pytorchjob-replicas",
        "pytorchjob-nprocPerNode",
        "pytorchjob-elastic-nProcPerNode",
        "volcano-replicas",
        "volcano-minAvailable",
    ],
)
def test_a_size_no_cluster_runs_is_refused_at_its_field(text: str, line: str) -> None:
    found = _problems(text)
    assert any(p.startswith(line) for p in found), found
    assert len(found) <= 2, found  # what is wrong, not a line per pod or per Job


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TORCHJOB_HOME": str(cwd / "home")}
    return subprocess.run(
        [sys.executable, "-m", "torchjob", *args],
        capture_output=True,
        text=True,
        timeout=50,
        cwd=cwd,
        env=env,
        check=False,
    )


def test_each_verb_refuses_a_jobset_too_large_for_a_cluster_with_one_line(tmp_path: Path) -> None:
    """validate, render, run --dry-run and run: one line, exit 2, nothing started or written."""
    (tmp_path / "js.yaml").write_text(_jobset(2**31 - 1))
    want = (
        f"js.yaml:5: spec.replicatedJobs: the replicated jobs make {2**31 - 1} pods in all; "
        "expected at most 150000"
    )
    for verb in (["validate"], ["render"], ["run", "--dry-run"], ["run"]):
        done = _cli(tmp_path, *verb, "js.yaml")
        assert done.returncode == 2, (verb, done.stderr)
        assert done.stderr.startswith(want) and done.stderr.count("\n") == 1, (verb, done.stderr)
        assert "Traceback" not in done.stderr and done.stdout == "", verb
    assert not (tmp_path / "home" / "jobs").exists() or not any((tmp_path / "home" / "jobs").iterdir())


def test_the_local_engine_refuses_more_processes_than_it_can_start_before_planning(tmp_path: Path) -> None:
    """A cluster holds 140,000 pods; this machine does not start as many processes: the local
    engine tells so from the counts (its plan would hold every pod), for a run and validate --local;
    a dry run says it as the run does, after a plan of no pod."""
    assert process_limit() <= MAX_PROCESSES
    (tmp_path / "ptj.yaml").write_text(_pytorchjob(139_999, ""))
    (tmp_path / "tj.yaml").write_text(_trainjob(20_000, 4))  # 100,000 processes: torchrun's 4 and agent
    ok = _cli(tmp_path, "validate", "ptj.yaml")
    assert ok.returncode == 0, ok.stderr  # a cluster runs it
    local = f"expected at most {process_limit()} processes in all, the most the local engine starts"
    for verb in (["run"], ["validate", "--local"]):
        done = _cli(tmp_path, *verb, "ptj.yaml")
        assert done.returncode == 2, (verb, done.stderr)
        assert done.stderr.startswith("ptj.yaml:5: spec.pytorchReplicaSpecs: the job has 140000 pods;"), (
            done.stderr
        )
        assert local in done.stderr and done.stderr.count("\n") == 1, done.stderr
    done = _cli(tmp_path, "run", "tj.yaml")
    assert done.returncode == 2, done.stderr
    assert "the job has 20000 pods of up to 5 processes (torchrun and its ranks)" in done.stderr, done.stderr
    dry = _cli(tmp_path, "run", "--dry-run", "ptj.yaml")
    assert dry.returncode == 2, dry.stderr
    assert dry.stderr.startswith("ptj.yaml:5: spec.pytorchReplicaSpecs: the job has 140000 pods;"), dry.stderr
    assert "\npod " not in dry.stdout, dry.stdout[:2000]


def test_the_processes_per_pod_are_read_as_the_plugins_parse_their_flags() -> None:
    """A Volcano Job written by hand may give a plugin's flag as two arguments (``--nproc-per-node
    8``), as the plugins take it: counted alike."""
    from torchjob.engines.local.localcheck import processes_per_pod

    for nproc in (["--nproc-per-node=8"], ["--nproc-per-node", "8"]):
        flags = ["--master=master", *nproc]
        text = (
            "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: j}\nspec:\n"
            f"  plugins: {{kubeflow: {json.dumps(flags)}}}\n"
            "  tasks: [{name: master, replicas: 1, template: {spec: {containers: "
            "[{name: c, image: 'c:1', command: ['true']}]}}}]\n"
        )
        (loaded,) = load_jobs_from_text(text, "job.yaml")
        assert processes_per_pod(loaded.job) == 9, nproc


def test_slurm_refuses_more_pods_than_a_job_has_steps_before_placing_them() -> None:
    """Each pod is a job step: past Slurm's default MaxStepCount the job cannot start its pods,
    refused from the counts (the dry run placed and wrote out every step first)."""
    from torchjob.engines.slurm.plan import MAX_STEP_COUNT, PlanError, plan_job
    from torchjob.engines.slurm.settings import SlurmSettings

    (loaded,) = load_jobs_from_text(_pytorchjob(140_000, ""), "job.yaml")
    with pytest.raises(PlanError) as caught:
        plan_job(loaded.job, SlurmSettings(), "/j", ["ctl"])
    assert caught.value.path == "spec.tasks"
    assert f"the job has 140001 pods, each a job step; expected at most {MAX_STEP_COUNT}" in str(
        caught.value.message
    )


def test_a_mistake_in_a_replicated_jobs_template_is_told_once_not_once_per_job() -> None:
    """The Jobs of a replicated job are tasks of one template: its mistake is one line."""
    text = _jobset(500).replace("image: x", "image: 'bad image'")
    found = _problems(text)
    assert (
        len(found) == 1 and "containers[0].image: 'bad image' is not a valid image reference" in found[0]
    ), found


def test_tasks_of_one_template_are_each_told_at_their_own_paths() -> None:
    """A template's verdict is reused for the next task of an equal template (a JobSet's Jobs):
    each task's mistake is still told at that task's fields, in its own words."""
    template = (
        "{spec: {volumes: [{name: v, emptyDir: {}}, {name: v, emptyDir: {}}], "
        "containers: [{name: c, image: 'bad image', command: ['true']}]}}"
    )
    tasks = "".join(f"    - {{name: t{i}, replicas: 1, template: {template}}}\n" for i in range(3))
    text = (
        f"apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {{name: vj}}\nspec:\n  tasks:\n{tasks}"
    )
    found = _problems(text)
    for i in range(3):
        where = f"job.yaml:{6 + i}: spec.tasks[{i}].template.spec"
        also = f"spec.tasks[{i}].template.spec.volumes[0]"
        assert f"{where}.volumes[1].name: duplicate volume name 'v' (also {also})" in found, found
        assert any(p.startswith(f"{where}.containers[0].image: 'bad image'") for p in found), found
    assert len(found) == 6, found
