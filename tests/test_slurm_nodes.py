"""Jobs across nodes on a real Slurm of three nodes with two fake GPUs each (tools/slurm_cluster.py,
one cluster for the module): one pod per node for a multi-node torchrun job, job-wide options on
every component of a heterogeneous job, spec.queue as the partition, a node that stops, and a job
run inside an allocation that salloc made."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from slurm_cluster import SlurmCluster
from support import private_slurm
from test_slurm_engine import REPO, cli_env, live_pods, status_json, torchjob, wait_for
from test_slurm_steps import no_process_left
from torchjob.engines.slurm.clients import parse_show

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

# What a pod says of where it runs: its node, its Slurm task's CPUs and GPUs, the memory it asked.
# One write of the whole line: the processes of one pod share its log, and print() of an
# unbuffered stdout writes the line and its newline apart.
WHERE = (
    "import json, os; os.write(1, ('WHERE ' + json.dumps({k: os.environ.get(v) for k, v in ("
    "('node', 'SLURMD_NODENAME'), ('cpus', 'SLURM_CPUS_PER_TASK'), ('gpus', 'CUDA_VISIBLE_DEVICES'), "
    "('mem', 'SLURM_MEM_PER_CPU'), ('pod', 'TORCHJOB_POD_NAME'))}) + '\\n').encode())"
)


@pytest.fixture(scope="module")
def nodes3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    other = "PartitionName=other Nodes=ALL MaxTime=INFINITE State=UP"
    yield from private_slurm(tmp_path_factory, nodes=3, gpus=2, features="fast", extra=[other])


def where(stdout: str) -> list[dict[str, str | None]]:
    return [json.loads(line.split("WHERE ", 1)[1]) for line in stdout.splitlines() if "WHERE " in line]


def write_job(path: Path, tasks: list[dict[str, object]], **spec: object) -> Path:
    doc = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "nj"}}
    doc["spec"] = {**spec, "tasks": tasks}
    path.write_text(yaml.safe_dump(doc))
    return path


def pod_task(
    name: str, code: str, replicas: int = 1, resources: dict[str, str] | None = None
) -> dict[str, object]:
    container: dict[str, object] = {"name": "main", "image": "busybox", "command": ["python", "-c", code]}
    if resources:
        container["resources"] = {"requests": resources}
    return {
        "name": name,
        "replicas": replicas,
        "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
    }


def components(cluster: SlurmCluster, slurm_id: str) -> list[dict[str, str]]:
    shown = cluster.run("scontrol", "show", "job", "-o", slurm_id).stdout
    return [parse_show(line) for line in shown.splitlines() if line.strip()]


@pytest.mark.torch
def test_a_torchrun_job_of_two_nodes_runs_one_pod_per_node_with_its_gpus(
    nodes3: SlurmCluster, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "rank.py"
    script.write_text(
        "import datetime, os, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=60))\n"
        "value = torch.tensor([1.0]); dist.all_reduce(value)\n"
        f"{WHERE}\n"
        "print('RANK', dist.get_rank(), dist.get_world_size(), value.item(), flush=True)\n"
        "dist.destroy_process_group()\n"
    )
    env = cli_env(nodes3, tmp_path / "root")
    done = torchjob(
        env, "run", "--engine", "slurm", "-j", "2x2", "--gpus-per-node", "2", str(script), timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = sorted(line.split("RANK ", 1)[1] for line in done.stdout.splitlines() if "RANK " in line)
    assert ranks == ["0 4 4.0", "1 4 4.0", "2 4 4.0", "3 4 4.0"], done.stdout
    seen = where(done.stdout)
    pods = {str(w["pod"]): w for w in seen}
    assert len(seen) == 4 and len(pods) == 2  # two processes in each of two pods
    assert len({w["node"] for w in pods.values()}) == 2, seen  # one pod per node
    for w in pods.values():  # each pod: its node's two GPUs, a CPU for each of its two processes
        assert (w["gpus"], w["cpus"]) == ("0,1", "2"), seen


def test_job_wide_options_reach_every_component_and_no_step_inherits_anothers(
    nodes3: SlurmCluster, tmp_path: Path
) -> None:
    # The master asks for memory, the workers do not: two components of a heterogeneous job.
    path = write_job(
        tmp_path / "het.yaml",
        [
            pod_task("master", WHERE, resources={"cpu": "1", "memory": "200Mi"}),
            pod_task("worker", WHERE, replicas=2, resources={"cpu": "2"}),
        ],
    )
    env = cli_env(nodes3, tmp_path / "root")
    flags = ("--engine", "slurm", "-p", "other", "--exclusive", "--time-limit", "5")
    done = torchjob(env, "submit", str(path), *flags, "--sbatch-args=--constraint=fast --comment=mine")
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    wait_for(lambda: status_json(env, job_id)["phase"] == "Completed", 120, "the job completed")
    slurm_id = json.loads((tmp_path / "root" / job_id / "slurm.json").read_text())["jobId"]
    shown = components(nodes3, slurm_id)
    assert len(shown) == 2, shown
    for component in shown:  # sacct shows the same: the options of every component
        got = {k: component[k] for k in ("Partition", "Features", "OverSubscribe", "TimeLimit", "Comment")}
        assert got == {
            "Partition": "other",
            "Features": "fast",
            "OverSubscribe": "NO",
            "TimeLimit": "00:05:00",
            "Comment": "mine",
        }, component
    logs = torchjob(env, "logs", job_id, "--engine", "slurm").stdout
    mems = {str(w["pod"]).rsplit("-", 2)[1]: w["mem"] for w in where(logs)}
    # The batch script runs with the first component's SLURM_MEM_PER_CPU=200, which srun reads as
    # its --mem-per-cpu: no step may inherit it (Slurm sets none in a task; each step asks its own).
    assert mems == {"master": None, "worker": None}, logs


def test_spec_queue_is_the_partition_of_that_name(nodes3: SlurmCluster, tmp_path: Path) -> None:
    env = cli_env(nodes3, tmp_path / "root")
    env.pop("TORCHJOB_SLURM_PARTITION")
    for queue, partition, warned in (("other", "other", False), ("research", "main", True)):
        path = write_job(tmp_path / f"{queue}.yaml", [pod_task("w", "print('ran')")], queue=queue)
        done = torchjob(env, "submit", str(path), "--engine", "slurm")
        assert done.returncode == 0, done.stderr
        said = f"warning: spec.queue '{queue}': the cluster has no partition of that name"
        assert (said in done.stderr) == warned, done.stderr
        slurm_id = json.loads((tmp_path / "root" / done.stdout.strip() / "slurm.json").read_text())["jobId"]
        assert components(nodes3, slurm_id)[0]["Partition"] == partition
    warned = torchjob(env, "submit", "--engine", "slurm", str(node_selector_job(tmp_path)))
    assert warned.returncode == 0, warned.stderr
    field = "spec.tasks[0].template.spec.nodeSelector"  # at the file's line, as validate says it
    said = f"selector.yaml:{_line_of(tmp_path / 'selector.yaml', 'nodeSelector')}: {field}: warning: "
    assert f"{said}Slurm does not place pods by nodeSelector: ignored" in warned.stderr, warned.stderr


def _line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def node_selector_job(tmp_path: Path) -> Path:
    task = pod_task("w", "print('ran')")
    task["template"]["spec"]["nodeSelector"] = {"gpu": "a100"}  # type: ignore[index]
    return write_job(tmp_path / "selector.yaml", [task])


def test_a_node_that_stops_ends_the_job_with_no_running_pod(nodes3: SlurmCluster, tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    sleeper = f"import time; print('up', flush=True); time.sleep(600)  # {marker}"
    path = write_job(tmp_path / "two.yaml", [pod_task("w", sleeper, replicas=2)])
    env = cli_env(nodes3, tmp_path / "root")
    done = torchjob(env, "submit", str(path), "--engine", "slurm", "--pods-per-node", "1")
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    wait_for(lambda: status_json(env, job_id)["phase"] == "Running", 60, "the job running")
    slurm_id = json.loads((tmp_path / "root" / job_id / "slurm.json").read_text())["jobId"]
    batch_host = components(nodes3, slurm_id)[0]["BatchHost"]
    nodes = {str(p["address"]) for p in status_json(env, job_id)["pods"]}  # type: ignore[union-attr]
    (lost,) = nodes - {batch_host}
    nodes3.stop_node(lost)  # its slurmd is gone; an administrator (or SlurmdTimeout) marks it down
    assert nodes3.run("scontrol", "update", f"nodename={lost}", "state=down", "reason=lost").returncode == 0
    waited = torchjob(env, "wait", job_id, "--engine", "slurm", "--timeout", "90")
    status = status_json(env, job_id)
    assert waited.returncode == 1, waited.stdout + waited.stderr
    assert (status["phase"], status["reason"]) == (
        "Failed",
        "Slurm: NODE_FAIL: a node of the allocation failed",
    )
    assert live_pods(status) == [], status
    nodes3.start_node(lost)
    nodes3.run("scontrol", "update", f"nodename={lost}", "state=resume")
    nodes3.wait_idle(60)
    wait_for(
        lambda: no_process_left(marker) == [], 60, "the lost node's step ended once its slurmd came back"
    )


def test_a_job_inside_an_allocation_runs_as_its_steps(nodes3: SlurmCluster, tmp_path: Path) -> None:
    env = cli_env(nodes3, tmp_path / "root")
    env.pop("TORCHJOB_SLURM_PARTITION")
    script = tmp_path / "where.py"
    script.write_text(WHERE + "\n")
    jobs_before = len(Path(nodes3.dir / "jobcomp.txt").read_text().splitlines())
    torchjob_cli = [sys.executable, "-m", "torchjob", "run", "--engine", "slurm"]
    # salloc runs the command here with the allocation's SLURM_* (and its --mem-per-cpu).
    salloc = ["salloc", "-N", "2", "-n", "2", "--mem-per-cpu=100", "--"]
    done = subprocess.run(
        [*salloc, *torchjob_cli, "-j", "2x1", str(script)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    allocation = re.search(r"Granted job allocation (\d+)", done.stderr)
    assert allocation is not None, done.stderr
    assert f"in allocation {allocation[1]}:" in done.stderr, done.stderr
    seen = where(done.stdout)
    assert len({w["node"] for w in seen}) == 2, seen  # the allocation's two nodes, a pod on each
    assert {w["mem"] for w in seen} == {None}, seen  # the pods asked for no memory: none inherited
    time.sleep(1)
    # No job was submitted: the allocation is the only job Slurm ran.
    assert len(Path(nodes3.dir / "jobcomp.txt").read_text().splitlines()) == jobs_before + 1
    # An allocation too small for the job: said at once, in one line, and nothing runs.
    small = subprocess.run(
        [*salloc[:1], "-n", "1", "--", *torchjob_cli, "-j", "3x1", str(script)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = [line for line in small.stderr.splitlines() if line.startswith("torchjob:")]
    assert small.returncode == 2, small.stdout + small.stderr
    assert len(lines) == 1 and "has 1 task(s)" in lines[0] and "the job 3 pods" in lines[0], small.stderr
    assert "WHERE" not in small.stdout


def test_a_requeued_job_goes_on_from_its_last_attempt(nodes3: SlurmCluster, tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    # Each pod says the job's retry count, as Volcano gives it; the first run waits for ever.
    code = (
        "import os, time\nprint('retry', os.environ['RETRY'], flush=True)\n"
        f"if os.environ['RETRY'] == '0':\n    time.sleep(600)  # {marker}\n"
    )
    pod = pod_task("w", code, replicas=2)
    retry = {"fieldRef": {"fieldPath": "metadata.annotations['volcano.sh/job-retry-count']"}}
    pod["template"]["spec"]["containers"][0]["env"] = [{"name": "RETRY", "valueFrom": retry}]  # type: ignore[index]
    path = write_job(tmp_path / "requeue.yaml", [pod])
    env = cli_env(nodes3, tmp_path / "root")
    done = torchjob(env, "submit", str(path), "--engine", "slurm", "--pods-per-node", "1", "--requeue")
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    wait_for(lambda: status_json(env, job_id)["phase"] == "Running", 60, "the job running")
    slurm_id = json.loads((tmp_path / "root" / job_id / "slurm.json").read_text())["jobId"]
    batch_host = components(nodes3, slurm_id)[0]["BatchHost"]
    (lost,) = {str(p["address"]) for p in status_json(env, job_id)["pods"]} - {batch_host}  # type: ignore[union-attr]
    nodes3.stop_node(lost)
    try:
        assert (
            nodes3.run("scontrol", "update", f"nodename={lost}", "state=down", "reason=lost").returncode == 0
        )
        wait_for(lambda: components(nodes3, slurm_id)[0]["JobState"] == "PENDING", 60, "Slurm requeued it")
        assert status_json(env, job_id)["phase"] == "Restarting"
        # Slurm holds a requeued job back for two minutes (BeginTime); an administrator may not wait.
        # Not within the second of the requeue, though: slurmd revoked the old run's credential and
        # refuses one made in the same whole second ("Job credential revoked": the job fails), which
        # the two minutes otherwise rule out.
        time.sleep(1.1)
        assert nodes3.run("scontrol", "update", f"jobid={slurm_id}", "StartTime=now").returncode == 0
        waited = torchjob(env, "wait", job_id, "--engine", "slurm", "--timeout", "120")
        status = status_json(env, job_id)
        assert waited.returncode == 0, status
        assert status["retryCount"] == 1 and [p["attempt"] for p in status["pods"]] == [1, 1], status  # type: ignore[union-attr]
        told = [e["message"] for e in status["events"]]  # type: ignore[union-attr]
        assert any(
            m.startswith(f"Slurm requeued the allocation (restart 1): node {lost} (DOWN") for m in told
        ), told
        first = torchjob(env, "logs", job_id, "--engine", "slurm", "--attempt", "0").stdout
        last = torchjob(env, "logs", job_id, "--engine", "slurm").stdout
        assert first.count("| retry 0") == 2 and last.count("| retry 1") == 2, first + last
    finally:
        nodes3.start_node(lost)
        nodes3.run("scontrol", "update", f"nodename={lost}", "state=resume")
        nodes3.wait_idle(60)
    wait_for(
        lambda: no_process_left(marker) == [], 60, "the lost node's step ended once its slurmd came back"
    )
