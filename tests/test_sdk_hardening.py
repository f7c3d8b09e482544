"""SDK calls end the way they should: deadlines, lost or broken rank errors, sys.exit, Ctrl-C and
torch's abort at exit (issue 8). Real torch.distributed jobs with gloo on CPU, in real processes."""

from __future__ import annotations

import os
import re
import runpy
import signal
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
from torchjob.sdk import TaskFailed

pytest.importorskip("torch", reason="torch is not installed")
pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parent.parent
ELASTIC = Elastic(nproc_per_node=2)
PODS = PyTorch(worker=Worker(replicas=1))


@pytest.fixture(autouse=True)
def _job_dirs_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Local-engine job directories go under the test's tmp dir, not ~/.torchjob."""
    monkeypatch.setenv("TORCHJOB_HOME", str(tmp_path / "home"))


def _live(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in processes:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            continue
    return alive


def _our_children() -> list[psutil.Process]:
    """Our child processes, minus multiprocessing's long-lived resource tracker and what outlives
    a call by design (support.kept_by_design: the warm pool's server and its idle spares)."""
    children = []
    servers = kept_by_design()
    for child in psutil.Process().children(recursive=True):
        try:
            line = " ".join(child.cmdline())
            if "resource_tracker" not in line and child.pid not in servers:
                children.append(child)
        except psutil.NoSuchProcess:
            continue
    return children


def _assert_gone(processes: list[psutil.Process], within: float = 10) -> None:
    deadline = time.monotonic() + within
    while _live(processes) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _live(processes) == []


# --- RunPolicy(active_deadline_seconds) on a single-node elastic launch ---------------------------


@task(task_config=Elastic(nproc_per_node=2, run_policy=RunPolicy(active_deadline_seconds=3)))
def sleeps_past_its_deadline() -> None:
    time.sleep(120)


def test_single_node_elastic_active_deadline_stops_the_call() -> None:
    started = time.monotonic()
    with pytest.raises(TaskFailed, match=r"active deadline of 3s passed"):
        sleeps_past_its_deadline()
    assert time.monotonic() - started < 40
    _assert_gone(_our_children())


def test_deadline_while_the_workers_start_leaves_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """The deadline raised into the launcher's thread after its first worker started and before
    the second did (where the flaky deadline test's stray came from, under load): torch's launcher
    never learned of the first, a fork of the warm fork server; it is stopped all the same."""
    import multiprocessing.process

    from torchjob.sdk.elastic import DeadlinePassed

    real_start = multiprocessing.process.BaseProcess.start
    started: list[int] = []

    def start_then_deadline(self: Any) -> None:
        if getattr(getattr(self, "_target", None), "__module__", "") == "torch.multiprocessing.spawn":
            if started:
                raise DeadlinePassed
            real_start(self)
            started.append(self.pid)
            return
        real_start(self)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start_then_deadline)
    with pytest.raises(TaskFailed, match=r"active deadline of 60s passed"):
        ends_before_its_deadline()
    assert len(started) == 1
    _assert_gone([psutil.Process(started[0])] if psutil.pid_exists(started[0]) else [])
    _assert_gone(_our_children())


@task(task_config=Elastic(nproc_per_node=2, run_policy=RunPolicy(active_deadline_seconds=60)))
def ends_before_its_deadline() -> int:
    return int(os.environ["RANK"]) + 7


def test_single_node_elastic_deadline_not_reached_returns_the_value() -> None:
    assert ends_before_its_deadline() == 7


# --- a rank's exception is raised every time, even when rank 0 ends first -------------------------


@task(task_config=PyTorch(worker=Worker(replicas=2)))
def rank_2_fails_rank_0_returns() -> str:
    if os.environ["RANK"] == "2":
        raise ValueError("rank 2 found a corrupt shard")
    return "rank 0 is done"


def test_worker_exception_is_raised_even_when_the_master_returns_first() -> None:
    for call in range(6):
        with pytest.raises(RemoteError) as info:
            rank_2_fails_rank_0_returns()
        assert (info.value.rank, info.value.exc_type) == (2, "ValueError"), f"call {call}"
        assert "corrupt shard" in info.value.message


# --- an exception whose str() raises ---------------------------------------------------------------


class BrokenText(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text today")


def raises_broken_text() -> None:
    if os.environ["RANK"] == "1":
        raise BrokenText("the real problem")


@pytest.mark.parametrize("config", [ELASTIC, PODS], ids=["elastic", "pytorch"])
def test_exception_with_a_broken_str_is_reported(config: Any) -> None:
    with pytest.raises(RemoteError) as info:
        task(task_config=config)(raises_broken_text)()
    error = info.value
    assert error.rank == 1 and error.exc_type.endswith("BrokenText")
    assert "str() of the BrokenText failed with RuntimeError: no text today" in error.message
    assert 'raise BrokenText("the real problem")' in error.remote_traceback
    assert isinstance(error.original, BrokenText)


# --- sys.exit in a rank means the same under PyTorch and Elastic ------------------------------------


def exits_with(code: int | None) -> str:
    if os.environ["RANK"] == "1" or code is None:
        sys.exit(code)
    return "rank 0 returned"


@pytest.mark.parametrize("config", [ELASTIC, PODS], ids=["elastic", "pytorch"])
def test_sys_exit_0_ends_a_rank_successfully(config: Any) -> None:
    exiting = task(task_config=config)(exits_with)
    assert exiting(0) == "rank 0 returned"  # rank 1 exits 0: not an error
    assert exiting(None) is None  # every rank, rank 0 included, exits without a value


@pytest.mark.parametrize("config", [ELASTIC, PODS], ids=["elastic", "pytorch"])
def test_sys_exit_nonzero_is_a_rank_error(config: Any) -> None:
    with pytest.raises(RemoteError) as info:
        task(task_config=config)(exits_with)(3)
    assert (info.value.rank, info.value.exc_type, info.value.message) == (
        1,
        "SystemExit",
        "the rank called sys.exit(3)",
    )


# --- Ctrl-C during a single-node elastic call -----------------------------------------------------

CTRL_C_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from torchjob import Elastic, task

    @task(task_config=Elastic(nproc_per_node=2))
    def wait_forever(folder):
        with open(os.path.join(folder, f"rank-{os.environ['RANK']}.pid"), "w") as out:
            out.write(str(os.getpid()))
        time.sleep(300)

    if __name__ == "__main__":
        try:
            wait_forever(sys.argv[1])
        except BaseException as err:
            print("raised", type(err).__module__, type(err).__name__, flush=True)
            raise
    """
)


@pytest.mark.parametrize("to_group", [False, True], ids=["script", "terminal-group"])
def test_ctrl_c_in_single_node_elastic_is_keyboard_interrupt(tmp_path: Path, to_group: bool) -> None:
    """SIGINT to the script alone, or to its whole process group as a terminal's Ctrl-C does."""
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C_SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        start_new_session=True,  # its own process group, like a job in a terminal
    )
    try:
        pids = [tmp_path / "rank-0.pid", tmp_path / "rank-1.pid"]
        deadline = time.monotonic() + 120
        while not all(p.exists() and p.read_text() for p in pids):
            assert proc.poll() is None and time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.1)
        everything = psutil.Process(proc.pid).children(recursive=True)
        ranks = [psutil.Process(int(p.read_text())) for p in pids]
        if to_group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "raised builtins KeyboardInterrupt" in out, err[-3000:]
    assert "SignalException" not in err
    assert proc.returncode == -signal.SIGINT  # what a shell shows as 130
    _assert_gone(ranks + everything)


def test_ctrl_c_that_only_the_ranks_saw_is_keyboard_interrupt(tmp_path: Path) -> None:
    """SIGINT to the ranks alone (the caller missed it, or the user signalled their group): the call
    raises KeyboardInterrupt, not the ranks' RemoteError."""
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C_SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        pids = [tmp_path / "rank-0.pid", tmp_path / "rank-1.pid"]
        deadline = time.monotonic() + 120
        while not all(p.exists() and p.read_text() for p in pids):
            assert proc.poll() is None and time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.1)
        ranks = [psutil.Process(int(p.read_text())) for p in pids]
        for rank in ranks:
            rank.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "raised builtins KeyboardInterrupt" in out, out + err[-3000:]
    assert proc.returncode == -signal.SIGINT
    _assert_gone(ranks)


HELD_SCRIPT = textwrap.dedent(
    """
    import signal, sys
    from torchjob import Elastic, task

    masks = []

    def hook(event, args):
        if event == "import" and args[0] == "torch._C":
            masks.append(signal.pthread_sigmask(signal.SIG_BLOCK, set()))

    @task(task_config=Elastic(nproc_per_node=2))
    def one():
        return 1

    if __name__ == "__main__":
        assert "torch" not in sys.modules
        sys.addaudithook(hook)
        assert one() == 1
        print("held", [sorted(s.name for s in mask) for mask in masks[:1]])
        print("after", sorted(s.name for s in signal.pthread_sigmask(signal.SIG_BLOCK, set())))
    """
)


def test_a_ctrl_c_during_torchs_import_is_held_not_lost(tmp_path: Path) -> None:
    """A Ctrl-C while the caller imported torch for the launcher was sometimes lost (the call went
    on): the launcher's signals are held for the import and handled once it is done."""
    script = tmp_path / "held.py"
    script.write_text(HELD_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "held [['SIGHUP', 'SIGINT', 'SIGQUIT', 'SIGTERM']]" in proc.stdout, proc.stdout
    assert "after []" in proc.stdout


@task(task_config=Elastic(nproc_per_node=2))
def two_ranks() -> int:
    return int(os.environ["WORLD_SIZE"])


def _on_sigterm(signum: int, frame: Any) -> None:
    raise AssertionError("not expected to run")


def test_signal_handlers_are_given_back_after_a_call() -> None:
    mine = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: _on_sigterm}
    saved = {sig: signal.signal(sig, handler) for sig, handler in mine.items()}
    try:
        assert two_ranks() == 2
        assert {sig: signal.getsignal(sig) for sig in mine} == mine
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


# --- ranks end safely when torch would abort at interpreter exit ------------------------------------


def leaves_the_group_busy() -> str:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()  # every rank is past init: none needs rank 0's store any more
    # Work still in gloo's threads at return, and no destroy_process_group: finalizing the
    # interpreter under those threads makes torch 2.13 abort (exit 134) most of the time.
    for _ in range(4):
        dist.all_reduce(torch.ones(1 << 18), async_op=True)
    return "done"


@pytest.mark.parametrize("config", [ELASTIC, PODS], ids=["elastic", "pytorch"])
def test_ranks_end_safely_after_the_result_is_sent(config: Any) -> None:
    busy = task(task_config=config)(leaves_the_group_busy)
    for call in range(4):
        assert busy() == "done", f"call {call}"


# --- the README's Python example ------------------------------------------------------------------


def _readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## From Python", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README.md's 'From Python' section has no python block"
    return match.group(1)


@pytest.mark.slow
def test_readme_python_example_20_calls(tmp_path: Path) -> None:
    """torch 2.13 can abort at interpreter exit (code 134) after the work succeeded; no rank may."""
    path = tmp_path / "readme_example.py"
    path.write_text(_readme_example())
    allreduce = runpy.run_path(str(path), run_name="readme_example")["allreduce"]
    assert isinstance(allreduce.task_config, PyTorch)
    for call in range(20):
        assert allreduce(1.0) == 1.0 + 2.0 + 3.0, f"call {call}"


def test_readme_python_example_runs_as_a_script(tmp_path: Path) -> None:
    path = tmp_path / "readme_example.py"
    path.write_text(_readme_example())
    out = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=240, cwd=tmp_path, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    values = [line for line in out.stdout.splitlines() if "|" not in line]  # pods' lines are prefixed
    assert values == ["6.0", "3.0"]


LINES_SCRIPT = textwrap.dedent(
    """
    from torchjob import Elastic, task

    @task(task_config=Elastic(nproc_per_node=3))
    def chatty():
        import os
        import torch.distributed as dist
        dist.init_process_group("gloo")
        dist.barrier()  # the ranks start printing together
        rank = dist.get_rank()
        for i in range(3000):
            print(f"rank {rank} line {i:04d} " + "x" * 60)
        dist.barrier()
        return rank

    if __name__ == "__main__":
        assert chatty() == 0
    """
)


@pytest.mark.parametrize("unbuffered", [True, False], ids=["unbuffered", "buffered"])
def test_the_workers_of_a_call_print_whole_lines(tmp_path: Path, unbuffered: bool) -> None:
    # The workers share the caller's output. Unbuffered, print writes a line's text and newline
    # apart; buffered, it writes chunks that cut lines. Either way no two workers share a line.
    script = tmp_path / "lines.py"
    script.write_text(LINES_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=200
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [line for line in done.stdout.splitlines() if " line " in line]
    bad = [line for line in printed if not re.fullmatch(r"rank [012] line \d{4} x{60}", line)]
    assert not bad, bad[:3]
    assert len(printed) == 9000


# --- a deadline never lands while torch's agent starts its workers -----------------------------

# A function of torch's agent, as the deadline's check finds it (its name, a file of torch's).
FAKE_AGENT = compile(
    "def _start_workers(seconds, sleep):\n    for _ in range(int(seconds / 0.01)):\n        sleep(0.01)\n",
    "/site-packages/torch/distributed/elastic/agent/server/api.py",
    "exec",
)


def test_a_deadline_that_passes_while_the_workers_start_waits_until_they_are_started() -> None:
    """Raised between the fork server's fork of a worker and the agent's note of its pid, the
    deadline left that worker running unseen (a sleeping rank outlived the call)."""
    from torchjob.sdk.elastic import DeadlinePassed, _deadline

    agent: dict[str, Any] = {}
    exec(FAKE_AGENT, agent)
    started = time.monotonic()
    start_over = 0.0
    with pytest.raises(DeadlinePassed), _deadline(0.05):
        agent["_start_workers"](0.6, time.sleep)
        start_over = time.monotonic() - started
        for _ in range(500):  # the agent's monitoring loop: where the deadline lands
            time.sleep(0.01)
    assert start_over >= 0.6  # the start was not cut short
    assert time.monotonic() - started < 3
