"""Heterogeneous jobs on a real Slurm: tasks whose pods need different resources become components
of one allocation, each pod a step of its component, and their ranks still make one gloo world.

Slurm starts a heterogeneous job only with each component on a node of its own (its backfill
scheduler's rule), so these tests run on a private cluster of two nodes on this machine
(tools/slurm_cluster.py, ``nodes=2``); on one node such a job stays pending (Resources).
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from slurm_cluster import SlurmCluster, free_port
from support import private_slurm
from test_slurm_engine import cli_env, job_dirs, job_file, status_json, task, torchjob, wait_for
from test_slurm_steps import no_process_left
from torchjob.engines.slurm import clients, steps
from torchjob.engines.slurm.clients import parse_show

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

RANK = """
import json, os, sys
import torch
import torch.distributed as dist
dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print(json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": value.item(),
                  "master": os.environ["MASTER_ADDR"], "node": os.environ["SLURMD_NODENAME"],
                  "cpus": os.environ["SLURM_CPUS_ON_NODE"],
                  "marker": sys.argv[1]}), flush=True)
dist.destroy_process_group()
"""


@pytest.fixture
def slurm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A private cluster of two nodes on this machine; skips where that cannot be made."""
    yield from private_slurm(tmp_path_factory, nodes=2)


def het_job(tmp_path: Path, marker: str) -> Path:
    def spec(cpu: str, memory: str) -> dict[str, object]:
        container = {
            "name": "main",
            "image": "python:3.11",
            "command": [sys.executable, "-c", RANK, marker],
            "resources": {"requests": {"cpu": cpu, "memory": memory}},
        }
        return {"restartPolicy": "Never", "containers": [container]}

    doc = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "het"},
        "spec": {
            "plugins": {"pytorch": ["--master=master", "--worker=worker", f"--port={free_port()}"]},
            "tasks": [
                {"name": "master", "replicas": 1, "template": {"spec": spec("1", "200Mi")}},
                {"name": "worker", "replicas": 2, "template": {"spec": spec("2", "600Mi")}},
            ],
        },
    }
    path = tmp_path / "het.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.torch
def test_tasks_that_differ_run_as_components_of_one_gloo_world(slurm2: SlurmCluster, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    marker = "het-" + tmp_path.name
    env = cli_env(slurm2, tmp_path / "root")
    path = het_job(tmp_path, marker)
    plan = torchjob(env, "run", str(path), "--engine", "slurm", "--dry-run")
    assert " : " in plan.stdout, plan.stdout  # two components in one sbatch
    done = torchjob(env, "run", str(path), "--engine", "slurm")
    assert done.returncode == 0, done.stdout + done.stderr
    results = {}
    for line in done.stdout.splitlines():
        prefix, _, text = line.partition(" | ")
        if marker in text:
            results[prefix] = json.loads(text)
    assert sorted(results) == ["master-0 r0", "worker-0 r1", "worker-1 r2"], done.stdout
    assert {r["sum"] for r in results.values()} == {6.0}  # one world across the components
    assert {r["world"] for r in results.values()} == {3}
    master = results["master-0 r0"]
    workers = [results["worker-0 r1"], results["worker-1 r2"]]
    # Each pod is a step of its own component, with the CPUs its task asks for.
    assert master["cpus"] == "1"
    assert {w["cpus"] for w in workers} == {"2"}
    # MASTER_ADDR is the master's node, the other component's pods on the other node.
    assert {r["master"] for r in results.values()} == {master["node"]}
    assert {w["node"] for w in workers} == set(slurm2.nodes) - {master["node"]}
    status = status_json(env, "het")
    assert status["phase"] == "Completed"
    addresses = {p["name"]: p["address"] for p in status["pods"]}  # type: ignore[union-attr, index]
    assert addresses["het-master-0"] == master["node"]
    # The allocation: one component per kind of pod, each sized as its pods ask.
    shown = slurm2.run("scontrol", "show", "job", "-o").stdout.splitlines()
    components = sorted(
        (int(f["HetJobOffset"]), f["NumTasks"], f["CPUs/Task"], f["MinMemoryCPU"])
        for f in map(parse_show, shown)
    )
    assert components == [(0, "1", "1", "200M"), (1, "2", "2", "300M")], shown
    assert slurm2.jobs() == []
    assert no_process_left(marker) == []


def test_a_pod_of_another_component_is_seen_running_and_delete_stops_it(
    slurm2: SlurmCluster, tmp_path: Path
) -> None:
    # squeue lists a component's steps under the component's own job id: the controller sees the
    # worker (component 1) running only by asking for every component's steps.
    marker = uuid.uuid4().hex
    env = cli_env(slurm2, tmp_path / "root")
    sleep = f"import time; print('up', flush=True); time.sleep(600)  # {marker}"
    client = task("client", sleep, dependsOn={"name": ["worker"]})
    worker = task("worker", sleep)
    worker["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "2"}}  # type: ignore[index]
    path = job_file(tmp_path, [client, worker])
    done = torchjob(env, "submit", str(path), "--engine", "slurm")
    assert done.returncode == 0, done.stderr
    job_id = "sj-" + done.stderr.split(": sj-")[1].split()[0]

    def phases() -> dict[str, str]:
        pods = status_json(env, job_id)["pods"]
        return {p["short"]: p["phase"] for p in pods}  # type: ignore[union-attr, index]

    wait_for(lambda: phases() == {"client-0": "Running", "worker-0": "Running"}, 60, "both pods running")
    logs = torchjob(env, "logs", job_id, "--engine", "slurm").stdout
    wait_for(lambda: torchjob(env, "logs", job_id, "--engine", "slurm").stdout.count("| up") == 2, 30, logs)
    (leader,) = {j.split("+")[0] for j in slurm2.jobs()}
    listed = clients.component_ids(leader, slurm2.env)
    assert len(listed.split(",")) == 2
    assert "sj-worker-0.main.0" in steps.steps(listed, slurm2.env).values()
    deleted = torchjob(env, "delete", job_id, "--engine", "slurm")
    assert deleted.returncode == 0, deleted.stderr
    assert slurm2.jobs() == []
    assert steps.steps(listed, slurm2.env) == {}
    assert no_process_left(marker) == []


def test_a_heterogeneous_job_on_a_one_node_partition_is_one_line(slurm: SlurmCluster, tmp_path: Path) -> None:
    # One node: Slurm would keep the job pending (Resources) for ever; torchjob says why at once.
    env = cli_env(slurm, tmp_path / "root")
    small, big = task("small", "print('small ran')"), task("big", "print('big ran')")
    big["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "2"}}  # type: ignore[index]
    path = job_file(tmp_path, [small, big])
    done = torchjob(env, "run", str(path), "--engine", "slurm", timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "torchjob: the job's tasks ask for 2 kinds of pod (small; big), each a component of a "
        f"heterogeneous job on nodes of its own (2 in all), and partition {slurm.partition} has 1 "
        "node(s): give the tasks the same resources, or use --single-component"
    ], done.stderr
    assert job_dirs(tmp_path / "root") == []
    assert slurm.jobs() == []
    # One component sized for the largest pod runs on the one node.
    done = torchjob(env, "run", str(path), "--engine", "slurm", "--single-component")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "small-0 | small ran" in done.stdout and "big-0 | big ran" in done.stdout
