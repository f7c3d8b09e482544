"""Issue 19: the torchrun habit (`torchjob run train.py`), quick mode as solid as a YAML job
(an abort in the interpreter's teardown, the failing rank and its traceback), quick mode on a cluster."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from support import cli, torchjob
from torchjob.targets import target_names

pytestmark = pytest.mark.timeout(150)


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


WARM = """\
          initContainers:
            - {name: init, image: x, command: [sh, -c, "sleep 0.3"]}
"""


@pytest.mark.parametrize(
    ("args", "start"),
    [([], "cold"), (["exit0"], "cold"), ([], "prewarmed"), (["exit0"], "preloaded")],
)
def test_a_yaml_pod_that_finished_then_aborted_in_teardown_succeeds_with_a_note(
    tmp_path: Path, args: list[str], start: str
) -> None:
    (tmp_path / "fin.py").write_text(FINISHES_THEN_ABORTS)
    job = ONE_POD.format(script="fin.py", args=json.dumps(args))
    if start == "prewarmed":  # the container's interpreter waits for its init container
        job = job.replace(
            "metadata: {name: teardown}",
            "metadata: {name: teardown, annotations: {torchjob.io/prewarm: 'true'}}",
        )
        job = job.replace("          containers:\n", WARM + "          containers:\n")
    (tmp_path / "job.yaml").write_text(job)
    proc = cli(tmp_path, "run", *(["--preload", "torch"] if start == "preloaded" else []), "job.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "main-0 | work done" in proc.stdout
    assert proc.stdout.count(NOTE) == 1, proc.stdout


def test_a_yaml_pod_that_aborts_midway_fails(tmp_path: Path) -> None:
    (tmp_path / "mid.py").write_text(ABORTS_MIDWAY)
    (tmp_path / "job.yaml").write_text(ONE_POD.format(script="mid.py", args="[]"))
    proc = cli(tmp_path, "run", "job.yaml")
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
    proc = cli(tmp_path, "run", "-j", "1x2", "dist.py", "--", "abort-after", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0 sum 2" in proc.stdout and "rank 1 sum 2" in proc.stdout
    assert proc.stdout.count(f"torchjob: rank 1: {NOTE}") == 1, proc.stdout


def test_a_torchrun_rank_that_aborts_midway_fails_the_job(tmp_path: Path) -> None:
    (tmp_path / "dist.py").write_text(DIST)
    proc = cli(tmp_path, "run", "-j", "1x2", "dist.py", "--", "abort-midway", timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert NOTE not in proc.stdout
    # the rank that failed, as a YAML job names its pod's: not the node (master-0 is rank 0)
    assert "root cause: master-0 (rank 1), exit code 134 (Error (killed by SIGABRT))" in (proc.stdout)


def test_a_failed_torchrun_rank_is_named_with_its_own_traceback(tmp_path: Path) -> None:
    (tmp_path / "dist.py").write_text(DIST)
    proc = cli(tmp_path, "run", "-j", "1x2", "dist.py", "raise", timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = proc.stdout[proc.stdout.index("root cause: ") :]
    assert summary.startswith("root cause: master-0 (rank 1), exit code 1"), summary
    # the root cause and its log tail come first, then the job's phase line (display.py)
    lines = summary.splitlines()
    tail = lines[1 : next(i for i, line in enumerate(lines) if line.lstrip().startswith("Failed:"))]
    assert tail[0].strip().startswith("last ") and "Traceback (most recent call last):" in tail[1]
    assert tail[-1].strip() == "RuntimeError: rank one broke", summary
    assert "ChildFailedError" not in summary and "[rank1]" not in summary, summary
    # torchjob status says the same
    status = cli(tmp_path, "status", "dist")
    assert "master-0 (rank 1), exit code 1" in status.stdout, status.stdout


# A DataLoader started by forkserver from the top level of a script without a __main__ guard: its
# worker runs the script again and joins the process group as a second rank 0.
UNGUARDED = """\
import torch.distributed as dist
from torch.utils.data import DataLoader
print("script starts", flush=True)
dist.init_process_group("gloo")
if dist.get_rank() == 0:
    for batch in DataLoader(list(range(4)), num_workers=1, multiprocessing_context="forkserver"):
        print("a batch", flush=True)
dist.barrier()
"""


def test_a_rank_starting_a_forkserver_worker_from_an_unguarded_script_fails_fast_with_the_reason(
    tmp_path: Path,
) -> None:
    # That worker waited in gloo's rendezvous (30 min) for peers that never came, and rank 0 for
    # its worker: the job hung until its deadline in about half the runs, as bare torchrun can.
    # Now rank 0 refuses to start the worker and says why.
    (tmp_path / "unguarded.py").write_text(UNGUARDED)
    proc = cli(tmp_path, "run", "--timeout", "100", "-j", "1x2", "unguarded.py", timeout=140)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.count("script starts") == 2, proc.stdout  # the ranks' runs, no worker's
    assert "a batch" not in proc.stdout
    summary = proc.stdout[proc.stdout.index("root cause: ") :]
    assert summary.startswith("root cause: master-0 (rank 0), exit code 1"), summary
    why = 'RuntimeError: unguarded.py (line 6) starts a process by "forkserver" at its top level'
    assert why in summary and "bootstrapping phase" in summary, summary


LINES = """\
import os, time
rank = os.environ["RANK"]
open(f"ready-{rank}", "w").close()
deadline = time.time() + 30
while len([n for n in os.listdir() if n.startswith("ready-")]) < 3 and time.time() < deadline:
    time.sleep(0.01)  # the ranks start printing together
for i in range(3000):
    print(f"rank {rank} line {i:04d} " + "x" * 60)
"""


def test_the_ranks_of_a_pod_print_whole_lines_into_its_shared_log(tmp_path: Path) -> None:
    # Unbuffered print writes a line's text and its newline apart; two ranks of one pod printing at
    # once must still never share a line of the pod's log.
    (tmp_path / "lines.py").write_text(LINES)
    proc = cli(tmp_path, "run", "-j", "1x3", "lines.py", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    printed = [line for line in proc.stdout.splitlines() if " line " in line]
    bad = [line for line in printed if not re.fullmatch(r"master-0 r0 \| rank [012] line \d{4} x{60}", line)]
    assert not bad, bad[:5]
    assert len(printed) == 9000


# ------------------------------------------------------------ the torchrun habit

ECHO = """\
import os, sys
print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} A={os.environ.get('A')} args {sys.argv[1:]}")
"""


def test_run_a_script_without_j_runs_it_once_with_the_arguments_after_it(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(ECHO)
    # torchjob's options before the script (with their values); everything after it is the script's
    proc = cli(tmp_path, "run", "--timeout", "60", "-e", "A=1", "train.py", "--steps", "20", "--timeout", "5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0 of 1 A=1 args ['--steps', '20', '--timeout', '5']" in proc.stdout
    # the older spelling with -- still works; a script with no suffix that compiles is a script too
    (tmp_path / "trainer").write_text(ECHO)
    proc = cli(tmp_path, "run", "-e=A=2", "trainer", "--", "--lr", "0.1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0 of 1 A=2 args ['--lr', '0.1']" in proc.stdout


def test_a_text_file_that_happens_to_compile_is_not_taken_for_a_script(tmp_path: Path) -> None:
    """``hello`` or ``a,b`` compile as Python: a file named notes.txt holding them is refused as
    input (exit 2, nothing started), not run as a job whose rank dies of a NameError."""
    (tmp_path / "notes.txt").write_text("hello\n")
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    for name in ("notes.txt", "data.csv"):
        proc = cli(tmp_path, "run", name)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.startswith(f"{name}:1: expected a Job mapping"), proc.stderr
    assert not (tmp_path / "home").exists()  # nothing started
    (tmp_path / "tool.sh").write_text("#!/usr/bin/env python3\n" + ECHO)  # its #! says python
    proc = cli(tmp_path, "render", "tool.sh")
    assert proc.returncode == 0, proc.stderr


def test_validate_and_render_take_a_script_and_j_refuses_a_job_file(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(ECHO)
    (tmp_path / "job.yaml").write_text(ONE_POD.format(script="train.py", args="[]"))
    proc = cli(tmp_path, "validate", "train.py", "job.yaml")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("train.py: job train: valid; 1 pod ("), proc.stdout
    proc = cli(tmp_path, "render", "-o", "json", "train.py", "--steps", "20")
    assert proc.returncode == 0, proc.stderr
    pods = [i for i in json.loads(proc.stdout)["items"] if i["kind"] == "Pod"]
    assert [p["spec"]["containers"][0]["args"] for p in pods] == [["train.py", "--steps", "20"]]
    for command in ("run", "render"):
        proc = cli(tmp_path, command, "-j", "2x2", "job.yaml")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.splitlines() == [
            "job.yaml: -j runs a Python script as torchrun does; this is a job file: run it without -j"
        ]
    assert not (tmp_path / "home").exists()  # nothing started


def test_set_worker_replicas_gives_torchrun_the_new_node_count(tmp_path: Path) -> None:
    (tmp_path / "dist.py").write_text(DIST)
    proc = cli(tmp_path, "run", "-j", "1x2", "--set", "worker.replicas=1", "dist.py", "ok", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in range(4):
        assert f"rank {rank} sum 4" in proc.stdout, proc.stdout
    for value in ("abc", "-1"):
        proc = cli(tmp_path, "run", "-j", "2x2", "--set", f"worker.replicas={value}", "dist.py")
        assert proc.returncode == 2 and proc.stderr == (
            f"<command line>: --set: worker.replicas={value}: expected a number of worker nodes (0 or more), "
            f"got '{value}'\n"
        ), proc.stderr


THREADS = """\
import os
print(f"rank {os.environ['RANK']} omp {os.environ.get('OMP_NUM_THREADS')}")
"""


def test_omp_num_threads_is_what_torchrun_would_give(tmp_path: Path) -> None:
    """torchrun sets OMP_NUM_THREADS=1 only for more than one process and only when it is unset:
    one process keeps every core, and a user's own value reaches the ranks."""
    (tmp_path / "train.py").write_text(THREADS)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    home = tmp_path / "home"
    proc = torchjob("run", "train.py", home=home, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and "rank 0 omp None" in proc.stdout, proc.stdout + proc.stderr
    proc = torchjob("run", "-j", "1x2", "train.py", home=home, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0 omp 1" in proc.stdout and "rank 1 omp 1" in proc.stdout, proc.stdout
    assert "Setting OMP_NUM_THREADS" not in proc.stdout + proc.stderr  # torchrun's banner
    own = {**env, "OMP_NUM_THREADS": "3"}
    proc = torchjob("run", "-j", "1x2", "train.py", home=home, env=own, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0 omp 3" in proc.stdout and "rank 1 omp 3" in proc.stdout, proc.stdout
    # a cluster's pods do not inherit this shell: torchrun's default is written into the job
    for shape, expected in (("2x3", [{"name": "OMP_NUM_THREADS", "value": "1"}]), ("2x1", [])):
        proc = torchjob("render", "-o", "json", "-j", shape, "train.py", home=home, env=own, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        pods = [i for i in json.loads(proc.stdout)["items"] if i["kind"] == "Pod"]
        envs = [p["spec"]["containers"][0]["env"] for p in pods]
        assert [[e for e in env if e["name"] == "OMP_NUM_THREADS"] for env in envs] == [expected] * 2


# ------------------------------------------------------------ quick mode for a cluster


@pytest.mark.parametrize("target", target_names())
def test_quick_mode_renders_for_every_target_without_this_machines_directory(
    tmp_path: Path, target: str
) -> None:
    (tmp_path / "train.py").write_text(ECHO)
    proc = cli(tmp_path, "render", "-o", "json", "-j", "2x3", "--target", target, "train.py")
    assert proc.returncode == 0, proc.stderr
    assert "warning: the job uses the default image pytorch/pytorch:latest" in proc.stderr
    assert str(tmp_path) not in proc.stdout and "workingDir" not in proc.stdout
    proc = cli(
        tmp_path, "render", "-o", "json", "-j", "2x3", "--image", "reg.io/t:1", "--target", target, "train.py"
    )
    assert proc.returncode == 0 and "warning: the job uses" not in proc.stderr, proc.stderr
    assert "reg.io/t:1" in proc.stdout and "pytorch/pytorch" not in proc.stdout
    if target == "trainjob":
        trainer = json.loads(proc.stdout)["items"][0]["spec"]["trainer"]
        assert trainer["command"] == ["torchrun", "--no-python", "python", "train.py"]
        assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 3)


def test_image_is_refused_for_a_job_file(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(ONE_POD.format(script="train.py", args="[]"))
    proc = cli(tmp_path, "render", "--image", "x:1", "job.yaml")
    assert proc.returncode == 2 and proc.stderr.startswith("<command line>: --image: sets the image"), (
        proc.stderr
    )
