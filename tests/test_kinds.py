"""PyTorchJob, TrainJob and JobSet files read into the Volcano Job torchjob runs (spec/kinds/):
what each becomes (tasks, the controller's plugin, restart and success rules), and every mistake
told at the kind's own field path and line, all at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from torchjob.errors import SpecError
from torchjob.jobs import LoadedJob, load_jobs, load_jobs_from_text
from torchjob.spec.manifest import job_manifest

REPO = Path(__file__).resolve().parent.parent
KINDS = REPO / "examples" / "kinds"

pytestmark = pytest.mark.timeout(120)


def read(text: str, file: str = "job.yaml") -> list[LoadedJob]:
    return load_jobs_from_text(text, file)


def problems(text: str, file: str = "job.yaml") -> list[str]:
    with pytest.raises(SpecError) as err:
        read(text, file)
    return [p.format() for p in err.value.problems]


def manifest(loaded: LoadedJob) -> dict[str, Any]:
    return job_manifest(loaded.job)


def tasks(loaded: LoadedJob) -> list[tuple[str, int]]:
    return [(t.name, t.replicas) for t in loaded.job.spec.tasks]


PYTORCHJOB = """\
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: ptj}
spec:
  nprocPerNode: "2"
  runPolicy: {backoffLimit: 3, activeDeadlineSeconds: 600, ttlSecondsAfterFinished: 60}
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      restartPolicy: Never
      template:
        spec:
          containers: [{name: pytorch, image: "train:1", command: [torchrun, train.py]}]
    worker:
      replicas: 2
      template:
        spec:
          containers:
            - name: pytorch
              image: "train:1"
              command: [torchrun, train.py]
              ports: [{name: pytorchjob-port, containerPort: 29400}]
"""


def test_a_pytorchjob_is_a_master_and_workers_with_the_operators_rules() -> None:
    (loaded,) = read(PYTORCHJOB)
    job = loaded.job
    assert tasks(loaded) == [("master", 1), ("worker", 2)]
    assert job.kind is not None and (job.kind.kind, job.kind.target) == ("PyTorchJob", "kubeflow")
    assert job.spec.plugins["kubeflow"] == [
        "--master=master",
        "--worker=worker",
        "--port=23456",
        "--nproc-per-node=2",
    ]
    master, worker = job.spec.tasks
    # Never: the operator fails the job at the master's failure; the master's success ends it.
    assert master.template.restart_policy == "Never"
    assert [(p.events, p.action) for p in master.policies] == [
        (["PodFailed"], "TerminateJob"),
        (["TaskCompleted"], "CompleteJob"),
    ]
    # The replica's default restartPolicy, OnFailure, restarts in place; backoffLimit counts restarts.
    assert worker.template.restart_policy == "OnFailure"
    assert worker.max_retry == 3 and [(p.events, p.action) for p in worker.policies] == [
        (["TaskFailed"], "TerminateJob")
    ]
    assert job.run_policy is not None and job.run_policy.active_deadline_seconds == 600
    assert job.spec.ttl_seconds_after_finished == 60
    # The operator's default port on the master's pytorch container (SetDefaults_PyTorchJob).
    assert master.template.containers[0].ports == [{"name": "pytorchjob-port", "containerPort": 23456}]
    assert job.origin == "pytorchjob"


def test_an_exitcode_replica_makes_a_killed_pod_again_and_fails_on_its_own_errors() -> None:
    text = PYTORCHJOB.replace("restartPolicy: Never", "restartPolicy: ExitCode")
    (loaded,) = read(text)
    master = loaded.job.spec.tasks[0]
    codes = [p.exit_code for p in master.policies if p.exit_code is not None]
    assert codes == list(range(128, 256)) and all(
        p.action == "RestartPod" for p in master.policies if p.exit_code is not None
    )
    assert master.template.restart_policy == "Never"
    assert loaded.job.spec.max_retry == 2**31 - 1  # a pod made again costs the job nothing


def test_an_elastic_pytorchjob_succeeds_with_its_first_worker() -> None:
    (loaded,) = load_jobs(str(KINDS / "pytorchjob-elastic.yaml"))
    job = loaded.job
    assert tasks(loaded) == [("worker", 2)] and job.spec.min_success == 1
    flags = job.spec.plugins["kubeflow"]
    assert "--elastic" in flags and "--min-replicas=1" in flags and "--max-replicas=2" in flags
    assert "--max-restarts=3" in flags and "--rdzv-backend=c10d" in flags


def test_a_jobset_is_a_task_per_child_job_with_jobsets_rules() -> None:
    text = """\
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: js}
spec:
  network: {subdomain: net}
  startupPolicy: {startupPolicyOrder: InOrder}
  successPolicy: {operator: Any, targetReplicatedJobs: [driver]}
  failurePolicy:
    maxRestarts: 2
    rules: [{name: driver_fails, action: FailJobSet, targetReplicatedJobs: [driver]}]
  replicatedJobs:
    - name: driver
      template:
        spec:
          backoffLimit: 0
          template:
            spec:
              restartPolicy: Never
              containers: [{name: d, image: "d:1", command: [run]}]
    - name: workers
      replicas: 2
      template:
        spec:
          parallelism: 3
          completions: 3
          backoffLimit: 4
          template:
            spec:
              containers: [{name: w, image: "w:1", command: [run]}]
"""
    (loaded,) = read(text)
    job = loaded.job
    assert tasks(loaded) == [("driver-0", 1), ("workers-0", 3), ("workers-1", 3)]
    driver, w0, w1 = job.spec.tasks
    assert [(p.events, p.action) for p in driver.policies] == [
        (["PodFailed"], "TerminateJob"),  # FailJobSet for the driver's Jobs
        (["TaskCompleted"], "CompleteJob"),  # operator Any of the driver
    ]
    assert w0.template.restart_policy == "OnFailure" and w0.max_retry == 4  # JobSet's default policy
    assert [(p.events, p.action) for p in w0.policies] == [(["TaskFailed"], "RestartJob")]
    assert job.spec.max_retry == 3  # maxRestarts 2: the third failure fails the set
    assert w0.depends_on is not None and w0.depends_on.names == ["driver-0"] and w1.depends_on is not None
    assert w0.template.subdomain == "net" and job.spec.plugins["jobset"] == ["--subdomain=net"]


def test_a_trainjob_is_its_runtimes_jobset_with_the_trainer_in_it() -> None:
    (loaded,) = load_jobs(str(KINDS / "trainjob-runtime.yaml"))
    job = loaded.job
    assert job.kind is not None and job.kind.kind == "TrainJob"
    assert tasks(loaded) == [("node-0", 3)]
    (container,) = job.spec.tasks[0].template.containers
    assert container.raw["image"] == "torchjob-examples:latest"  # the runtime's: the trainer names none
    assert container.command[:2] == ["sh", "-c"]
    assert container.raw["volumeMounts"] == [{"name": "scratch", "mountPath": "/scratch"}]
    assert {"containerPort": 29500} in container.ports
    assert job.spec.tasks[0].template.metadata["labels"] == {"team": "research"}  # the runtime patch
    # A CPU asked for per node and no numProcPerNode: one process per CPU (Trainer's rule).
    assert job.spec.plugins["trainer"] == ["--node=node-0", "--container=node", "--nproc-per-node=1"]
    assert job.spec.tasks[0].max_retry == 6  # batch/v1's backoffLimit, the runtime naming none


def test_numprocpernode_from_the_resources_a_trainjob_asks_for() -> None:
    base = yaml.safe_load((KINDS / "trainjob.yaml").read_text())
    del base["spec"]["trainer"]["numProcPerNode"]
    cases = [
        ({"requests": {"cpu": "3"}}, "3"),
        ({"limits": {"cpu": "1500m"}}, "2"),
        ({"limits": {"nvidia.com/gpu": 1}}, "auto"),
        (None, "1"),
        # Trainer reads the CPUs requested before the limit (Kubeflow Trainer's example 02 asks
        # 2 and allows 4: 2 processes per node), and a GPU count of 0 is no GPU node.
        ({"requests": {"cpu": "2"}, "limits": {"cpu": "4"}}, "2"),
        ({"requests": {"cpu": "0"}, "limits": {"cpu": "4"}}, "4"),
        ({"requests": {"cpu": "3", "nvidia.com/gpu": 0}}, "3"),
    ]
    for resources, want in cases:
        doc = {**base, "spec": {**base["spec"], "trainer": dict(base["spec"]["trainer"])}}
        if resources is not None:
            doc["spec"]["trainer"]["resourcesPerNode"] = resources
        (loaded,) = read(yaml.safe_dump(doc))
        assert f"--nproc-per-node={want}" in loaded.job.spec.plugins["trainer"], resources


def test_a_trainjobs_resources_per_node_replace_the_runtimes_as_trainer_does() -> None:
    """Trainer sets the node container's resources to resourcesPerNode, whole: a runtime's memory
    request does not stay beside the TrainJob's CPUs."""
    text = (KINDS / "trainjob-runtime.yaml").read_text()
    text = text.replace('requests: {cpu: "1"}', 'requests: {cpu: "1", memory: 1Gi}')
    text = text.replace("    numNodes: 3\n", "    numNodes: 3\n    resourcesPerNode: {limits: {cpu: '2'}}\n")
    (loaded,) = read(text)
    (container,) = loaded.job.spec.tasks[0].template.containers
    assert container.raw["resources"] == {"limits": {"cpu": "2"}}
    assert "--nproc-per-node=2" in loaded.job.spec.plugins["trainer"]


def test_a_file_mixes_kinds_and_its_trainjobs_find_its_runtimes() -> None:
    text = "---\n".join(
        [
            (REPO / "examples" / "pytorch-job.yaml").read_text(),
            (KINDS / "pytorchjob.yaml").read_text(),
            (KINDS / "jobset.yaml").read_text(),
            (KINDS / "trainjob-runtime.yaml").read_text(),  # a runtime and a TrainJob
        ]
    )
    loaded = read(text)
    assert [(i.job.kind.kind if i.job.kind else "Job") for i in loaded] == [
        "Job",
        "PyTorchJob",
        "JobSet",
        "TrainJob",
    ]


def test_mistakes_are_told_at_the_kinds_own_paths_and_lines_all_at_once() -> None:
    text = """\
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: 1bad}
spec:
  runPolicy: {cleanPodPolicy: Runing, backofLimit: 3}
  pytorchReplicaSpecs:
    Master:
      replicas: 2
      restartPolicy: OnFaliure
      template:
        spec:
          containers:
            - name: trainer
              image: "bad image"
              comand: [python]
    Workers: {replicas: 1}
"""
    found = problems(text)
    for want in [
        "job.yaml:3: metadata.name: '1bad' must start with a letter",
        "job.yaml:5: spec.runPolicy.cleanPodPolicy: expected one of None, Running, All, got 'Runing'; "
        "did you mean 'Running'?",
        "job.yaml:5: spec.runPolicy.backofLimit: unknown field 'backofLimit'; did you mean 'backoffLimit'?",
        "job.yaml:8: spec.pytorchReplicaSpecs.Master.replicas: a PyTorchJob's Master has exactly 1 "
        "replica, got 2",
        "job.yaml:9: spec.pytorchReplicaSpecs.Master.restartPolicy: expected one of Always, OnFailure, "
        "Never, ExitCode, got 'OnFaliure'; did you mean 'OnFailure'?",
        "job.yaml:12: spec.pytorchReplicaSpecs.Master.template.spec.containers: the operator needs a "
        "container named 'pytorch'",
        "job.yaml:14: spec.pytorchReplicaSpecs.Master.template.spec.containers[0].image: 'bad image' is "
        "not a valid image reference",
        "job.yaml:15: spec.pytorchReplicaSpecs.Master.template.spec.containers[0].comand: unknown field "
        "'comand'; did you mean 'command'?",
        "job.yaml:16: spec.pytorchReplicaSpecs.Workers: unknown replica type 'Workers'",
    ]:
        assert any(line.startswith(want) for line in found), f"{want}\n" + "\n".join(found)
    assert len(found) == 9, found


def test_wrong_types_and_typos_of_a_trainjob_and_a_jobset() -> None:
    trainjob = """\
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {name: tj}
spec:
  runtimeRef: {name: torch-distributed}
  trainer:
    numNodes: "2"
    image: "bad image"
    env: [{name: PET_NNODES, value: "4"}]
    comand: [x]
"""
    found = problems(trainjob)
    assert "job.yaml:7: spec.trainer.numNodes: expected an integer, got string '2'" in found
    assert "job.yaml:10: spec.trainer.comand: unknown field 'comand'; did you mean 'command'?" in found
    assert any(
        p.startswith("job.yaml:9: spec.trainer.env[0].name: PET_NNODES is set by the TrainJob's")
        for p in found
    )
    # The trainer's image is the node container's: told at the trainer's field.
    assert any(
        p.startswith("job.yaml:8: spec.trainer.image: 'bad image' is not a valid image") for p in found
    ), found
    jobset = """\
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: js}
spec:
  successPolicy: {operator: All, targetReplicatedJobs: [nope]}
  replicatedJobs:
    - name: w
      replicas: two
      template:
        spec:
          backofLimit: 0
          template:
            spec:
              containers: [{name: w, image: "w:1", command: [x], env: [{name: "1X", value: v}]}]
"""
    found = problems(jobset)
    assert "job.yaml:5: spec.successPolicy.targetReplicatedJobs[0]: no replicated job named 'nope'" in found
    assert "job.yaml:8: spec.replicatedJobs[0].replicas: expected an integer, got string 'two'" in found
    assert (
        "job.yaml:11: spec.replicatedJobs[0].template.spec.backofLimit: unknown field 'backofLimit'; "
        "did you mean 'backoffLimit'?" in found
    )
    assert any(
        p.startswith(
            "job.yaml:14: spec.replicatedJobs[0].template.spec.template.spec.containers[0].env[0].name: '1X'"
        )
        for p in found
    ), found


def test_an_unknown_kind_or_version_names_the_kinds_torchjob_reads() -> None:
    found = problems("apiVersion: kubeflow.org/v1\nkind: PytorchJob\nmetadata: {name: x}\n")
    assert found[0].startswith(
        "job.yaml:2: kind: kind 'PytorchJob' (apiVersion 'kubeflow.org/v1') is not a job torchjob "
        "reads; did you mean 'PyTorchJob'?"
    )
    assert "jobset.x-k8s.io/v1alpha2 JobSet" in found[0] and "batch.volcano.sh/v1alpha1 Job" in found[0]
    found = problems("apiVersion: jobset.x-k8s.io/v1alpha1\nkind: JobSet\nmetadata: {name: x}\n")
    assert found[0].startswith("job.yaml:1: apiVersion: expected 'jobset.x-k8s.io/v1alpha2' for a JobSet")


def test_a_trainjob_names_a_runtime_the_file_does_not_have() -> None:
    text = (KINDS / "trainjob-runtime.yaml").read_text().split("---\n")[1]
    found = problems(text)
    assert found == [
        "job.yaml:8: spec.runtimeRef.name: no TrainingRuntime named 'torch-with-scratch' in this file, in "
        "--runtime FILE (in namespace 'default'), or installed by Trainer (known: none)"
    ]


def test_runtime_file_gives_the_runtime_and_its_own_mistakes(tmp_path: Path) -> None:
    runtime, job = (KINDS / "trainjob-runtime.yaml").read_text().split("---\n")
    (tmp_path / "runtime.yaml").write_text(runtime)
    (tmp_path / "job.yaml").write_text(job)
    done = _cli(tmp_path, "validate", "job.yaml", "--runtime", "runtime.yaml")
    assert done.returncode == 0, done.stderr
    assert "TrainJob trainjob-scratch: valid; 3 pods" in done.stdout
    (tmp_path / "runtime.yaml").write_text(runtime.replace("mlPolicy:", "mlPolicee:"))
    done = _cli(tmp_path, "validate", "job.yaml", "--runtime", "runtime.yaml")
    assert done.returncode == 2
    assert (
        "runtime.yaml:14: spec.mlPolicee: unknown field 'mlPolicee'; did you mean 'mlPolicy'?" in done.stderr
    )


def test_validate_local_lists_what_runs_otherwise_here(tmp_path: Path) -> None:
    text = (
        (KINDS / "jobset.yaml").read_text().replace("  replicatedJobs:", "  suspend: true\n  replicatedJobs:")
    )
    text = text.replace(
        "          backoffLimit: 0",
        "          backoffLimit: 0\n          activeDeadlineSeconds: 60",
    )
    (tmp_path / "js.yaml").write_text(text)
    plain = _cli(tmp_path, "validate", "js.yaml")
    assert plain.returncode == 0 and "warning" not in plain.stderr
    local = _cli(tmp_path, "validate", "--local", "js.yaml")
    assert local.returncode == 0, local.stderr
    assert "js.yaml:11: spec.suspend: warning: JobSet creates no Job of a suspended set" in local.stderr
    assert "js.yaml:19: spec.replicatedJobs[0].template.spec.activeDeadlineSeconds: warning:" in local.stderr
    # A replicated job that starts once another completed runs here as on a cluster: no warning.
    depends = (KINDS / "jobset.yaml").read_text() + (
        "    - name: after\n      dependsOn: [{name: workers, status: Complete}]\n"
        "      template: {spec: {template: {spec: {containers: "
        "[{name: a, image: 'a:1', command: ['true']}]}}}}\n"
    )
    (tmp_path / "after.yaml").write_text(depends)
    local = _cli(tmp_path, "validate", "--local", "after.yaml")
    assert local.returncode == 0 and "dependsOn" not in local.stderr, local.stderr
    (loaded,) = load_jobs_from_text(depends)
    after = loaded.job.task("after-0")
    assert after is not None and after.depends_on is not None
    assert (after.depends_on.names, after.depends_on.complete) == (["workers-0"], ["workers-0"])


def test_set_changes_a_kinds_job_and_its_mistakes_keep_the_kinds_paths(tmp_path: Path) -> None:
    done = _cli(KINDS, "run", "--dry-run", "pytorchjob.yaml", "--set", "worker.replicas=x")
    assert done.returncode == 2
    assert done.stderr == (
        "<command line>: spec.pytorchReplicaSpecs.Worker.replicas: --set worker.replicas=x: expected an "
        "integer, got string 'x'\n"
    )
    done = _cli(tmp_path, "run", "--dry-run", str(KINDS / "trainjob.yaml"), "--set", "node-0.replicas=3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("pod trainjob-allreduce-node-0-") == 3


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchjob", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        check=False,
    )


def _jobset(spec: str) -> str:
    """A JobSet whose spec is ``spec`` (indented two spaces) and replicated jobs ``a`` and ``b``."""
    rjob = "template: {spec: {template: {spec: {containers: [{name: c, image: 'c:1', command: ['true']}]}}}}"
    return (
        "apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\nmetadata: {name: js}\nspec:\n"
        f"{spec}  replicatedJobs:\n    - name: a\n      {rjob}\n"
    ) + "".join(f"    - {line}\n      {rjob}\n" for line in ("name: b",))


def test_a_jobset_the_jobset_webhook_refuses_is_refused_at_its_fields() -> None:
    """What JobSet's API server and webhook refuse (the replicated jobs are a list keyed by name;
    dependsOn names a replicated job before it, never from the first one, and not with InOrder;
    the failure policy's rules name replicated jobs and reasons that exist, each rule once) is an
    error at the field, never a Volcano Job's field or a message about torchjob's own keys."""
    twice = _jobset("").replace("- name: b", "- name: a")
    found = problems(twice)
    assert found == [
        "job.yaml:8: spec.replicatedJobs[1].name: name 'a' is given twice (also spec.replicatedJobs[0]); "
        "the list is keyed by it"
    ], found
    found = problems(
        _jobset("  startupPolicy: {startupPolicyOrder: InOrder}\n").replace(
            "- name: b", "- name: b\n      dependsOn: [{name: a, status: Ready}]"
        )
    )
    assert found == [
        "job.yaml:5: spec.startupPolicy.startupPolicyOrder: InOrder and a replicated job's dependsOn "
        "cannot be given together (spec.replicatedJobs[1].dependsOn)"
    ], found
    found = problems(
        _jobset("").replace("- name: a", "- name: a\n      dependsOn: [{name: b, status: Ready}]")
    )
    assert found == [
        "job.yaml:7: spec.replicatedJobs[0].dependsOn: the first replicated job cannot depend on another",
        "job.yaml:7: spec.replicatedJobs[0].dependsOn[0].name: replicated job 'a' can depend only on "
        "the replicated jobs before it, not on 'b'",
    ], found
    found = problems(
        _jobset(
            "  failurePolicy:\n    rules:\n"
            "      - {name: r, action: FailJobSet, targetReplicatedJobs: [ghost],\n"
            "         onJobFailureReasons: [Oops]}\n"
            "      - {name: r, action: RestartJobSet}\n"
            "      - {name: 1r, action: RestartJobSet}\n"
        )
    )
    assert found == [
        "job.yaml:7: spec.failurePolicy.rules[0].targetReplicatedJobs[0]: no replicated job named 'ghost'",
        "job.yaml:8: spec.failurePolicy.rules[0].onJobFailureReasons[0]: expected one of "
        "BackoffLimitExceeded, DeadlineExceeded, FailedIndexes, MaxFailedIndexesExceeded, "
        "PodFailurePolicy, got 'Oops'",
        "job.yaml:9: spec.failurePolicy.rules[1].name: rule name 'r' is given twice (also "
        "spec.failurePolicy.rules[0])",
        "job.yaml:10: spec.failurePolicy.rules[2].name: '1r' is not a rule name: a letter, then letters, "
        "digits or '_,:', ending with a letter, digit or '_'",
    ], found
    # JobSet's webhook names an unnamed rule failurePolicyRule<i> before the API server checks the
    # schema (JobSet's own failure-policy examples give no names): read, and counted for twice.
    unnamed = _jobset(
        "  failurePolicy:\n    maxRestarts: 2\n    rules:\n"
        "      - {action: FailJobSet, targetReplicatedJobs: [a]}\n"
        "      - {name: failurePolicyRule0, action: RestartJobSet}\n"
    )
    (loaded,) = read(unnamed.replace("name: failurePolicyRule0, ", ""))
    assert loaded.job.spec.max_retry == 3  # maxRestarts + 1
    assert problems(unnamed) == [
        "job.yaml:9: spec.failurePolicy.rules[1].name: rule name 'failurePolicyRule0' is given twice "
        "(also spec.failurePolicy.rules[0])"
    ]
    found = problems(_jobset("  successPolicy: {operator: Some}\n"))
    assert found == ["job.yaml:5: spec.successPolicy.operator: expected one of All, Any, got 'Some'"], found
    found = problems(_jobset("  successPolicy: {operator: All, targetReplicatedJobs: [ghost]}\n"))
    assert found == [
        "job.yaml:5: spec.successPolicy.targetReplicatedJobs[0]: no replicated job named 'ghost'"
    ]


def test_an_elastic_pytorchjobs_numbers_are_told_at_their_fields_not_as_the_plugins_flags() -> None:
    text = PYTORCHJOB.replace(
        '  nprocPerNode: "2"\n',
        "  elasticPolicy: {minReplicas: 0, maxReplicas: '3', rdzvPort: 70000, maxRestarts: -3}\n",
    ).replace("containerPort: 29400", "containerPort: 0")
    found = problems(text)
    assert found == [
        "job.yaml:5: spec.elasticPolicy.maxReplicas: expected an integer, got string '3'",
        "job.yaml:5: spec.elasticPolicy.minReplicas: expected at least 1 node, got 0",
        "job.yaml:5: spec.elasticPolicy.rdzvPort: expected a port from 1 to 65535, got 70000",
        "job.yaml:5: spec.elasticPolicy.maxRestarts: expected at least 0, got -3",
        "job.yaml:22: spec.pytorchReplicaSpecs.worker.template.spec.containers[0].ports[0].containerPort: "
        "expected an integer >= 1, got 0",
    ], found


def test_a_dry_run_tells_what_cannot_run_here_at_the_kinds_fields(tmp_path: Path) -> None:
    text = PYTORCHJOB.replace(
        "command: [torchrun, train.py]\n              ports",
        "command: [torchrun, train.py]\n"
        "              envFrom: [{configMapRef: {name: cfg}}]\n              ports",
    )
    (tmp_path / "ptj.yaml").write_text(text)
    done = _cli(tmp_path, "run", "--dry-run", "ptj.yaml")
    assert done.returncode == 2, done.stderr  # as `run` refuses it, at the kind's field and line
    assert ": spec.pytorchReplicaSpecs.worker.template.spec.containers[0].envFrom[0]: " in done.stderr
    assert "ConfigMap 'cfg' does not exist locally" in done.stderr, done.stderr
    assert done.stderr.startswith("ptj.yaml:") and done.stderr.count("\n") == 1, done.stderr
    assert "spec.tasks" not in done.stdout + done.stderr


def test_too_many_pods_are_told_at_the_kinds_replica_counts() -> None:
    """More pods than a cluster holds, or a count past int32, is told at the kind's replica fields:
    never at the Volcano Job's spec.tasks or spec.minAvailable, which the user did not write."""
    found = problems(PYTORCHJOB.replace("replicas: 2\n", "replicas: 3000000000\n"))
    assert found == [
        "job.yaml:15: spec.pytorchReplicaSpecs.worker.replicas: expected an int32 integer, got 3000000000"
    ], found
    found = problems(PYTORCHJOB.replace("replicas: 2\n", "replicas: 200000\n"))
    assert found == [
        "job.yaml:7: spec.pytorchReplicaSpecs: the replica specs make 200001 pods in all; expected at most "
        "150000, the most pods one Kubernetes cluster is built for",
    ], found
    jobset = _jobset("").replace(
        "- name: b\n      template: {spec: {",
        "- name: b\n      replicas: 3\n"
        "      template: {spec: {parallelism: 1000000000, completions: 100000, ",
    )
    found = problems(jobset)
    assert sorted(found) == [
        "job.yaml:5: spec.replicatedJobs: the replicated jobs make 300001 pods in all; "
        "expected at most 150000, the most pods one Kubernetes cluster is built for",
        "job.yaml:9: spec.replicatedJobs[1].replicas: replicas times parallelism is 3000000000; JobSet "
        "takes at most 2147483647",
    ], found


def test_the_kinds_list_keys_and_bounds_from_their_crds_are_checked() -> None:
    """A list the CRD keys by a field holds each key once (the API server keeps one entry per key:
    a second env var of a name, a second patch of a manager would be lost or refused); lengths
    and bounds are the CRD's."""
    patch = "{manager: example.com/a, trainingRuntimeSpec: {}}"
    text = f"""\
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {{name: tj}}
spec:
  runtimeRef: {{name: torch-distributed}}
  activeDeadlineSeconds: 0
  trainer:
    command: ["true"]
    env: [{{name: A, value: "1"}}, {{name: A, value: "2"}}]
  runtimePatches: [{patch}, {patch}, {{manager: "", trainingRuntimeSpec: {{}}}}]
"""
    found = problems(text)
    assert found == [
        "job.yaml:6: spec.activeDeadlineSeconds: expected an integer >= 1, got 0",
        "job.yaml:9: spec.trainer.env[1].name: name 'A' is given twice (also spec.trainer.env[0]); the list "
        "is keyed by it",
        "job.yaml:10: spec.runtimePatches[2].manager: expected at least 1 character(s), got ''",
        "job.yaml:10: spec.runtimePatches[1].manager: manager 'example.com/a' is given twice (also "
        "spec.runtimePatches[0]); the list is keyed by it",
    ], found
    many = text.replace(
        f'[{patch}, {patch}, {{manager: "", trainingRuntimeSpec: {{}}}}]',
        "[" + ", ".join(f"{{manager: example.com/m{i}, trainingRuntimeSpec: {{}}}}" for i in range(17)) + "]",
    )
    assert "job.yaml:10: spec.runtimePatches: expected at most 16 entries, got 17" in problems(many)


PLACED = """\
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: placed}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template:
        spec:
          containers:
            - name: pytorch
              image: img
              command: [sh, -c, "true"]
              securityContext: {capabilities: {add: [NET_ADMIN]}}
    Worker:
      replicas: 1
      template:
        spec:
          nodeSelector: {gpu: a100}
          containers:
            - name: pytorch
              image: img
              command: [sh, -c, "true"]
              envFrom:
                - secretRef: {name: creds}
                - configMapRef: {name: settings}
              env:
                - name: TOKEN
                  valueFrom: {secretKeyRef: {name: creds, key: token}}
"""


def test_slurm_placement_warnings_name_the_kinds_own_fields() -> None:
    """What a run on Slurm says it ignores is at the field the user wrote, as the local engine's
    errors are: a PyTorchJob's replica spec, a JobSet's replicated job; a Volcano Job's task."""
    from torchjob.cli.sources import told_at
    from torchjob.engines.slurm.preflight import placement_notices

    (placed,) = read(PLACED)
    assert [line.split(": Slurm")[0] for line in placement_notices(placed.job)] == [
        "warning: spec.pytorchReplicaSpecs.Worker.template.spec.nodeSelector"
    ]
    # A run from the CLI says them as validate does: at the file's line.
    assert [line.split(" Slurm")[0] for line in placement_notices(placed.job, told_at(placed.document))] == [
        "job.yaml:19: spec.pytorchReplicaSpecs.Worker.template.spec.nodeSelector: warning:"
    ]
    jobset = yaml.safe_load((KINDS / "jobset.yaml").read_text())
    jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["tolerations"] = [
        {"key": "gpu", "operator": "Exists"}
    ]
    (loaded,) = read(yaml.safe_dump(jobset))
    assert [line.split(": Slurm")[0] for line in placement_notices(loaded.job)] == [
        "warning: spec.replicatedJobs[0].template.spec.template.spec.tolerations"
    ]
    volcano = job_manifest(placed.job)
    (plain,) = read(yaml.safe_dump(volcano))
    assert [line.split(": Slurm")[0] for line in placement_notices(plain.job)] == [
        "warning: spec.tasks[1].template.spec.nodeSelector"
    ]


def test_probes_no_kubelet_runs_here_are_warned_of_at_the_kinds_fields(tmp_path: Path) -> None:
    """Neither the local engine nor Slurm runs probes: a started container counts as ready. A JobSet
    that starts its workers once the driver is ready (readiness) is told so, at its own fields."""
    from torchjob.engines.local.engine import LocalEngine
    from torchjob.engines.slurm.preflight import placement_notices
    from torchjob.spec.model import own_path

    jobset = yaml.safe_load((KINDS / "jobset.yaml").read_text())
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["readinessProbe"] = {"tcpSocket": {"port": 29500}, "initialDelaySeconds": 30}
    pod["containers"][0]["livenessProbe"] = {"exec": {"command": ["true"]}}
    (loaded,) = read(yaml.safe_dump(jobset))
    at = "spec.replicatedJobs[0].template.spec.template.spec.containers[0]"
    expected = [
        f"warning: {at}.readinessProbe: not run here: a pod counts as ready once its containers have started",
        f"warning: {at}.livenessProbe: not run here: a container is not restarted for failing it",
    ]
    said = placement_notices(loaded.job)
    assert [line.split(" (")[0] for line in said[:2]] == expected, said
    warned = LocalEngine().warnings(loaded.job)
    local = [f"warning: {own_path(loaded.job, w.path)}: {w.message}" for w in warned]
    assert [line.split(" (")[0] for line in local if "Probe" in line] == expected, local
    (tmp_path / "set.yaml").write_text(yaml.safe_dump(jobset))
    done = _cli(tmp_path, "validate", "--local", "set.yaml")
    assert done.returncode == 0, done.stderr
    assert f"{at}.readinessProbe: warning: not run here" in done.stderr, done.stderr


def test_validate_local_lists_every_environment_problem_of_a_container(tmp_path: Path) -> None:
    (tmp_path / "placed.yaml").write_text(PLACED)
    done = _cli(tmp_path, "validate", "--local", "placed.yaml")
    assert done.returncode == 2
    worker = "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0]"
    lines = done.stderr.splitlines()
    for line, field in (
        (25, "envFrom[0]: Secrets are not available"),
        (26, "envFrom[1]: ConfigMap 'settings' does not exist locally"),
        (29, "env[0].valueFrom.secretKeyRef: Secrets are not available"),
    ):
        assert any(x.startswith(f"placed.yaml:{line}: {worker}.{field}") for x in lines), done.stderr
    assert "Traceback" not in done.stderr


def test_a_kinds_job_run_here_records_its_warnings_at_the_kinds_fields(tmp_path: Path) -> None:
    from support import run

    (placed,) = read(PLACED.split("    Worker:")[0])
    report = run(placed.job, tmp_path)
    assert report.phase == "Completed", report.reason
    field = "spec.pytorchReplicaSpecs.Master.template.spec.containers[0].securityContext.capabilities"
    assert any(e.message.startswith(f"warning: {field}: ") for e in report.events), report.events


def test_validate_sums_up_a_jobsets_jobs_as_runs_of_indices(tmp_path: Path) -> None:
    from torchjob.cli.spec_commands import task_summary

    tasks = [("master", 1), ("worker-0", 1), ("worker-1", 1), ("worker-2", 2), ("x-01", 1), ("a-5", 1)]
    assert task_summary(tasks) == "masterx1, worker-0..1x1, worker-2x2, x-01x1, a-5x1"
    assert task_summary([("w", 1), ("w-0", 1), ("w-1", 1)]) == "wx1, w-0..1x1"
    job = "{spec: {template: {spec: {containers: [{name: c, image: 'c:1', command: ['true']}]}}}}"
    (tmp_path / "js.yaml").write_text(
        "apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\nmetadata: {name: js}\nspec:\n"
        f"  replicatedJobs: [{{name: workers, replicas: 2000, template: {job}}}]\n"
    )
    done = _cli(tmp_path, "validate", "js.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "js.yaml: JobSet js: valid; 2000 pods (workers-0..1999x1); plugins: jobset\n"
