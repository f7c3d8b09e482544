"""The slurm engine end to end against a real private Slurm (tools/slurm_cluster.py): the CLI's
run/submit/status/logs/delete, the controller on the batch host, pods as job steps."""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from slurm_cluster import SlurmCluster
from support import read_until
from test_slurm_steps import no_process_left
from torchjob.engines.slurm import clients

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent


def cli_env(slurm: SlurmCluster, root: Path, **extra: str) -> dict[str, str]:
    env = {**slurm.env, "TORCHJOB_SLURM_JOB_ROOT": str(root), "TORCHJOB_SLURM_PARTITION": slurm.partition}
    env.pop("TORCHJOB_ENGINE", None)
    env.update(extra)
    return env


def torchjob(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchjob", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def job_file(tmp_path: Path, tasks: list[dict[str, object]], **spec: object) -> Path:
    doc = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "sj"},
        "spec": {**spec, "tasks": tasks},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def task(name: str, code: str, replicas: int = 1, **extra: object) -> dict[str, object]:
    container = {"name": "main", "image": "busybox", "command": ["python", "-c", code]}
    # Never: a container that ends is not started again in place (Kubernetes' default, Always, would)
    spec = {"restartPolicy": "Never", "containers": [container]}
    return {"name": name, "replicas": replicas, "template": {"spec": spec}, **extra}


def status_json(env: dict[str, str], ref: str) -> dict[str, object]:
    done = torchjob(env, "status", ref, "--engine", "slurm", "-o", "json", timeout=60)
    assert done.returncode == 0, done.stderr
    data: dict[str, object] = json.loads(done.stdout)
    return data


def live_pods(status: dict[str, object]) -> list[str]:
    """Pods a report still shows running or stopping (none may, once the allocation ended)."""
    pods = status["pods"]
    assert isinstance(pods, list)
    return [
        f"{p['short']}: {p['phase']}"
        for p in pods
        if p["phase"] in ("Running", "Pending") or p["terminating"]
    ]


def job_dirs(root: Path) -> list[Path]:
    """The job directories under a job root (not the root's own marker)."""
    return sorted(p for p in root.iterdir() if p.name != ".torchjob-state") if root.exists() else []


def wait_for(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.3)
    raise AssertionError(f"not within {timeout:g} s: {what}")


@pytest.mark.torch
def test_the_example_job_runs_with_gloo_and_prefixed_logs(slurm: SlurmCluster, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = cli_env(slurm, tmp_path / "root")
    done = torchjob(env, "run", "examples/pytorch-job.yaml", "--engine", "slurm")
    assert done.returncode == 0, done.stdout + done.stderr
    for prefix in ("master-0 r0 | ", "worker-0 r1 | ", "worker-1 r2 | "):
        assert prefix in done.stdout, done.stdout
    assert "Completed" in done.stderr
    assert slurm.jobs() == []
    shown = torchjob(env, "status", "pytorch-job", "--engine", "slurm").stdout
    # the plugin's port, as the master pod has it: the declared one unless the node had it taken
    # (another job on this machine: test_slurm_ports.py), which the controller then said
    got = re.search(r"ports 23456->(\d+)", shown)
    assert got is not None, shown
    if got.group(1) != "23456":
        assert f"port 23456 is in use on the master's node: the master gets {got.group(1)}" in shown


def test_a_failing_rank_restarts_the_job_then_fails_it(slurm: SlurmCluster, tmp_path: Path) -> None:
    env = cli_env(slurm, tmp_path / "root")
    marker = uuid.uuid4().hex
    code = (
        f"import os, sys, time; print('attempt', os.environ['VK_TASK_INDEX'], '{marker}', flush=True); "
        "time.sleep(1.5); sys.exit(3)"
    )
    # A sibling that never ends by itself: each restart and the failure stop its step.
    sleeper = f"import time; print('sleeping', flush=True); time.sleep(600)  # {marker}"
    path = job_file(
        tmp_path,
        [
            task("worker", code, policies=[{"event": "PodFailed", "action": "RestartJob"}]),
            task("sibling", sleeper),
        ],
        maxRetry=2,
        plugins={"env": []},
    )
    done = torchjob(env, "run", str(path), "--engine", "slurm")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.count(f"worker-0 | attempt 0 {marker}") == 2, done.stdout
    assert done.stdout.count("sibling-0 | sleeping") == 2, done.stdout  # restarted with the job
    status = status_json(env, "sj")
    assert status["phase"] == "Failed"
    assert status["retryCount"] == 2
    failure = status["firstFailure"]
    assert isinstance(failure, dict) and failure["exitCode"] == 3
    assert any(marker in line for line in failure["logTail"])
    assert "torchjob: job Restarting" in done.stderr  # the controller's events, as they came
    # logs per attempt, and what does not exist named with what does
    every = torchjob(env, "logs", "sj", "--engine", "slurm", "--all-attempts")
    assert every.stdout.count(f"worker-0 #0 | attempt 0 {marker}") == 1, every.stdout
    assert every.stdout.count(f"worker-0 #1 | attempt 0 {marker}") == 1, every.stdout
    first = torchjob(env, "logs", "sj", "--engine", "slurm", "--attempt", "0")
    assert first.stdout.count(f"attempt 0 {marker}") == 1, first.stdout
    wrong = torchjob(env, "logs", "sj", "--engine", "slurm", "--attempt", "7")
    assert (wrong.returncode, wrong.stderr.strip()) == (
        2,
        "torchjob: job sj-" + wrong.stderr.split("sj-")[1].strip(),
    )
    assert "has no attempt 7 (attempts: 0, 1)" in wrong.stderr
    wrong = torchjob(env, "logs", "sj", "worker-0", "--engine", "slurm", "-c", "nope")
    assert slurm.jobs() == []
    assert wrong.returncode == 2 and "has no container 'nope' (containers: main)" in wrong.stderr
    assert no_process_left(marker) == []


def test_the_timeout_terminates_the_job(slurm: SlurmCluster, tmp_path: Path) -> None:
    env = cli_env(slurm, tmp_path / "root")
    marker = uuid.uuid4().hex
    path = job_file(tmp_path, [task("w", f"import time; time.sleep(600)  # {marker}", 2)])
    started = time.monotonic()
    done = torchjob(env, "run", str(path), "--engine", "slurm", "--timeout", "3")
    assert done.returncode == 1, done.stdout + done.stderr
    assert time.monotonic() - started < 60
    status = status_json(env, "sj")
    assert status["phase"] == "Terminated" and "deadline of 3s passed" in str(status["reason"]), status
    assert no_process_left(marker) == []


def test_depends_on_starts_a_task_once_the_other_runs(slurm: SlurmCluster, tmp_path: Path) -> None:
    env = cli_env(slurm, tmp_path / "root")
    # b starts once a's pod runs: Slurm lists a's step by then (b asks squeue from its own step).
    first = "import time; time.sleep(4)"
    second = (
        "import os, subprocess; job = os.environ['SLURM_JOB_ID']; "
        "out = subprocess.run(['squeue', '-h', '-s', '-j', job, '-o', '%j'], capture_output=True, "
        "text=True, check=True).stdout; print('steps', sorted(out.split()))"
    )
    path = job_file(tmp_path, [task("a", first), task("b", second, dependsOn={"name": ["a"]})])
    done = torchjob(env, "run", str(path), "--engine", "slurm")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sj-a-0.main.0" in done.stdout.split("b-0 | steps")[1], done.stdout
    assert "waits for task(s) a" in json.dumps(status_json(env, "sj")["events"])


def test_a_job_pending_on_resources_shows_slurms_reason(slurm: SlurmCluster, tmp_path: Path) -> None:
    env = cli_env(slurm, tmp_path / "root")
    # More CPUs than the node declares: Slurm keeps it pending (Resources) rather than refuse it.
    big = task("big", "print('never')")
    big["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "6"}}  # type: ignore[index]
    path = job_file(tmp_path, [big])
    blocker = slurm.run(
        "sbatch",
        "--parsable",
        f"--partition={slurm.partition}",
        "-n",
        "4",
        "--output=/dev/null",
        "--wrap",
        "sleep 120",
    )
    assert blocker.returncode == 0, blocker.stderr
    done = torchjob(env, "run", str(path), "--engine", "slurm", "-d")
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert "Slurm job" in done.stderr

    def pending() -> bool:
        data = status_json(env, job_id)
        return data["phase"] == "Pending" and "Resources" in str(data["reason"])

    wait_for(pending, 30, "the job pending with Slurm's reason Resources")
    text = torchjob(env, "status", job_id, "--engine", "slurm").stdout
    assert "Resources" in text
    deleted = torchjob(env, "delete", job_id, "--engine", "slurm")
    assert deleted.returncode == 0, deleted.stderr
    # Attached, the wait is told as srun tells it, and so is the start; -v shows the Slurm calls.
    fill = task("fill", "print('filled')")
    fill["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "5"}}  # type: ignore[index]
    path = job_file(tmp_path, [fill])
    err_file = tmp_path / "attached.err"
    with open(err_file, "w") as err:
        attached = subprocess.Popen(
            [sys.executable, "-m", "torchjob", "-v", "run", str(path), "--engine", "slurm"],
            env=env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        wait_for(lambda: "is pending: Resources" in err_file.read_text(), 30, "the wait told")
        assert slurm.run("scancel", blocker.stdout.strip()).returncode == 0
        assert attached.wait(timeout=120) == 0, err_file.read_text()
    finally:
        if attached.poll() is None:
            attached.kill()
            attached.wait()
    told = err_file.read_text()
    said = [line for line in told.splitlines() if "is pending" in line or "is running" in line]
    assert said[0].endswith("is pending: Resources") and said[-1].endswith("is running"), told
    assert "slurm: sbatch --parsable" in told and "slurm: squeue" in told, told
    assert not (tmp_path / "root" / job_id).exists()


def test_a_time_limit_reached_is_reported_as_timeout_after_the_signal_before_it(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    env = cli_env(slurm, tmp_path / "root")
    marker = uuid.uuid4().hex
    # SIGUSR1 50 s before the limit, to every pod (Slurm's timing: up to a minute early): the
    # program checkpoints, and sleeps on until the limit ends it.
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGUSR1, lambda *_: print('checkpoint on SIGUSR1', flush=True))\n"
        f"time.sleep(600)  # {marker}\n"
    )
    path = job_file(tmp_path, [task("sleeper", code, replicas=2)])
    flags = ("--time-limit", "1", "--signal", "USR1@50")
    argv = [sys.executable, "-m", "torchjob", "run", str(path), "--engine", "slurm", *flags]
    run = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert run.stdout is not None
        said = ""
        deadline = time.monotonic() + 150
        while (
            said.count("| checkpoint on SIGUSR1") < 2 and time.monotonic() < deadline and run.poll() is None
        ):
            said += read_until(run.stdout, "checkpoint", timeout=deadline - time.monotonic())
        # slurmctld looks for jobs past their limit every 30 s from its own start (PERIODIC_TIMEOUT,
        # compiled in): a job started seconds after the cluster passes its one minute just after
        # the second look and is stopped at the third, 90 s in. Restarted (its state saved) once
        # the job has run 30 s, the controller looks next as the minute ends: 60 s in.
        started = slurm.run("squeue", "-h", "-t", "R", "-o", "%S").stdout.split()
        if started and run.poll() is None:
            begun = datetime.datetime.strptime(min(started), "%Y-%m-%dT%H:%M:%S").timestamp()
            time.sleep(max(0.0, min(begun + 31 - time.time(), 60.0)))
            slurm.stop_controller()
            slurm.start_controller()
        out, err = run.communicate(timeout=200)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(30)
    done = subprocess.CompletedProcess(argv, run.returncode, said + out, err)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "TIMEOUT" in done.stderr
    assert done.stdout.count("| checkpoint on SIGUSR1") == 2, done.stdout
    refused = torchjob(env, "run", str(path), "--engine", "slurm", "--signal", "B:USR1@60")
    assert refused.returncode == 2 and "B: signals the batch shell" in refused.stderr, refused.stderr
    status = status_json(env, "sj")
    assert status["phase"] == "Failed"
    assert live_pods(status) == [], status  # stopped with the allocation, not "Running (stopping)"
    assert "Stopped" in torchjob(env, "status", "sj", "--engine", "slurm").stdout
    # once slurmctld forgets the job, the completion file still says how it ended
    (job_dir,) = job_dirs(tmp_path / "root")
    slurm_id = json.loads((job_dir / "slurm.json").read_text())["jobId"]
    assert clients.jobcomp_state(slurm_id, slurm.env) == "TIMEOUT"
    assert no_process_left(marker) == []


def test_delete_while_running_leaves_no_step(slurm: SlurmCluster, tmp_path: Path) -> None:
    env = cli_env(slurm, tmp_path / "root")
    marker = uuid.uuid4().hex
    path = job_file(
        tmp_path, [task("w", f"import time; print('up', flush=True); time.sleep(600)  # {marker}", 2)]
    )
    done = torchjob(env, "submit", str(path), "--engine", "slurm")
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()  # the id status/logs/delete take: several jobs may be named sj
    assert job_id.startswith("sj-") and len(job_id) == len("sj-") + 6, done.stdout
    assert f"torchjob: Slurm job {slurm.jobs()[0]}: {job_id}" in done.stderr, done.stderr  # Slurm's id too
    wait_for(lambda: status_json(env, job_id)["phase"] == "Running", 60, "the job running")
    wait_for(lambda: "up" in torchjob(env, "logs", job_id, "--engine", "slurm").stdout, 60, "its log")
    deleted = torchjob(env, "delete", job_id, "--engine", "slurm")
    assert deleted.returncode == 0, deleted.stderr
    assert slurm.jobs() == []
    assert no_process_left(marker) == []


def test_a_job_cancelled_in_slurm_is_reported_so(slurm: SlurmCluster, tmp_path: Path) -> None:
    env = cli_env(slurm, tmp_path / "root")
    marker = uuid.uuid4().hex
    path = job_file(
        tmp_path, [task("w", f"import time; print('up', flush=True); time.sleep(600)  # {marker}")]
    )
    done = torchjob(env, "run", str(path), "--engine", "slurm", "-d")
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    wait_for(lambda: status_json(env, job_id)["phase"] == "Running", 60, "the job running")
    (slurm_id,) = slurm.jobs()
    assert slurm.run("scancel", slurm_id).returncode == 0  # not through torchjob
    waited = torchjob(env, "wait", job_id, "--engine", "slurm", "--timeout", "60")
    assert waited.returncode == 1, waited.stdout + waited.stderr
    status = status_json(env, job_id)
    assert (status["phase"], status["reason"]) == (
        "Terminated",
        "Slurm: CANCELLED: the allocation was cancelled",
    )
    assert live_pods(status) == [], status  # stopped with the allocation, not "Running (stopping)"
    pod = status["pods"][0]  # type: ignore[index]
    assert pod["phase"] == "Stopped", pod
    time.sleep(1.5)  # its elapsed time stops with it
    assert status_json(env, job_id)["pods"][0]["finishedAt"] == pod["finishedAt"]  # type: ignore[index]
    assert no_process_left(marker) == []


def cancelled(slurm: SlurmCluster) -> bool:
    """The cluster's one job is being cancelled: Slurm still holds it (completing), not running."""
    states = slurm.run("squeue", "-h", "-o", "%T", timeout=10).stdout.split()
    return bool(states) and all(state in ("CANCELLED", "COMPLETING") for state in states)


def ignoring_sigterm(tmp_path: Path, marker: str) -> Path:
    """A job whose program ignores SIGTERM (Slurm needs KillWait, 3 s, to end it: more Ctrl-C
    come meanwhile), says "up" and sleeps; ``marker`` names its process."""
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
        f"time.sleep(600)  # {marker}"
    )
    return job_file(tmp_path, [task("w", code)])


def following(env: dict[str, str], path: Path) -> subprocess.Popen[str]:
    """``torchjob run PATH --engine slurm`` in a process group of its own (signalled as a terminal
    signals one), once it follows the job's program (its "up" line)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "torchjob", "run", str(path), "--engine", "slurm"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert "up" in line, line
    return process


@pytest.mark.parametrize(
    "signals", [(signal.SIGINT,), (signal.SIGTERM,), (signal.SIGINT, signal.SIGINT, signal.SIGTERM)]
)
def test_ctrl_c_while_following_cancels_the_job(
    slurm: SlurmCluster, tmp_path: Path, signals: tuple[int, ...]
) -> None:
    marker = uuid.uuid4().hex
    process = following(cli_env(slurm, tmp_path / "root"), ignoring_sigterm(tmp_path, marker))
    try:
        first, *more = signals
        os.killpg(process.pid, first)
        if more:  # a second Ctrl-C (or a forwarded SIGTERM) while the first's cancel waits: the job
            # is cancelled in Slurm and stays there a second at least (its program is deaf to SIGTERM)
            wait_for(lambda: cancelled(slurm), 30, "the job cancelled by the first signal")
            for signum in more:
                os.killpg(process.pid, signum)
        _, err = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, err
    if len(signals) > 1:
        assert "wait, it is not left running" in err, err
    assert slurm.jobs() == []
    assert no_process_left(marker) == []


def test_a_refused_sbatch_is_one_line_and_leaves_nothing(slurm: SlurmCluster, tmp_path: Path) -> None:
    env = cli_env(slurm, tmp_path / "root")
    path = job_file(tmp_path, [task("w", "print('never')")])
    done = torchjob(env, "run", str(path), "--engine", "slurm", "-p", "nosuchpartition", timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "partition" in lines[0].lower(), done.stderr
    assert job_dirs(tmp_path / "root") == []
    # sbatch's own refusal of an option it does not know, not its "Try sbatch --help" after it
    done = torchjob(env, "run", str(path), "--engine", "slurm", "--sbatch-args=--no-such-option", timeout=60)
    assert (done.returncode, done.stderr) == (
        2,
        "torchjob: sbatch failed: unrecognized option '--no-such-option'\n",
    ), done.stderr
    # An option torchjob sets itself is refused before sbatch, not blamed on the filesystem
    done = torchjob(env, "run", str(path), "--engine", "slurm", "--sbatch-args=--output=/nonexistent/x.out")
    said = "<command line>: --sbatch-args: --output is not passed on: the controller's output goes to"
    assert done.returncode == 2 and done.stderr.startswith(said), done.stderr
    assert job_dirs(tmp_path / "root") == []


def test_no_sbatch_on_path_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path), "TORCHJOB_SLURM_JOB_ROOT": str(tmp_path / "root")}
    path = job_file(tmp_path, [task("w", "print('never')")])
    done = torchjob(env, "run", str(path), "--engine", "slurm", timeout=60)
    assert done.returncode == 2
    expected = (
        "torchjob: sbatch is not on PATH: run torchjob on a Slurm login node (or install Slurm's clients)"
    )
    assert done.stderr == expected + "\n"
    assert not (tmp_path / "root").exists()


def test_dry_run_prints_the_sbatch_command_script_and_steps(tmp_path: Path) -> None:
    env = {**os.environ, "TORCHJOB_SLURM_PARTITION": "gpu"}  # a setting from the environment
    root = str(tmp_path / "root")
    done = torchjob(
        env,
        "run",
        "examples/pytorch-job.yaml",
        "--engine",
        "slurm",
        "--job-root",
        root,
        "--dry-run",
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "sbatch --parsable --job-name=pytorch-job" in done.stdout
    assert "--partition=gpu" in done.stdout
    assert "torchjob.engines.slurm.batch" in done.stdout
    assert "#   pytorch-job-worker-1: on NODE, srun --cpus-per-task=1\n" in done.stdout
    assert "#     init wait-for-master: added by a plugin (sh ...)\n" in done.stdout  # the pytorch plugin's
    assert f"#     master: {sys.executable} examples/programs/sendrecv.py\n" in done.stdout
    assert (
        "# the master's port 23456 (MASTER_PORT) as declared: claimed on the master's node\n" in done.stdout
    )
    assert not (tmp_path / "root").exists()


@pytest.mark.torch
def test_an_sdk_task_returns_its_value(slurm: SlurmCluster, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = cli_env(slurm, tmp_path / "root", TORCHJOB_ENGINE="slurm")
    code = (
        "import sys; sys.path.insert(0, 'examples/sdk'); import allreduce\n"
        "from torchjob import PyTorch, Worker\n"
        "two = allreduce.allreduce.with_overrides(task_config=PyTorch(worker=Worker(replicas=1)))\n"
        "print('value', two(2.0))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "value {'world_size': 2.0, 'sum': 6.0}" in done.stdout
    # it ran on Slurm: its job directory is under the slurm engine's job root
    (job_dir,) = job_dirs(tmp_path / "root")
    assert json.loads((job_dir / "status.json").read_text())["engine"] == "slurm"
    assert job_dir.name.startswith("allreduce-")


@pytest.mark.torch
def test_an_sdk_task_reference_runs_from_the_cli(slurm: SlurmCluster, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = cli_env(slurm, tmp_path / "root")
    done = torchjob(
        env, "run", "examples/sdk/allreduce.py:allreduce", "--engine", "slurm", "--", "--scale", "2"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "master-0 r0 | torchjob: rank 0 returned {'world_size': 2.0, 'sum': 6.0}" in done.stdout
    assert "Completed" in done.stderr


@pytest.mark.torch
def test_a_script_in_quick_mode(slurm: SlurmCluster, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = cli_env(slurm, tmp_path / "root")
    # Two nodes of one process: one pod per node, as torchrun expects, and this cluster has one node.
    done = torchjob(env, "run", "--engine", "slurm", "-j", "2x1", "examples/programs/allreduce.py")
    assert (done.returncode, done.stderr) == (
        2,
        "torchjob: the job needs 2 nodes (2 pods, at most 1 per node) (one pod per node: a torchrun "
        f"job of several nodes; --pods-per-node K puts K on one) and partition {slurm.partition} has 1\n",
    )
    assert job_dirs(tmp_path / "root") == []
    done = torchjob(
        env, "run", "--engine", "slurm", "-j", "2x1", "--pods-per-node", "2", "examples/programs/allreduce.py"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warning" not in done.stderr  # no image to warn about: the nodes run the script here
    assert "master-0 r0 | allreduce: rank 0 of 2 sum 3 OK" in done.stdout
    assert "worker-0 r1 | allreduce: rank 1 of 2 sum 3 OK" in done.stdout
    assert done.stderr.count("Completed") == 1, done.stderr  # the end told once, by the CLI
