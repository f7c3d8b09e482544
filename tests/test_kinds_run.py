"""A PyTorchJob, a TrainJob and a JobSet file each run here with real torch (gloo) as its own
controller would run it, and on Slurm; each pod's env, as the engine recorded it, is the env the
controller gives it (tests/controllers/), at the addresses the pods are reached at here.

One real torch run per kind here and one per kind on Slurm (the suite's time); the TrainJob of a
runtime of its own runs a shell program and shows the PET_* it got.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from controllers.cluster import simulated
from controllers.envs import pod_env
from test_kinds_env import _containers, _key
from test_local_dns import hosts_file, names_work  # noqa: F401 (fixtures)
from test_slurm_engine import cli_env
from test_slurm_engine import torchjob as slurm_cli
from torchjob.jobs import load_jobs

REPO = Path(__file__).resolve().parent.parent
KINDS = REPO / "examples" / "kinds"
pytestmark = pytest.mark.timeout(240)


def _run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TORCHJOB_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "torchjob", "run", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )


def _recorded(home: Path) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The pods the engine ran (pods.yaml in the job's directory) and each one's address."""
    import json

    (job_dir,) = (home / "jobs").iterdir()
    items = yaml.safe_load((job_dir / "pods.yaml").read_text())["items"]
    status = json.loads((job_dir / "status.json").read_text())
    addresses = {p["name"]: p["address"] for p in status["pods"]}
    return [item for item in items if item["kind"] == "Pod"], addresses


def _controllers_env(file: str) -> dict[str, dict[str, dict[str, str]]]:
    (loaded,) = load_jobs(str(KINDS / file))
    job = loaded.job
    assert job.kind is not None
    from torchjob.targets import for_cluster

    with simulated(for_cluster(job, job.kind.target, "default").objects, job.kind.target) as api:
        return {_key(p): {c: pod_env(p, c, api) for c in _containers(p)} for p in api.objects_of("v1", "Pod")}


def _check_env(file: str, recorded: tuple[list[dict[str, Any]], dict[str, str]]) -> None:
    """Every variable the controller sets has its value; an address names the same pod, as this
    machine reaches it (its name where pod names resolve, else its address), a port is mapped."""
    pods, addresses = recorded
    want = _controllers_env(file)
    assert sorted(p["metadata"]["name"] for p in pods) == sorted(want)
    for pod in pods:
        name = pod["metadata"]["name"]
        for container in _containers(pod):
            got = pod_env(pod, container)
            for key, value in want[name][container].items():
                host, _, port = value.rpartition(":") if ":" in value else (value, "", "")
                named = host.split(".")[0]
                if named in addresses:  # an address (and a port) of a pod of the job
                    here = got[key].rpartition(":")[0] if port else got[key]
                    assert here.split(".")[0] == named or here == addresses[named], (name, key, got[key])
                elif key.endswith("PORT") and value.isdigit():
                    assert got[key].isdigit(), (name, key)  # the host port mapped for it
                else:
                    assert got[key] == value, (name, container, key)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize(
    ("file", "lines"),
    [
        ("pytorchjob.yaml", ["master-0 r0 | sendrecv: all 3 ranks verified"]),
        (
            "trainjob.yaml",
            ["node-0-0 r0 | allreduce: rank 0 of 2 sum 3 OK", "allreduce: rank 1 of 2 sum 3 OK"],
        ),
        ("jobset.yaml", ["workers-0-0 r0 | sendrecv: all 2 ranks verified"]),
    ],
)
def test_a_kinds_file_runs_here_with_its_controllers_env(tmp_path: Path, file: str, lines: list[str]) -> None:
    pytest.importorskip("torch")
    done = _run(tmp_path, str(KINDS / file))
    assert done.returncode == 0, done.stdout + done.stderr
    for line in lines:
        assert line in done.stdout, done.stdout
    assert "Completed" in done.stdout
    _check_env(file, _recorded(tmp_path))


def test_a_trainjob_on_a_runtime_of_its_own_runs_its_nodes(tmp_path: Path) -> None:
    done = _run(tmp_path, str(KINDS / "trainjob-runtime.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(3):
        assert f"node-0-{rank} r{rank} | node {rank} of 3, master " in done.stdout, done.stdout
    # PET_MASTER_ADDR is node 0 as this machine reaches it, its port the one mapped for 29500.
    pods, _ = _recorded(tmp_path)
    env = pod_env(pods[1], "node")
    assert f"master {env['PET_MASTER_ADDR']}:{env['PET_MASTER_PORT']}" in done.stdout
    assert env["PET_NPROC_PER_NODE"] == "1" and env["PET_NNODES"] == "3" and env["PET_NODE_RANK"] == "1"
    assert pods[0]["metadata"]["labels"]["team"] == "research"  # the TrainJob's runtime patch


# Trainer's multi-step runtimes (torch-distributed-with-cache, torchtune-*): the nodes start once
# the initializer's Job completed. The initializer writes its file late; a node that started while
# it ran would find none and fail (restartPolicy Never: no second try).
STEPS = """\
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainingRuntime
metadata: {{name: with-dataset}}
spec:
  mlPolicy: {{numNodes: 1, torch: {{}}}}
  template:
    spec:
      replicatedJobs:
        - name: dataset-initializer
          template:
            metadata: {{labels: {{trainer.kubeflow.org/trainjob-ancestor-step: dataset-initializer}}}}
            spec:
              template:
                spec:
                  restartPolicy: Never
                  containers:
                    - name: dataset-initializer
                      image: x
                      command: [sh, -c, 'sleep 1 && echo "$STORAGE_URI" > {data}']
        - name: node
          dependsOn: [{{name: dataset-initializer, status: Complete}}]
          template:
            metadata: {{labels: {{trainer.kubeflow.org/trainjob-ancestor-step: trainer}}}}
            spec:
              template:
                spec:
                  restartPolicy: Never
                  containers: [{{name: node, image: x}}]
---
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {{name: steps}}
spec:
  runtimeRef: {{kind: TrainingRuntime, name: with-dataset}}
  initializer: {{dataset: {{storageUri: 'hf://tatsu-lab/alpaca'}}}}
  trainer:
    numNodes: 2
    command: [sh, -c, 'data=$(cat {data}) && echo "node $PET_NODE_RANK read $data"']
"""


def test_a_trainjobs_nodes_start_once_its_initializer_completed(tmp_path: Path) -> None:
    (tmp_path / "steps.yaml").write_text(STEPS.format(data=tmp_path / "dataset"))
    done = _run(tmp_path / "home", str(tmp_path / "steps.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "task node-0 waits for task(s) dataset-initializer-0 to complete" in done.stderr + done.stdout
    for rank in range(2):
        assert f"node-0-{rank} r{rank} | node {rank} read hf://tatsu-lab/alpaca" in done.stdout, done.stdout


@pytest.mark.torch
@pytest.mark.slow
def test_each_kind_runs_on_slurm(slurm: Any, tmp_path: Path) -> None:
    """One allocation per file, each pod a job step on the node Slurm gave it."""
    pytest.importorskip("torch")
    env = cli_env(slurm, tmp_path / "root")
    (tmp_path / "steps.yaml").write_text(STEPS.format(data=tmp_path / "dataset"))
    for file, line in (
        ("examples/kinds/pytorchjob.yaml", "master-0 r0 | sendrecv: all 3 ranks verified"),
        ("examples/kinds/trainjob.yaml", "allreduce: rank 0 of 2 sum 3 OK"),
        ("examples/kinds/jobset.yaml", "sendrecv: all 2 ranks verified"),
        (
            str(tmp_path / "steps.yaml"),
            "node-0-1 r1 | node 1 read hf://tatsu-lab/alpaca",
        ),  # dependsOn Complete
    ):
        done = slurm_cli(env, "run", file, "--engine", "slurm")
        assert done.returncode == 0, file + "\n" + done.stdout + done.stderr
        assert line in done.stdout, done.stdout
        assert "Completed" in done.stderr
    assert slurm.jobs() == []


GLOO = """\
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.tensor([dist.get_rank() + 1])
dist.all_reduce(value)
rank, size = dist.get_rank(), dist.get_world_size()
print("gloo", rank, "of", size, os.environ["MASTER_ADDR"], "sum", int(value), flush=True)
dist.destroy_process_group()
"""

PYTORCHJOB_2 = """\
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {{name: ptj-names}}
spec:
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template: {{spec: {{containers: [{{name: pytorch, image: x, command: [python, {script}]}}]}}}}
    Worker:
      replicas: 1
      template: {{spec: {{containers: [{{name: pytorch, image: x, command: [python, {script}]}}]}}}}
"""


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.usefixtures("names_work")
def test_a_pytorchjob_here_connects_through_the_masters_service_name(tmp_path: Path) -> None:
    """Where pod names resolve, both ranks get the operator's MASTER_ADDR, ``<job>-master-0`` (not
    the pod's DNS name), and torch's gloo rendezvous connects through it."""
    pytest.importorskip("torch")
    script = tmp_path / "gloo.py"
    script.write_text(GLOO)
    job = tmp_path / "ptj.yaml"
    job.write_text(PYTORCHJOB_2.format(script=script))
    done = _run(tmp_path / "home", str(job))
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(2):
        assert f"gloo {rank} of 2 ptj-names-master-0 sum 3" in done.stdout, done.stdout
    pods, _ = _recorded(tmp_path / "home")
    for pod in pods:
        env = pod_env(pod, "pytorch")
        assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == "ptj-names-master-0", pod["metadata"]["name"]
