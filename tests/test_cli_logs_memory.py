"""`torchjob logs JOB` prints a log of any size in bounded memory (issue 33: a 287 MB log took 840 MB)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_cluster import SlurmCluster
from support import cli, container, make_job, task, write_job
from test_slurm_engine import cli_env, job_file, torchjob
from test_slurm_engine import task as slurm_task

pytestmark = pytest.mark.timeout(180)

LINES = 600_000  # 60 MB of 100-byte lines: held whole, as LogLine objects, well over 200 MB
PROGRAM = f"import sys; sys.stdout.write(('x' * 99 + '\\n') * {LINES})"


def test_logs_of_a_large_log_stay_in_bounded_memory(tmp_path: Path) -> None:
    job = make_job("biglog", [task("main", [container("main", [sys.executable, "-c", PROGRAM])])])
    path = write_job(tmp_path, job)
    ran = cli(tmp_path, "run", "--detach", path, timeout=60)
    assert ran.returncode == 0, ran.stderr
    waited = cli(tmp_path, "wait", "biglog", "--timeout", "120", timeout=150)
    assert waited.returncode == 0, waited.stderr
    check_logs_in_bounded_memory({**os.environ, "TORCHJOB_HOME": str(tmp_path / "home")}, "biglog")


def test_slurm_logs_of_a_large_log_stay_in_bounded_memory(slurm: SlurmCluster, tmp_path: Path) -> None:
    env = cli_env(slurm, tmp_path / "jobs")
    path = job_file(tmp_path, [slurm_task("main", PROGRAM)])
    ran = torchjob(env, "run", "--engine", "slurm", "--detach", str(path), timeout=60)
    assert ran.returncode == 0, ran.stderr
    waited = torchjob(env, "wait", "sj", "--engine", "slurm", "--timeout", "120", timeout=150)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    check_logs_in_bounded_memory(env, "sj", "--engine", "slurm")


def check_logs_in_bounded_memory(env: dict[str, str], *ref: str) -> None:
    """`torchjob logs REF` prints every line, and its peak resident memory (the child of a small
    wrapper, measured alone) stays far below what holding the log would take."""
    wrapper = (
        "import resource, subprocess, sys\n"
        "done = subprocess.run([sys.executable, '-m', 'torchjob', 'logs', *sys.argv[1:]],"
        " stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)\n"
        "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
        "print(done.returncode, done.stdout.count(b'\\n'), peak)\n"
    )
    argv = [sys.executable, "-c", wrapper, *ref]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=150)
    code, lines, peak_kib = (int(word) for word in out.stdout.split())
    assert code == 0, out.stderr
    assert lines == LINES  # every line printed
    assert peak_kib < 80 * 1024, f"logs held {peak_kib // 1024} MiB for a {LINES // 10_000} MB log"
