"""End-to-end: the examples run for real, on this machine, with real torch.distributed (gloo, CPU).

Each example goes through the local engine as a user would run it: in-process through the engine
interface and through the real ``torchjob run`` command. The programs print one line per fact they verified
(values received, loss fallen, restart seen); these tests read those lines from the job's log files,
so a job that "completes" without doing the work fails here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import job_dir as dir_of
from support import start
from torchjob.engine_api.base import JobReport
from torchjob.engines.local.process import marked_processes
from torchjob.jobs import load_jobs

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
TORCHJOB = Path(sys.executable).parent / "torchjob"
RUN_TIMEOUT = 100.0  # seconds for one job; the tests' own limit is above it

pytestmark = [
    pytest.mark.torch,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private TORCHJOB_HOME so job directories and logs of a test are its own."""
    monkeypatch.setenv("TORCHJOB_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(ROOT)  # the examples' relative paths resolve against the repo root
    yield tmp_path / "home"


def run_example(name: str) -> JobReport:
    (loaded,) = load_jobs(str(EXAMPLES / name))
    return start("local", loaded.job, {}, quiet=True, timeout=RUN_TIMEOUT)


def logs(job_dir: Path, pod: str, attempt: int | None = None) -> str:
    """Every container log of one pod (one attempt, or all), concatenated."""
    pattern = f"attempt-{attempt}" if attempt is not None else "attempt-*"
    files = sorted((job_dir / "logs" / pod).glob(f"{pattern}/*.log"))
    assert files, f"no logs for {pod} ({pattern}) in {job_dir}"
    return "".join(f.read_text(errors="replace") for f in files)


def attempts(job_dir: Path, pod: str) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (job_dir / "logs" / pod).glob("attempt-*"))


def status(job_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((job_dir / "status.json").read_text())
    return data


def assert_nothing_left(job_dir: Path) -> None:
    """No process of the job outlives it (the job id is its directory's name)."""
    left = marked_processes(job_dir.name)
    assert not left, f"processes of {job_dir.name} still alive: {[p.pid for p in left]}"


def assert_completed(result: JobReport) -> None:
    assert result.ok, f"job ended {result.phase}: {result.reason}"
    assert result.phase == "Completed"


def check_sendrecv_logs(job_dir: Path, job: str = "pytorch-job") -> str:
    """The verification lines of examples/programs/sendrecv.py, for 1 master and 2 workers."""
    master = logs(job_dir, f"{job}-master-0")
    assert "sendrecv: rank 0 ring of 3: 3 messages from rank 2 verified" in master
    assert "sendrecv: rank 0 got correct replies from 2 workers" in master
    assert "sendrecv: all 3 ranks verified" in master
    for index in (0, 1):
        rank = index + 1
        worker = logs(job_dir, f"{job}-worker-{index}")
        assert f"sendrecv: rank {rank} ring of 3: 3 messages from rank {rank - 1} verified" in worker
        assert f"sendrecv: rank {rank} verified the master's message and replied" in worker
        assert f"sendrecv: rank {rank} OK" in worker
    assert "MISMATCH" not in master
    # The master's cluster name when pod names resolve here, else its per-pod loopback address;
    # the port is the one the job got.
    joined = re.search(r"sendrecv: rank 0 of 3 joined the group at ([\w.-]+):(\d+)", master)
    assert joined, master
    named = status(job_dir).get("nameResolution") == "resolved"
    assert (joined[1] == f"{job}-master-0.{job}") if named else joined[1].startswith("127."), joined[1]
    return f"{joined[1]}:{joined[2]}"


@pytest.mark.timeout(120)
def test_pytorch_job_in_process(home: Path) -> None:
    result = run_example("pytorch-job.yaml")
    assert_completed(result)
    check_sendrecv_logs(dir_of(result))
    # Workers waited for the master with the plugin's init container before they started.
    assert "is ready" in logs(dir_of(result), "pytorch-job-worker-0")
    assert_nothing_left(dir_of(result))


@pytest.mark.timeout(120)
def test_pytorch_job_cli(home: Path) -> None:
    """`torchjob run examples/pytorch-job.yaml` (what `make demo` runs), as a user types it."""
    proc = subprocess.run(
        [str(TORCHJOB), "run", "examples/pytorch-job.yaml"],
        cwd=ROOT,
        env={**os.environ, "TORCHJOB_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    # Every line of a container is prefixed with its pod and rank.
    assert re.search(r"master-0.*sendrecv: all 3 ranks verified", out), out[-3000:]
    assert re.search(r"worker-1.*sendrecv: rank 2 OK", out), out[-3000:]
    (job_dir,) = (home / "jobs").iterdir()
    check_sendrecv_logs(job_dir)
    assert_nothing_left(job_dir)


@pytest.mark.timeout(120)
def test_two_copies_of_pytorch_job_at_once(home: Path) -> None:
    """Both pin --port=23456; the engine maps each job's port to its own free host port."""
    env = {**os.environ, "TORCHJOB_HOME": str(home)}
    procs = [
        subprocess.Popen(
            [str(TORCHJOB), "run", "examples/pytorch-job.yaml"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=110)
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out[-3000:]
    job_dirs = sorted((home / "jobs").iterdir())
    assert len(job_dirs) == 2
    ports = []
    for job_dir in job_dirs:
        port = int(check_sendrecv_logs(job_dir).split(":")[1])
        # The status says which host port the job's declared port 23456 got, and it is the one used.
        assert {"declared": 23456, "host": port} in status(job_dir)["ports"]
        ports.append(port)
        assert_nothing_left(job_dir)
    assert ports[0] != ports[1], f"both jobs used host port {ports[0]}"


@pytest.mark.timeout(120)
def test_ddp_train_loss_goes_down(home: Path) -> None:
    result = run_example("ddp-train.yaml")
    assert_completed(result)
    master = logs(dir_of(result), "ddp-train-master-0")
    losses = [float(x) for x in re.findall(r"ddp: step +\d+ loss ([\d.]+)", master)]
    assert len(losses) >= 5, master
    assert losses[-1] < 0.2 * losses[0], losses
    for pod in ("ddp-train-master-0", "ddp-train-worker-0", "ddp-train-worker-1"):
        assert re.search(r"ddp: rank \d OK: replicas identical", logs(dir_of(result), pod)), pod
    assert_nothing_left(dir_of(result))


@pytest.mark.timeout(120)
def test_restart_on_failure_restarts_then_completes(home: Path) -> None:
    result = run_example("restart-on-failure.yaml")
    assert_completed(result)
    job_dir = dir_of(result)
    crashed = "restart-on-failure-worker-1"
    tries = attempts(job_dir, crashed)
    assert len(tries) == 2, f"{crashed} ran {len(tries)} attempts: {tries}"
    assert status(job_dir)["retryCount"] == 1
    first = tries[0]
    assert "rank 2 crashing on purpose at step 0 of attempt 1" in logs(job_dir, crashed, first)
    # RestartJob restarts every pod, and the second attempt sees retry count 1 from the annotation.
    for pod, rank in (("master-0", 0), ("worker-0", 1), ("worker-1", 2)):
        name = f"restart-on-failure-{pod}"
        assert len(attempts(job_dir, name)) == 2, name
        again = logs(job_dir, name, attempts(job_dir, name)[-1])
        assert f"rank {rank} of 3 started, attempt 2 (retry count 1)" in again
        assert f"rank {rank} completed 5 all-reduce steps on attempt 2" in again
    assert_nothing_left(job_dir)


@pytest.mark.timeout(60)
def test_sendrecv_check_can_fail(tmp_path: Path) -> None:
    """The example's verification is real: a rank that sends wrong values makes its neighbour fail."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "3"}
    env["SENDRECV_CORRUPT_RANK"] = "1"
    env["SENDRECV_TIMEOUT"] = "20"
    program = str(EXAMPLES / "programs" / "sendrecv.py")
    procs = [
        subprocess.Popen(
            [sys.executable, program],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(3)
    ]
    try:
        outs = [p.communicate(timeout=50)[0] for p in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    assert "sendrecv: MISMATCH in ring step 0 from rank 1" in outs[2], outs[2]
    assert procs[2].returncode == 1
    assert all("sendrecv: all 3 ranks verified" not in out for out in outs)
