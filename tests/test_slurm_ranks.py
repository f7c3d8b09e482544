"""torchjob's python runner on a real private Slurm (tools/slurm_cluster.py, one cluster for the
module), as on the local engine. The torchrun ranks of one pod share its log, yet each line of it
is one rank's whole line; and a rank that finished, then aborted in the interpreter's teardown (as
torch 2.13 can), does not fail the job: both from the rank guard torchrun starts each rank with
($PYTHON_EXEC). A container that runs python itself starts through the runner: finished then
aborted is a success with the note, an abort before that a failure, and otherwise its output and
exit code are python's own."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from slurm_cluster import SlurmCluster
from support import private_slurm
from test_quick import ABORTS_MIDWAY, DIST, FINISHES_THEN_ABORTS, NOTE  # the runner's note, programs
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


# ------------------------------------------------------------ containers that run python themselves


def python_job(tmp_path: Path, name: str, commands: dict[str, list[str]], **spec: object) -> str:
    """A job of one pod per task, each a container running its command in ``tmp_path``."""
    tasks = [
        {
            "name": task,
            "replicas": 1,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "main", "image": "x", "command": argv, "workingDir": str(tmp_path)}
                    ],
                    **spec,
                }
            },
        }
        for task, argv in commands.items()
    ]
    doc = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"tasks": tasks},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_a_python_container_that_finished_then_aborted_in_teardown_succeeds_with_the_note(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "fin.py").write_text(FINISHES_THEN_ABORTS)
    forms = {  # a script with an option, code, a module run with sys.exit(0): python's own forms
        "script": ["python", "-u", "fin.py"],
        "code": ["python3", "-c", FINISHES_THEN_ABORTS],
        "module": ["python", "-m", "fin", "exit0"],
    }
    env = cli_env(cluster, tmp_path / "root")
    done = torchjob(env, "run", "--engine", "slurm", python_job(tmp_path, "fin", forms))
    assert done.returncode == 0, done.stdout + done.stderr
    for task in forms:  # each pod's own lines (the pods' output may interleave)
        pod = [line for line in done.stdout.splitlines() if line.startswith(f"{task}-0 | ")]
        assert [line.partition("; ")[0] for line in pod] == [
            f"{task}-0 | work done",
            f"{task}-0 | torchjob: {NOTE}, as torch 2.13 can at exit",
        ], done.stdout


# The first run aborts before its program finished; the next one finishes, then aborts in teardown.
AGAIN = """\
import os, sys
if not os.path.exists("ran"):
    open("ran", "w").close()
    exec(sys.argv[1])
exec(sys.argv[2])
"""


def test_a_python_container_that_aborts_before_finishing_fails_and_restarts(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "again.py").write_text(AGAIN)
    argv = ["python", "again.py", ABORTS_MIDWAY, FINISHES_THEN_ABORTS]
    path = python_job(tmp_path, "again", {"main": argv}, restartPolicy="OnFailure")
    env = cli_env(cluster, tmp_path / "root")
    # Without the runner's marker both runs fail: the second restart fails the job at once.
    done = torchjob(env, "run", "--engine", "slurm", "--max-restarts", "1", path)
    assert done.returncode == 0, done.stdout + done.stderr
    first, _, then = done.stdout.partition("container 'main' exited with code 134; restart 1")
    assert "main-0 | about to crash" in first and NOTE not in first, done.stdout
    assert "main-0 | work done" in then and then.count(NOTE) == 1, done.stdout


# Says whether the runner started it (its process's own command line shows it; the program's
# sys.argv and sys.orig_argv do not), then fails as a program does.
FAILS = """\
import sys
runner = "warmstart.py" in open("/proc/self/cmdline").read()
print("args", sys.argv[1:], "runner" if runner else "cold")
raise ValueError("from the program")
"""


def test_a_failing_python_container_through_the_runner_prints_and_exits_as_python(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "fails.py").write_text(FAILS)
    argv = ["python", "-u", "fails.py", "a", "b c"]
    env = cli_env(cluster, tmp_path / "root")
    done = torchjob(env, "run", "--engine", "slurm", python_job(tmp_path, "fails", {"main": argv}))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "first failure: main-0 exited with code 1 (Error)" in done.stderr, done.stderr
    # The same program started by python itself, here: its output, word for word, and exit code.
    cold = subprocess.run(
        [sys.executable, *argv[1:]],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
    )
    assert cold.returncode == 1 and "args ['a', 'b c'] cold" in cold.stdout
    logged = torchjob(env, "logs", "fails", "--engine", "slurm").stdout
    pod = [line.partition(" | ")[2] for line in logged.splitlines() if line.startswith("main-0 | ")]
    assert pod == cold.stdout.replace("] cold", "] runner").splitlines(), logged
