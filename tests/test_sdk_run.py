"""Calling SDK tasks runs them for real: torch.distributed with gloo on CPU, in real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from support import kept_by_design
from torchjob import Elastic, PyTorch, RemoteError, RunPolicy, Worker, task

pytest.importorskip("torch", reason="torch is not installed")
pytestmark = [pytest.mark.torch, pytest.mark.timeout(240)]


@pytest.fixture(autouse=True)
def _job_dirs_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Local-engine job directories go under the test's tmp dir, not ~/.torchjob."""
    monkeypatch.setenv("TORCHJOB_HOME", str(tmp_path / "home"))


def _live_children() -> list[psutil.Process]:
    """Our child processes, minus multiprocessing's long-lived resource tracker and what outlives
    a call by design (support.kept_by_design: the warm pool's server and its idle spares)."""
    alive = []
    servers = kept_by_design()
    for child in psutil.Process().children(recursive=True):
        try:
            line = " ".join(child.cmdline())
            if "resource_tracker" in line or child.pid in servers or child.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.NoSuchProcess:
            continue
        alive.append(child)
    return alive


def _assert_no_children() -> None:
    deadline = time.monotonic() + 10
    while _live_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _live_children() == []


@task(task_config=Elastic(nproc_per_node=1))
def whoami(x: int) -> tuple[int, int]:
    return os.getpid(), x * 2


def test_single_process_is_a_direct_call() -> None:
    pid, value = whoami(21)
    assert (pid, value) == (os.getpid(), 42)
    for nnodes in ("1", "1:1"):
        assert whoami.with_overrides(task_config=Elastic(nnodes=nnodes))(5) == (os.getpid(), 10)


@task(task_config=Elastic(nproc_per_node=3))
def all_reduce_sum(offset: float) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        value = torch.tensor([float(dist.get_rank()) + offset])
        dist.all_reduce(value)
        return {
            "rank": dist.get_rank(),
            "world": dist.get_world_size(),
            "sum": value.item(),
            "pid": os.getpid(),
        }
    finally:
        dist.destroy_process_group()


def test_elastic_single_node_all_reduce_returns_rank_0() -> None:
    out = all_reduce_sum(10.0)
    assert out["rank"] == 0 and out["world"] == 3
    assert out["sum"] == 0 + 1 + 2 + 3 * 10.0
    assert out["pid"] != os.getpid()
    _assert_no_children()


@task(task_config=Elastic(nproc_per_node=3))
def fail_on_rank_2() -> str:
    if os.environ["RANK"] == "2":
        raise KeyError("rank two has no key")
    time.sleep(120)  # the launcher must stop the other ranks, not wait for them
    return "unreachable"


def test_exception_in_rank_2_of_3_reaches_the_caller() -> None:
    started = time.monotonic()
    with pytest.raises(RemoteError) as info:
        fail_on_rank_2()
    error = info.value
    assert time.monotonic() - started < 90
    assert (error.rank, error.exc_type) == (2, "KeyError")
    assert "rank two has no key" in error.message
    assert (
        __file__ in error.remote_traceback
        and 'raise KeyError("rank two has no key")' in error.remote_traceback
    )
    assert isinstance(error.original, KeyError) and error.__cause__ is error.original
    assert str(error).startswith("rank 2 raised KeyError:")
    _assert_no_children()


@task(task_config=Elastic(nproc_per_node=2, max_restarts=1))
def fails_differently_when_restarted() -> None:
    attempt, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
    if (attempt, rank) == ("0", "1"):
        raise ValueError("the first attempt's rank 1 fails")
    if (attempt, rank) == ("1", "0"):
        raise KeyError("the second attempt's rank 0 fails")
    time.sleep(120)  # the launcher stops the other rank


def test_after_a_restart_the_caller_gets_the_last_attempts_error() -> None:
    """As torchrun reports its last attempt's failure: attempt 0's record of rank 1 (a ValueError,
    raised first of all) is not the error the call raises, and is mentioned after it."""
    with pytest.raises(RemoteError) as info:
        fails_differently_when_restarted()
    error = info.value
    assert (error.rank, error.exc_type) == (0, "KeyError"), str(error)
    assert isinstance(error.original, KeyError) and error.__cause__ is error.original
    head = str(error).splitlines()[:2]
    assert head == [
        'rank 0 raised KeyError: "the second attempt\'s rank 0 fails"',
        "(in the last attempt; 1 earlier one failed too: "
        "rank 1 raised ValueError: the first attempt's rank 1 fails)",
    ], head
    _assert_no_children()


@task(task_config=PyTorch(worker=Worker(replicas=1), run_policy=RunPolicy(backoff_limit=1)))
def pods_fail_differently_when_restarted() -> None:
    retry, rank = os.environ["TORCHJOB_RETRY_COUNT"], os.environ["RANK"]
    if (retry, rank) == ("0", "1"):
        raise ValueError("the first run's worker fails")
    if (retry, rank) == ("1", "0"):
        raise KeyError("the second run's master fails")
    time.sleep(120)  # the job stops the other pod


def test_after_a_restart_of_the_job_the_caller_gets_the_last_runs_error() -> None:
    with pytest.raises(RemoteError) as info:
        pods_fail_differently_when_restarted()
    assert (info.value.rank, info.value.exc_type) == (0, "KeyError"), str(info.value)
    assert info.value.earlier == ("rank 1 raised ValueError: the first run's worker fails",)
    _assert_no_children()


@task(task_config=Elastic(nproc_per_node=2))
def make_closure(base: int) -> Any:
    def add(y: int) -> int:
        return base + y

    return add


def test_values_cross_with_cloudpickle() -> None:
    add = make_closure(40)
    assert add(2) == 42


SCRIPT = textwrap.dedent(
    """
    import os, sys
    from torchjob import Elastic, PyTorch, RemoteError, Worker, task

    @task(task_config=Elastic(nproc_per_node=2))
    def ranks(tag):
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        out = [torch.zeros(1) for _ in range(dist.get_world_size())]
        dist.all_gather(out, torch.tensor([float(os.environ["RANK"])]))
        dist.destroy_process_group()
        return [(int(t.item()), tag) for t in out]

    class Boom(Exception):
        pass

    @task(task_config=Elastic(nproc_per_node=2))
    def boom():
        if os.environ["RANK"] == "1":
            raise Boom("defined in __main__")
        return 0

    if __name__ == "__main__":
        print("ranks", ranks("main"))
        try:
            boom()
        except RemoteError as err:
            print("error", err.rank, err.exc_type, type(err.original).__name__)
        if len(sys.argv) > 1:
            multi = ranks.with_overrides(task_config=PyTorch(worker=Worker(replicas=1)))
            print("pods", multi("pods"))
    """
)


@pytest.fixture(scope="module")
def main_script_lines(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """What SCRIPT prints run once as ``python main_task.py pods``: its elastic calls print the same
    first lines with or without the argument, so both tests read one run (a run costs 5-15 s)."""
    folder = tmp_path_factory.mktemp("main_task")
    script = folder / "main_task.py"
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), "pods"],
        capture_output=True,
        text=True,
        timeout=200,
        cwd=folder,
        # _job_dirs_in_tmp is not set up yet for a module's fixture: its own home, said here.
        env={**os.environ, "TORCHJOB_HOME": str(folder / "home")},
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.splitlines()


def test_task_defined_in_main(main_script_lines: list[str]) -> None:
    assert main_script_lines[0] == "ranks [(0, 'main'), (1, 'main')]"
    assert main_script_lines[1] == "error 1 Boom Boom"


def test_task_defined_in_main_on_the_local_engine(main_script_lines: list[str]) -> None:
    assert "pods [(0, 'pods'), (1, 'pods')]" in main_script_lines


@task(task_config=PyTorch(worker=Worker(replicas=2)))
def pods_all_reduce(offset: float) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        value = torch.tensor([float(dist.get_rank()) + offset])
        dist.all_reduce(value)
        print(f"rank {dist.get_rank()} got {value.item()}", flush=True)
        return {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": value.item()}
    finally:
        dist.destroy_process_group()


def test_pytorch_master_and_workers_all_reduce(capfd: pytest.CaptureFixture[str]) -> None:
    out = pods_all_reduce(1.0)
    assert out == {"rank": 0, "world": 3, "sum": 0 + 1 + 2 + 3.0}
    # Every pod's output reaches the caller, prefixed with the pod.
    printed = capfd.readouterr().out.splitlines()
    for line in ("master-0 | rank 0 got 6.0", "worker-0 | rank 1 got 6.0", "worker-1 | rank 2 got 6.0"):
        assert line in printed
    _assert_no_children()


@task(task_config=PyTorch(worker=Worker(replicas=2)))
def pods_fail_on_rank_2() -> None:
    if os.environ["RANK"] == "2":
        raise ValueError("worker 1 is rank 2 and fails")
    time.sleep(120)


def test_pytorch_exception_in_rank_2_of_3() -> None:
    started = time.monotonic()
    with pytest.raises(RemoteError) as info:
        pods_fail_on_rank_2()
    assert time.monotonic() - started < 90
    assert (info.value.rank, info.value.exc_type) == (2, "ValueError")
    assert "worker 1 is rank 2 and fails" in str(info.value) and __file__ in info.value.remote_traceback
    _assert_no_children()


@task(task_config=Elastic(nnodes=2, nproc_per_node=1))
def nodes_all_reduce() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        value = torch.tensor([1.0])
        dist.all_reduce(value)
        return {"world": dist.get_world_size(), "sum": value.item(), "pid": os.getpid()}
    finally:
        dist.destroy_process_group()


def test_with_overrides_switches_between_single_and_multi_node(capfd: pytest.CaptureFixture[str]) -> None:
    multi = nodes_all_reduce()
    assert (multi["world"], multi["sum"]) == (2, 2.0)
    assert "2/2 nodes joined" in capfd.readouterr().err
    single = nodes_all_reduce.with_overrides(task_config=Elastic(nnodes=1, nproc_per_node=1))
    # One process: a direct call; without a launcher the test process itself initialises gloo.
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0", "RANK": "0", "WORLD_SIZE": "1"})
    try:
        out = single()
    finally:
        for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
            os.environ.pop(key, None)
    assert (out["world"], out["sum"], out["pid"]) == (1, 1.0, os.getpid())
    wider = nodes_all_reduce.with_overrides(task_config=Elastic(nnodes="1:3", nproc_per_node=2))
    out = wider()
    assert (out["world"], out["sum"]) == (6, 6.0)
    assert nodes_all_reduce.task_config.nnodes == 2  # type: ignore[union-attr]
    _assert_no_children()


@task(task_config=Elastic(nnodes=2, nproc_per_node=1))
def nodes_fail_on_rank_1() -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise RuntimeError("node rank 1 gives up")
    time.sleep(120)


def test_multi_node_elastic_exception_reaches_the_caller() -> None:
    started = time.monotonic()
    with pytest.raises(RemoteError) as info:
        nodes_fail_on_rank_1()
    assert time.monotonic() - started < 120
    assert (info.value.rank, info.value.exc_type, info.value.message) == (
        1,
        "RuntimeError",
        "node rank 1 gives up",
    )
    _assert_no_children()


def test_decisions_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("DEBUG", logger="torchjob"):
        whoami(1)
        task(task_config=Elastic(nnodes="1:4", nproc_per_node=2))(whoami.function).to_job()
    text = caplog.text
    assert "single node, one process: calling the function directly" in text
    assert "elastic 1:4 nodes x 2 processes, c10d rendezvous at the master pod's port 23456" in text


@task(task_config=Elastic(nproc_per_node=2))
def unpicklable_result() -> Any:
    import threading

    return threading.Lock()


def test_unpicklable_return_value_is_a_rank_error() -> None:
    with pytest.raises(RemoteError) as info:
        unpicklable_result()
    assert info.value.rank == 0 and "lock" in info.value.message.lower()


@task(task_config=PyTorch(worker=Worker(replicas=1)))
def pod_exits_hard() -> None:
    if os.environ["RANK"] == "1":
        os._exit(3)
    time.sleep(120)


def test_pod_dying_without_exception_is_task_failed() -> None:
    from torchjob.sdk import TaskFailed

    with pytest.raises(TaskFailed) as info:
        pod_exits_hard()
    assert "exit code 3" in str(info.value)
    _assert_no_children()


def test_an_unknown_torchjob_engine_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchjob.engine_api.base import EngineError

    monkeypatch.setenv("TORCHJOB_ENGINE", "nowhere")
    with pytest.raises(EngineError) as info:
        pod_exits_hard()
    assert str(info.value).startswith("TORCHJOB_ENGINE=nowhere: no engine 'nowhere' (engines: ")


CLI_TASK = textwrap.dedent(
    """
    from torchjob import PyTorch, Worker, task

    @task(task_config=PyTorch(worker=Worker(replicas=1)))
    def world():
        import torch.distributed as dist
        dist.init_process_group("gloo")
        size = dist.get_world_size()
        # Without a collective a rank may leave while its peer still finishes gloo's handshake
        # (the peer then fails: "Connection closed by peer"), under torchrun as here.
        dist.barrier()
        dist.destroy_process_group()
        return {"world": size}
    """
)


def test_cli_run_task_reference(tmp_path: Path) -> None:
    path = tmp_path / "cli_task.py"
    path.write_text(CLI_TASK)
    env = dict(os.environ, TORCHJOB_HOME=str(tmp_path / "home"))
    out = subprocess.run(
        [sys.executable, "-m", "torchjob", "run", f"{path}:world"],
        capture_output=True, text=True, timeout=200, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "torchjob: rank 0 returned {'world': 2}" in out.stdout + out.stderr


@task(task_config=PyTorch(worker=Worker(replicas=1), run_policy=RunPolicy(active_deadline_seconds=3)))
def sleeps_past_deadline() -> None:
    time.sleep(120)


def test_active_deadline_stops_a_local_run() -> None:
    from torchjob.sdk import TaskFailed

    started = time.monotonic()
    with pytest.raises(TaskFailed):
        sleeps_past_deadline()
    assert time.monotonic() - started < 60
    _assert_no_children()


@task(task_config=PyTorch(worker=Worker(replicas=1), run_policy=RunPolicy(backoff_limit=1)))
def fails_on_the_first_attempt() -> str:
    if os.environ.get("TORCHJOB_RETRY_COUNT") == "0":
        os._exit(3)  # the pod dies: the job's failure policy decides
    return os.environ["TORCHJOB_RETRY_COUNT"]


def test_backoff_limit_is_the_number_of_restarts() -> None:
    # backoff_limit=1 allows one restart (docs/sdk.md), so the second attempt runs and succeeds.
    assert fails_on_the_first_attempt() == "1"
    _assert_no_children()
