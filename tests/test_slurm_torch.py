"""A real torch.distributed (gloo) job whose ranks run as job steps of one Slurm allocation, wired by
the plan's env: MASTER_ADDR is the master pod's node, ports per slot on that node."""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from slurm_cluster import SlurmCluster, free_port
from test_slurm_steps import no_process_left, wait_state
from torchjob.engines.slurm import clients, steps
from torchjob.engines.slurm.plan import launches, place, plan_job
from torchjob.engines.slurm.settings import SlurmSettings
from torchjob.jobs import load_jobs_from_text

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow, pytest.mark.torch]

ALL_REDUCE = """
import json, os, sys
import torch
import torch.distributed as dist
dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print(json.dumps({"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": value.item(),
                  "master": os.environ["MASTER_ADDR"], "port": os.environ["MASTER_PORT"],
                  "own_port": os.environ["TORCHJOB_PORT_" + sys.argv[1]], "marker": sys.argv[2]}))
dist.destroy_process_group()
"""


def job_yaml(port: int, marker: str, workers: int) -> str:
    command = [sys.executable, "-c", ALL_REDUCE, str(port), marker]
    task = {
        "containers": [
            {
                "name": "main",
                "image": "python:3.11",
                "command": command,
                "resources": {"limits": {"cpu": "1"}},
            }
        ]
    }
    doc = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "allreduce"},
        "spec": {
            "plugins": {
                "pytorch": ["--master=master", "--worker=worker", f"--port={port}"],
                "env": [],
                "svc": [],
            },
            "tasks": [
                {"name": "master", "replicas": 1, "template": {"spec": task}},
                {"name": "worker", "replicas": workers, "template": {"spec": task}},
            ],
        },
    }
    return yaml.safe_dump(doc)


@pytest.mark.parametrize("workers", [1, 3])
def test_a_gloo_all_reduce_across_steps_of_one_allocation(
    slurm: SlurmCluster, tmp_path: Path, workers: int
) -> None:
    pytest.importorskip("torch")
    port, marker = free_port(), uuid.uuid4().hex
    job = load_jobs_from_text(job_yaml(port, marker, workers))[0].job
    assert job is not None
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    # The batch script stands in for the controller: it records the allocation Slurm gave it.
    controller = ["sh", "-c", 'env > "$TORCHJOB_JOB_DIR/allocation.env"; exec sleep 600']
    plan = plan_job(job, SlurmSettings(partition=slurm.partition), str(job_dir), controller)
    script = job_dir / "batch.sh"
    script.write_text(plan.script)
    job_id = clients.submit(plan.sbatch_args, script, slurm.env)
    wait_state(slurm, job_id, {"RUNNING"})
    env_file = job_dir / "allocation.env"
    deadline = time.monotonic() + 30
    while not env_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert env_file.exists(), (job_dir / f"slurm-{job_id}.out").read_text()
    allocation = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    layout = steps.layout_from_env(allocation, lambda nodes: steps.hostnames(nodes, slurm.env))
    assert layout == {0: [(slurm.host, 1 + workers)]}
    placements = place(plan, layout)

    running = []
    for launch in launches(plan, placements):
        component = plan.components[launch.placement.component]
        running.append(
            steps.Step.start(
                job_id,
                f"{launch.pod}.{launch.container}",
                launch.argv,
                host=launch.placement.host,
                resources=component.resources,
                env={**slurm.env, **launch.env},
                log=tmp_path / f"{launch.pod}.log",
                working_dir=str(job_dir),
            )
        )
    codes = [step.wait(120) for step in running]
    logs = {step.name: (tmp_path / f"{step.name.split('.')[0]}.log").read_text() for step in running}
    assert codes == [0] * len(running), logs
    results = [json.loads(text.strip().splitlines()[-1]) for text in logs.values()]
    world = 1 + workers
    assert sorted(r["rank"] for r in results) == list(range(world))
    assert {r["sum"] for r in results} == {float(sum(range(1, world + 1)))}
    assert {r["world"] for r in results} == {world}
    assert {r["master"] for r in results} == {slurm.host}
    assert {r["port"] for r in results} == {str(port)}
    # both pods share the node: each has its own copy of the declared port
    assert len({r["own_port"] for r in results}) == world
    clients.cancel(job_id, slurm.env)
    wait_state(slurm, job_id, {"CANCELLED"})
    assert no_process_left(marker) == []


def test_a_steps_arguments_reach_the_program_unchanged(slurm: SlurmCluster, tmp_path: Path) -> None:
    evil = 'it\'s "quoted" $(touch MARK) `touch MARK` ;touch MARK\nnext line $HOME'
    job = load_jobs_from_text(job_yaml(free_port(), "x", 1))[0].job
    assert job is not None
    plan = plan_job(job, SlurmSettings(), str(tmp_path), ["sleep", "600"])
    script = tmp_path / "batch.sh"
    script.write_text(plan.script)
    job_id = clients.submit(plan.sbatch_args, script, slurm.env)
    wait_state(slurm, job_id, {"RUNNING"})
    step = steps.Step.start(
        job_id,
        "echo",
        [sys.executable, "-c", "import sys; sys.stdout.write(sys.argv[1])", evil],
        host=slurm.host,
        resources=plan.components[0].resources,
        env=slurm.env,
        log=tmp_path / "echo.log",
        working_dir=str(tmp_path),
    )
    assert step.wait(60) == 0
    assert (tmp_path / "echo.log").read_text() == evil
    assert not (tmp_path / "MARK").exists()


# What the controller will do on the batch host, reduced to starting every pod and waiting.
LAUNCHER = """
import os, sys
from pathlib import Path
from torchjob.engines.slurm import clients, steps
from torchjob.engines.slurm.plan import launches, place, plan_job
from torchjob.engines.slurm.settings import SlurmSettings
from torchjob.jobs import load_jobs_from_text

job_dir = Path(sys.argv[1])
job = load_jobs_from_text((job_dir / "job.yaml").read_text())[0].job
plan = plan_job(job, SlurmSettings(), str(job_dir), ["true"])
layout = steps.layout_from_env(os.environ, steps.hostnames)
running = []
for pod in launches(plan, place(plan, layout)):
    resources = plan.components[pod.placement.component].resources
    running.append(steps.Step.start(os.environ["SLURM_JOB_ID"], pod.pod, pod.argv, host=pod.placement.host,
                                    resources=resources, env={**os.environ, **pod.env},
                                    log=job_dir / (pod.pod + ".log"), working_dir=str(job_dir)))
codes = [step.wait(120) for step in running]
print("codes", codes, flush=True)
sys.exit(max(99 if code is None else code for code in codes))
"""


@pytest.mark.parametrize("fail", [False, True])
def test_pods_started_from_the_batch_host(slurm: SlurmCluster, tmp_path: Path, fail: bool) -> None:
    pytest.importorskip("torch")
    marker = uuid.uuid4().hex
    text = job_yaml(free_port(), marker, 1)
    if fail:  # before joining, rank 1 ends with 3 and the master with 0
        exits = "import json, os, sys; sys.exit(3 if os.environ['RANK'] == '1' else 0)"
        text = text.replace("import json, os, sys", exits)
    (tmp_path / "job.yaml").write_text(text)
    job = load_jobs_from_text(text)[0].job
    assert job is not None
    plan = plan_job(job, SlurmSettings(), str(tmp_path), [sys.executable, "-c", LAUNCHER, str(tmp_path)])
    script = tmp_path / "batch.sh"
    script.write_text(plan.script)
    job_id = clients.submit(plan.sbatch_args, script, slurm.env)
    state = wait_state(slurm, job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=150)
    output = (tmp_path / f"slurm-{job_id}.out").read_text()
    if fail:
        assert (state.state, state.exit_code) == ("FAILED", 3), output
        assert "codes [0, 3]" in output
    else:
        assert (state.state, state.exit_code) == ("COMPLETED", 0), output
        results = [
            json.loads((tmp_path / f"allreduce-{pod}.log").read_text().splitlines()[-1])
            for pod in ("master-0", "worker-0")
        ]
        assert {r["sum"] for r in results} == {3.0}
        assert {r["master"] for r in results} == {slurm.host}
    assert "codes" in output
    assert no_process_left(marker) == []


def test_the_restart_on_failure_example_completes_as_locally(slurm: SlurmCluster, tmp_path: Path) -> None:
    """Each restarted attempt's steps are made from that attempt's pod: the second attempt reads
    retry count 1 from the downward API, as locally (test_examples_e2e.py), and completes."""
    pytest.importorskip("torch")
    from test_slurm_engine import cli_env, status_json, torchjob

    env = cli_env(slurm, tmp_path / "root")
    done = torchjob(env, "run", "examples/restart-on-failure.yaml", "--engine", "slurm", timeout=220)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    status = status_json(env, "restart-on-failure")
    assert (status["phase"], status["retryCount"]) == ("Completed", 1), status
    logs = torchjob(env, "logs", "restart-on-failure", "--engine", "slurm", "--all-attempts", timeout=60)
    assert "rank 2 crashing on purpose at step 0 of attempt 1" in logs.stdout, logs.stdout[-3000:]
    for rank in (0, 1, 2):
        assert f"rank {rank} of 3 started, attempt 2 (retry count 1)" in logs.stdout
        assert f"rank {rank} completed 5 all-reduce steps on attempt 2" in logs.stdout
