"""The Job behind a task: tasks, commands, plugin flags, policies, elastic and run-policy fields."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from support import torchjob
from torchjob import (
    CleanPodPolicy,
    Elastic,
    Master,
    PyTorch,
    Resources,
    RestartPolicy,
    RunPolicy,
    Worker,
    task,
)
from torchjob.cli.sources import load_ref
from torchjob.errors import SpecError
from torchjob.expand import expand
from torchjob.spec.model import Job


def fn() -> int:
    return 1


def _container(job: Job, task_name: str) -> dict[str, Any]:
    found = job.task(task_name)
    assert found is not None
    containers: list[dict[str, Any]] = found.template.spec["containers"]
    return containers[0]


def _command(job: Job, task_name: str = "master") -> list[str]:
    return list(_container(job, task_name)["command"])


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_pytorch_job_has_master_and_workers() -> None:
    t = task(task_config=PyTorch(worker=Worker(replicas=3)))(fn)
    job = t.to_job()
    assert [(x.name, x.replicas) for x in job.spec.tasks] == [("master", 1), ("worker", 3)]
    assert job.spec.plugins["pytorch"] == ["--master=master", "--worker=worker", "--port=23456"]
    assert "svc" in job.spec.plugins and "env" in job.spec.plugins
    for name in ("master", "worker"):
        command = _command(job, name)
        assert command[:3] == ["python", "-m", "torchjob.sdk.entrypoint"]
        assert _flag(command, "--task") == "test_sdk_job:fn"
        assert "--elastic" not in command
        assert job.task(name).template.restart_policy == "Never"  # type: ignore[union-attr]
    assert job.elastic is None and job.run_policy is None
    # Rank env from the pytorch plugin: the master is rank 0, worker i is rank i + 1.
    state = expand(job)
    ranks = {
        p.name: {e["name"]: e.get("value") for e in p.manifest["spec"]["containers"][0]["env"]}["RANK"]
        for p in state.pods
    }
    assert ranks == {"fn-master-0": "0", "fn-worker-0": "1", "fn-worker-1": "2", "fn-worker-2": "3"}


def test_pytorch_replica_settings_and_run_policy() -> None:
    config = PyTorch(
        master=Master(image="repo/master:1", restart_policy=RestartPolicy.ALWAYS, limits=Resources(cpu="2")),
        worker=Worker(replicas=2, restart_policy=RestartPolicy.FAILURE),
        run_policy=RunPolicy(
            clean_pod_policy=CleanPodPolicy.RUNNING,
            ttl_seconds_after_finished=60,
            active_deadline_seconds=600,
            backoff_limit=2,
        ),
    )
    t = task(task_config=config, image="repo/task:2", requests=Resources(cpu="1", mem="1Gi"), env={"K": "v"})(
        fn
    )
    job = t.to_job()
    master, worker = _container(job, "master"), _container(job, "worker")
    assert master["image"] == "repo/master:1" and worker["image"] == "repo/task:2"
    assert master["resources"] == {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2"}}
    assert worker["resources"] == {"requests": {"cpu": "1", "memory": "1Gi"}}
    assert {"name": "K", "value": "v"} in worker["env"]
    assert job.task("master").template.restart_policy == "Always"  # type: ignore[union-attr]
    assert job.task("worker").template.restart_policy == "OnFailure"  # type: ignore[union-attr]
    assert job.run_policy is not None
    assert (job.run_policy.clean_pod_policy, job.run_policy.ttl_seconds_after_finished) == ("Running", 60)
    assert (job.run_policy.active_deadline_seconds, job.run_policy.backoff_limit) == (600, 2)
    # Volcano's side: a failed pod restarts the job up to backoff_limit times; TTL is carried over.
    assert [(p.events, p.action) for p in job.spec.policies] == [(["PodFailed"], "RestartJob")]
    assert job.spec.max_retry == 3 and job.spec.ttl_seconds_after_finished == 60  # 2 restarts, 3 runs


def test_pytorch_with_zero_workers_is_master_only() -> None:
    job = task(task_config=PyTorch(worker=Worker(replicas=0)))(fn).to_job()
    assert [(x.name, x.replicas) for x in job.spec.tasks] == [("master", 1)]


@pytest.mark.parametrize(
    ("nnodes", "nproc", "pods", "min_nodes", "max_nodes"),
    [
        (1, 1, [("master", 1)], 1, 1),
        ("1:1", 4, [("master", 1)], 1, 1),
        (2, 2, [("master", 1), ("worker", 1)], 2, 2),
        ("1:4", 8, [("master", 1), ("worker", 3)], 1, 4),
    ],
)
def test_elastic_job(
    nnodes: Any, nproc: int, pods: list[tuple[str, int]], min_nodes: int, max_nodes: int
) -> None:
    config = Elastic(nnodes=nnodes, nproc_per_node=nproc, max_restarts=3, rdzv_configs={"timeout": 60})
    job = task(task_config=config)(fn).to_job()
    assert [(x.name, x.replicas) for x in job.spec.tasks] == pods
    assert job.spec.min_available == min_nodes  # gang-schedule only the minimum
    command = _command(job)
    assert "--elastic" in command
    assert _flag(command, "--nnodes") == f"{min_nodes}:{max_nodes}"
    assert _flag(command, "--nproc-per-node") == str(nproc)
    assert _flag(command, "--max-restarts") == "3"
    assert json.loads(_flag(command, "--rdzv-configs")) == {"timeout": 60}
    assert job.elastic is not None
    e = job.elastic
    assert (e.min_nodes, e.max_nodes, e.nproc_per_node, e.rdzv_backend) == (
        min_nodes,
        max_nodes,
        nproc,
        "c10d",
    )
    assert (e.max_restarts, e.rdzv_timeout, e.rdzv_join_timeout, e.start_method) == (3, 60, 900, "spawn")


def test_elastic_run_policy_reaches_the_job() -> None:
    config = Elastic(nnodes=2, run_policy=RunPolicy(clean_pod_policy=CleanPodPolicy.ALL))
    job = task(task_config=config)(fn).to_job()
    assert job.run_policy is not None and job.run_policy.clean_pod_policy == "All"
    assert [(p.events, p.action) for p in job.spec.policies] == [(["PodFailed"], "TerminateJob")]


def test_master_task_completion_completes_the_job() -> None:
    job = task(task_config=PyTorch(num_workers=1))(fn).to_job()
    master = job.task("master")
    assert master is not None
    assert [(p.events, p.action) for p in master.policies] == [(["TaskCompleted"], "CompleteJob")]


def test_shared_memory_volume_can_be_turned_off() -> None:
    on = task(task_config=Elastic(nnodes=2))(fn).to_job()
    assert _container(on, "worker")["volumeMounts"] == [{"name": "shm", "mountPath": "/dev/shm"}]
    off = task(task_config=Elastic(nnodes=2, increase_shared_mem=False))(fn).to_job()
    assert "volumeMounts" not in _container(off, "worker")


def test_plain_task_is_one_pod() -> None:
    job = task(fn).to_job()
    assert [(x.name, x.replicas) for x in job.spec.tasks] == [("master", 1)]
    assert job.elastic is None


def test_with_overrides_returns_a_new_task_and_keeps_the_original() -> None:
    original_config = Elastic(nnodes=2, nproc_per_node=2)
    t = task(task_config=original_config, image="repo/a:1")(fn)
    single = t.with_overrides(task_config=Elastic(nnodes=1, nproc_per_node=1))
    assert single is not t
    assert t.task_config is original_config and t.image == "repo/a:1"
    assert [x.replicas for x in t.to_job().spec.tasks] == [1, 1]
    assert [x.replicas for x in single.to_job().spec.tasks] == [1]
    wider = t.with_overrides(task_config=Elastic(nnodes="2:6"))
    assert [x.replicas for x in wider.to_job().spec.tasks] == [1, 5]
    assert wider.to_job().elastic.min_nodes == 2  # type: ignore[union-attr]
    # The type may change, too.
    as_pytorch = t.with_overrides(task_config=PyTorch(worker=Worker(replicas=4)), image="repo/b:2")
    assert [x.replicas for x in as_pytorch.to_job().spec.tasks] == [1, 4]
    assert as_pytorch.to_job().elastic is None
    assert _container(as_pytorch.to_job(), "master")["image"] == "repo/b:2"
    assert t.image == "repo/a:1" and isinstance(t.task_config, Elastic)
    # Mutating the override's config afterwards does not reach either task.
    override = Elastic(nnodes=3)
    three = t.with_overrides(task_config=override)
    override.nproc_per_node = 7
    assert three.task_config.nproc_per_node == 1  # type: ignore[union-attr]


def test_with_overrides_rejects_bad_config() -> None:
    t = task(task_config=Elastic())(fn)
    with pytest.raises(ValueError):
        t.with_overrides(task_config=Elastic(nnodes="3:2"))
    with pytest.raises(ValueError, match="task_config must be"):
        t.with_overrides(task_config=42)  # type: ignore[arg-type]


def test_long_function_names_give_valid_jobs() -> None:
    def a_very_long_function_name_that_keeps_going_and_going_and_going() -> None: ...

    job = task(task_config=PyTorch(num_workers=12))(
        a_very_long_function_name_that_keeps_going_and_going_and_going
    )
    assert len(job.to_job().name) <= 40


TASK_FILE = textwrap.dedent(
    """
    from torchjob import Elastic, PyTorch, Worker, task

    @task(task_config=PyTorch(worker=Worker(replicas=2)), image="repo/train:1")
    def train() -> int:
        return 1

    @task(task_config=Elastic(nnodes="1:3", nproc_per_node=2))
    def stretch() -> int:
        return 2

    not_a_task = 3

    if __name__ == "__main__":
        raise SystemExit("the main block must not run on import")
    """
)


@pytest.fixture
def task_file(tmp_path: Path) -> Path:
    path = tmp_path / "jobs_file.py"
    path.write_text(TASK_FILE)
    return path


def test_load_jobs_accepts_a_task_reference(task_file: Path) -> None:
    [loaded] = load_ref(f"{task_file}:stretch")
    assert [(x.name, x.replicas) for x in loaded.job.spec.tasks] == [("master", 1), ("worker", 2)]
    assert _flag(_command(loaded.job), "--task") == f"{task_file}:stretch"
    assert loaded.job.elastic is not None and loaded.job.elastic.max_nodes == 3


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("missing", "no task named 'missing'; tasks in this file: stretch, train"),
        ("not_a_task", "not a function"),
    ],
)
def test_load_jobs_bad_reference(task_file: Path, name: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        load_ref(f"{task_file}:{name}")
    assert message in str(info.value)


def test_cli_render_task(task_file: Path) -> None:
    out = torchjob("render", "-o", "json", f"{task_file}:train", timeout=120)
    assert out.returncode == 0, out.stderr
    items = json.loads(out.stdout)["items"]
    pods = [i for i in items if i["kind"] == "Pod"]
    assert [p["metadata"]["name"] for p in pods] == ["train-master-0", "train-worker-0", "train-worker-1"]
    container = pods[1]["spec"]["containers"][0]
    assert container["image"] == "repo/train:1"
    assert container["command"] == ["python", "-m", "torchjob.sdk.entrypoint", "--task", f"{task_file}:train"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MASTER_ADDR"] == "train-master-0.train" and env["RANK"] == "1" and env["WORLD_SIZE"] == "3"


def test_cli_validate_task_and_errors(task_file: Path, tmp_path: Path) -> None:
    ok = torchjob("validate", f"{task_file}:stretch", timeout=120)
    assert ok.returncode == 0 and "valid; 3 pods" in ok.stdout
    missing = torchjob("render", f"{task_file}:missing", timeout=120)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().splitlines() == [
        f"{task_file}: missing: no task named 'missing'; tasks in this file: stretch, train"
    ]
    bad = tmp_path / "bad_config.py"
    bad.write_text(
        "from torchjob import Elastic, task\n@task(task_config=Elastic(nnodes='4:1'))\ndef f(): ...\n"
    )
    out = torchjob("render", f"{bad}:f", timeout=120)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert str(bad) in out.stderr and "nnodes='4:1'" in out.stderr
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    out = torchjob("render", f"{broken}:f", timeout=120)
    assert out.returncode == 2 and f"{broken}:1:" in out.stderr and "syntax error" in out.stderr


def _entrypoint(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchjob.sdk.entrypoint", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd, check=False,
    )  # fmt: skip


def test_entrypoint_prints_a_value_python_cannot_turn_into_text(tmp_path: Path) -> None:
    """A pod's rank 0 that returned an int past Python's digits limit still succeeds."""
    (tmp_path / "huge.py").write_text(
        "from torchjob import task\n\n@task\ndef huge() -> int:\n    return 10**5000\n"
    )
    out = _entrypoint("--task", f"{tmp_path / 'huge.py'}:huge", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("torchjob: rank 0 returned an integer of 5001 digits, too many to print")


def test_entrypoint_runs_a_task_reference_without_a_caller(task_file: Path) -> None:
    # What a cluster pod runs: no caller waits, so rank 0's value goes to the log.
    out = _entrypoint("--task", f"{task_file}:train", cwd=task_file.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "torchjob: rank 0 returned 1"
    by_module = _entrypoint("--task", "jobs_file:stretch", cwd=task_file.parent)
    assert by_module.returncode == 0 and by_module.stdout.strip() == "torchjob: rank 0 returned 2"


def test_entrypoint_bad_reference(tmp_path: Path) -> None:
    out = _entrypoint("--task", "missing.py:fn", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip() == "torchjob: missing.py: no such file"
