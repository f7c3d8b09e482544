"""The torchrun ranks of one Slurm pod, on a real private Slurm (tools/slurm_cluster.py, one cluster
for the module): they share the pod's log, yet each line of it is one rank's whole line; and a rank
that finished, then aborted in the interpreter's teardown (as torch 2.13 can), does not fail the job.
Both come from the rank guard torchrun starts each rank with ($PYTHON_EXEC), as on the local engine."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_cluster import SlurmCluster
from support import private_slurm
from test_quick import DIST, NOTE  # a real gloo job whose rank 1 leaves as asked; the runner's note
from test_slurm_engine import cli_env, torchjob

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    yield from private_slurm(tmp_path_factory)


# Every rank waits for the others (files in the directory it is given), then all print at once,
# unbuffered as pods run: print() then writes each of its arguments, separators and the newline
# apart (9 writes a line here).
LINES = """\
import os, sys, time
ready, rank = sys.argv[1], os.environ["RANK"]
open(os.path.join(ready, "ready-" + rank), "w").close()
deadline = time.time() + 60
while len([n for n in os.listdir(ready) if n.startswith("ready-")]) < 3 and time.time() < deadline:
    time.sleep(0.01)
for i in range(2000):
    print("rank", rank, "line", f"{i:04d}", "x" * 150)
"""
WHOLE = r"master-0 r0 \| rank [012] line \d{4} x{150}"


def test_the_ranks_of_a_pod_print_whole_lines_into_its_shared_log(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "lines.py").write_text(LINES)
    (tmp_path / "ready").mkdir()
    env = cli_env(cluster, tmp_path / "root")
    done = torchjob(
        env, "run", "--engine", "slurm", "-j", "1x3", str(tmp_path / "lines.py"), str(tmp_path / "ready")
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert len(list((tmp_path / "ready").iterdir())) == 3  # the three ranks printed together
    for output in (done.stdout, torchjob(env, "logs", "lines", "--engine", "slurm").stdout):
        printed = [line for line in output.splitlines() if " line " in line]
        bad = [line for line in printed if not re.fullmatch(WHOLE, line)]
        assert not bad, bad[:5]
        assert len(printed) == 6000


@pytest.mark.torch
def test_a_rank_that_finished_then_aborted_in_teardown_succeeds_and_one_aborting_midway_fails(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    (tmp_path / "dist.py").write_text(DIST)
    env = cli_env(cluster, tmp_path / "root")
    done = torchjob(env, "run", "--engine", "slurm", "-j", "1x2", str(tmp_path / "dist.py"), "abort-after")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rank 0 sum 2" in done.stdout and "rank 1 sum 2" in done.stdout
    assert done.stdout.count(f"torchjob: rank 1: {NOTE}") == 1, done.stdout
    done = torchjob(env, "run", "--engine", "slurm", "-j", "1x2", str(tmp_path / "dist.py"), "abort-midway")
    assert done.returncode == 1, done.stdout + done.stderr
    assert NOTE not in done.stdout and "rank 0 sum 2" in done.stdout
