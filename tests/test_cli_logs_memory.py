"""`torchjob logs JOB` prints a log of any size in bounded memory (issue 33: a 287 MB log took 840 MB)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_local_support import cli, container, make_job, task, write_job

pytestmark = pytest.mark.timeout(180)

LINES = 600_000  # 60 MB of 100-byte lines: held whole, as LogLine objects, well over 200 MB


def test_logs_of_a_large_log_stay_in_bounded_memory(tmp_path: Path) -> None:
    program = f"import sys; sys.stdout.write(('x' * 99 + '\\n') * {LINES})"
    job = make_job("biglog", [task("main", [container("main", [sys.executable, "-c", program])])])
    path = write_job(tmp_path, job)
    ran = cli(tmp_path, "run", "--detach", path, timeout=60)
    assert ran.returncode == 0, ran.stderr
    waited = cli(tmp_path, "wait", "biglog", "--timeout", "120", timeout=150)
    assert waited.returncode == 0, waited.stderr
    # The peak resident memory of the `logs` process alone: the child of a small wrapper.
    wrapper = (
        "import resource, subprocess, sys\n"
        "done = subprocess.run([sys.executable, '-m', 'torchjob', 'logs', 'biglog'],"
        " stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)\n"
        "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
        "print(done.returncode, done.stdout.count(b'\\n'), peak)\n"
    )
    env = {**os.environ, "TORCHJOB_HOME": str(tmp_path / "home")}
    out = subprocess.run(
        [sys.executable, "-c", wrapper], env=env, capture_output=True, text=True, timeout=150
    )
    code, lines, peak_kib = (int(word) for word in out.stdout.split())
    assert code == 0, out.stderr
    assert lines == LINES  # every line printed
    assert peak_kib < 80 * 1024, f"logs held {peak_kib // 1024} MiB for a {LINES // 10_000} MB log"
