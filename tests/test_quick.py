"""Issue 19: the torchrun habit (`torchjob run train.py`), quick mode as solid as a YAML job
(an abort in the interpreter's teardown, the failing rank and its traceback), quick mode on a cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(150)


def _cli(
    tmp_path: Path, *args: str, timeout: float = 60, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TORCHJOB_HOME": str(tmp_path / "home")}
    env.pop("NO_COLOR", None)
    return subprocess.run(
        [sys.executable, "-m", "torchjob", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or tmp_path,
    )


# ------------------------------------------------------------ teardown aborts

# The program's last line runs, then the process aborts as torch 2.13 can in the interpreter's
# teardown: an atexit handler (registered first, so it runs after every other) calls abort().
FINISHES_THEN_ABORTS = """\
import atexit, os, sys
atexit.register(os.abort)
print("work done", flush=True)
if sys.argv[1:] == ["exit0"]:
    sys.exit(0)
"""
ABORTS_MIDWAY = """\
import os
print("about to crash", flush=True)
os.abort()
print("never")
"""
ONE_POD = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {{name: teardown}}
spec:
  tasks:
    - name: main
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          containers:
            - name: main
              image: x
              command: [python, {script}]
              args: {args}
"""
NOTE = "the program finished (exit code 0), then the interpreter aborted (SIGABRT) while shutting down"


@pytest.mark.parametrize("args", [[], ["exit0"]])
def test_a_yaml_pod_that_finished_then_aborted_in_teardown_succeeds_with_a_note(
    tmp_path: Path, args: list[str]
) -> None:
    (tmp_path / "fin.py").write_text(FINISHES_THEN_ABORTS)
    (tmp_path / "job.yaml").write_text(ONE_POD.format(script="fin.py", args=json.dumps(args)))
    proc = _cli(tmp_path, "run", "job.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "main-0 | work done" in proc.stdout
    assert proc.stdout.count(NOTE) == 1, proc.stdout


def test_a_yaml_pod_that_aborts_midway_fails(tmp_path: Path) -> None:
    (tmp_path / "mid.py").write_text(ABORTS_MIDWAY)
    (tmp_path / "job.yaml").write_text(ONE_POD.format(script="mid.py", args="[]"))
    proc = _cli(tmp_path, "run", "job.yaml")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "exit code 134" in proc.stdout and NOTE not in proc.stdout


# A real gloo job; rank 1 leaves by the way the test asks once the collective is done.
DIST = """\
import atexit, os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
rank = dist.get_rank()
dist.destroy_process_group()
how = sys.argv[1]
if rank == 1 and how == "abort-after":
    atexit.register(os.abort)
if rank == 1 and how == "abort-midway":
    os.abort()
if rank == 1 and how == "raise":
    raise RuntimeError("rank one broke")
print(f"rank {rank} sum {t.item():.0f}", flush=True)
"""


def test_a_torchrun_rank_that_finished_then_aborted_in_teardown_succeeds_with_a_note(tmp_path: Path) -> None:
    (tmp_path / "dist.py").write_text(DIST)
    proc = _cli(tmp_path, "run", "-j", "1x2", "dist.py", "--", "abort-after", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0 sum 2" in proc.stdout and "rank 1 sum 2" in proc.stdout
    assert proc.stdout.count(f"torchjob: rank 1: {NOTE}") == 1, proc.stdout


def test_a_torchrun_rank_that_aborts_midway_fails_the_job(tmp_path: Path) -> None:
    (tmp_path / "dist.py").write_text(DIST)
    proc = _cli(tmp_path, "run", "-j", "1x2", "dist.py", "--", "abort-midway", timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert NOTE not in proc.stdout and "SIGABRT" in proc.stdout
