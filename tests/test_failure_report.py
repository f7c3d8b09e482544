"""What a failed job tells its user: the root cause (the failed pod its log blames), crash loops, waiting."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from support import cli, container, make_job, sh, task, write_job

pytestmark = pytest.mark.timeout(180)

# Rank 2 raises at once; the other ranks fail later, in a collective, with gloo's
# "Connection closed by peer": the log of master-0 is the long one, and it ends last.
GLOO_PROGRAM = textwrap.dedent(
    """
    import time
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 2:
        raise RuntimeError("rank 2 found a bad batch")
    time.sleep(1.0 + 0.5 * (2 - rank))
    dist.all_reduce(torch.ones(1))
    """
)


def _cli(tmp_path: Path, *args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    return cli(tmp_path, *args, timeout=timeout)  # these jobs run real ranks: a longer bound


def test_a_failed_job_names_the_first_pod_to_fail_with_its_rank_exit_code_and_log(tmp_path: Path) -> None:
    program = tmp_path / "train.py"
    program.write_text(GLOO_PROGRAM)
    command = [sys.executable, str(program)]
    job = make_job(
        "rootcause",
        [
            task("master", [container("m", command)]),
            task("worker", [container("w", command)], replicas=2),
        ],
        plugins={"pytorch": ["--master=master", "--worker=worker"]},
    )
    run = _cli(tmp_path, "run", write_job(tmp_path, job))
    assert run.returncode == 1, run.stdout + run.stderr
    out = run.stdout
    # every rank failed, rank 2 first: the others' gloo errors came later
    assert out.count("Connection closed by peer") >= 2, out
    summary = out[out.index("\njob rootcause-") + 1 :]
    assert "root cause: worker-1 (rank 2), exit code 1" in summary, summary
    assert "    [rank2]: RuntimeError: rank 2 found a bad batch" in summary.splitlines(), summary
    job_id = summary.split(":")[0].removeprefix("job ")

    status = _cli(tmp_path, "status", job_id)
    assert "root cause: worker-1 (rank 2), exit code 1" in status.stdout, status.stdout
    assert "rank 2 found a bad batch" in status.stdout
    data = json.loads(_cli(tmp_path, "status", job_id, "-o", "json").stdout)
    failure = data["firstFailure"]
    assert (failure["short"], failure["rank"], failure["exitCode"]) == ("worker-1", 2, 1)
    assert failure["logTail"][-1] == "[rank2]: RuntimeError: rank 2 found a bad batch"
    assert len(failure["logTail"]) <= 20

    logs = _cli(tmp_path, "logs", job_id).stdout.splitlines()
    assert logs[0].startswith("worker-1 r2"), logs[:3]
    assert [line.split(" ")[0] for line in logs].index("master-0") > max(
        i for i, line in enumerate(logs) if line.startswith("worker-1")
    )


def test_wait_status_watch_and_logs_follow_report_how_a_detached_job_ended(tmp_path: Path) -> None:
    failing = make_job("waitfail", [task("main", [container("app", sh("sleep 1; echo broken; exit 3"))])])
    job_id = _cli(tmp_path, "run", "-d", write_job(tmp_path, failing, "fail.json")).stdout.strip()
    timed_out = _cli(tmp_path, "wait", job_id, "--timeout", "0.2")
    assert timed_out.returncode == 124, timed_out.stdout + timed_out.stderr
    assert "timed out" in timed_out.stderr and "still Running" in timed_out.stderr
    waited = _cli(tmp_path, "wait", job_id, "--timeout", "60")
    assert waited.returncode == 1, waited.stdout + waited.stderr
    assert waited.stdout.startswith(f"{job_id} Failed:")
    assert "root cause: main-0, exit code 3" in waited.stdout
    assert "    broken" in waited.stdout.splitlines()
    follow = _cli(tmp_path, "logs", "-f", job_id)
    assert (follow.returncode, follow.stdout) == (1, "main-0 | broken\n")
    watch = _cli(tmp_path, "status", "--watch", job_id)
    assert watch.returncode == 1 and "Failed" in watch.stdout

    ok = make_job("waitok", [task("main", [container("app", sh("sleep 0.5; echo fine"))])])
    ok_id = _cli(tmp_path, "run", "-d", write_job(tmp_path, ok, "ok.json")).stdout.strip()
    watch = _cli(tmp_path, "status", "-w", ok_id)
    assert watch.returncode == 0, watch.stdout + watch.stderr
    assert watch.stdout.count(f"job {ok_id}: ") >= 2  # printed again when it changed, until it ended
    assert f"job {ok_id}: Completed" in watch.stdout
    assert _cli(tmp_path, "wait", ok_id).returncode == 0
    assert _cli(tmp_path, "logs", "--follow", ok_id).returncode == 0
    missing = _cli(tmp_path, "wait", "nosuchjob")
    assert missing.returncode == 2 and "no local job 'nosuchjob'" in missing.stderr
    assert _cli(tmp_path, "status", "--watch").returncode == 2


def test_wait_prints_the_root_cause_once_the_pods_the_failure_stopped_are_gone(tmp_path: Path) -> None:
    """worker-0's program raised but lingers (it ignores SIGTERM, so its pod takes its grace period
    to go); master-0 then fails of the lost peer, and the job stops worker-0. ``wait`` waits for
    the stopped pod before it reports, so it names worker-0, not the peer that failed first."""
    raised = tmp_path / "raised"
    worker = (
        "trap '' TERM; echo 'Traceback (most recent call last):'; echo '  File \"train.py\", line 9'; "
        f"echo 'RuntimeError: boom in the worker'; : > {raised}; sleep 60"
    )
    master = (
        f"i=0; while [ ! -e {raised} ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done; "
        "echo 'RuntimeError: Connection closed by peer'; exit 1"
    )
    job = make_job(
        "settles",
        [task("master", [container("m", sh(master))]), task("worker", [container("w", sh(worker))])],
        maxRetry=1,
        policies=[{"event": "PodFailed", "action": "RestartJob"}],
    )
    job_id = _cli(tmp_path, "run", "-d", write_job(tmp_path, job)).stdout.strip()
    waited = _cli(tmp_path, "wait", job_id, "--timeout", "120")
    assert waited.returncode == 1, waited.stdout + waited.stderr
    assert "root cause: worker-0, exit code 137 (Stopped by the job after its program raised)" in (
        waited.stdout
    ), waited.stdout
    assert "    RuntimeError: boom in the worker" in waited.stdout.splitlines(), waited.stdout
    data = json.loads(_cli(tmp_path, "status", job_id, "-o", "json").stdout)
    assert [(p["short"], p["phase"]) for p in data["pods"]] == [
        ("master-0", "Failed"),
        ("worker-0", "Stopped"),
    ]


def _crash_loop_job(tmp_path: Path) -> str:
    job = make_job(
        "loop",
        [task("master", [container("m", sh("echo cannot open train.py; exit 2"))], restart="OnFailure")],
    )
    return write_job(tmp_path, job)


def test_a_crash_loop_is_told_once_and_suggests_max_restarts(tmp_path: Path) -> None:
    run = _cli(tmp_path, "run", "--timeout", "3", _crash_loop_job(tmp_path))
    assert run.returncode == 1, run.stdout + run.stderr
    notices = [line for line in run.stdout.splitlines() if "CrashLoopBackOff" in line and "torchjob:" in line]
    assert len(notices) == 1, run.stdout
    assert (
        "pod master-0 is in CrashLoopBackOff: container m ended 3 times in a row (last exit code 2)"
        in notices[0]
    )
    assert "torchjob run --max-restarts N" in notices[0]
    # each restart is one line: the one torchjob writes in the container's log
    restarts = [line for line in run.stdout.splitlines() if "restart 2 " in line]
    assert len(restarts) == 1, restarts


def test_max_restarts_fails_a_crash_looping_job_and_names_it(tmp_path: Path) -> None:
    run = _cli(tmp_path, "run", "--max-restarts", "2", _crash_loop_job(tmp_path))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Failed: pod master-0 restarted 3 times, more than --max-restarts 2" in run.stdout
    assert "root cause: master-0, exit code 2 (CrashLoopBackOff)" in run.stdout
    assert "    cannot open train.py" in run.stdout.splitlines()
    assert "master-0  -     127.0.1.1  Stopped (job failed)" in run.stdout
    bad = _cli(tmp_path, "run", "--max-restarts", "-1", _crash_loop_job(tmp_path))
    assert bad.returncode == 2 and "--max-restarts" in bad.stderr and "loop-" not in bad.stdout


def test_status_shows_a_crash_looping_pod_in_crash_loop_back_off(tmp_path: Path) -> None:
    job_id = _cli(tmp_path, "run", "-d", _crash_loop_job(tmp_path)).stdout.strip()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status = _cli(tmp_path, "status", job_id)
            if "CrashLoopBackOff" in status.stdout:
                break
            time.sleep(0.2)
        assert "Running (CrashLoopBackOff)" in status.stdout, status.stdout
        row = next(line for line in status.stdout.splitlines() if "CrashLoopBackOff)" in line)
        header = next(line for line in status.stdout.splitlines() if line.lstrip().startswith("POD "))
        assert row[header.index("EXIT") :].split()[0] == "2", row  # the last run's exit code, not "-"
        assert "master-0: container m in CrashLoopBackOff, last exit code 2 (Error)" in status.stdout
        data = json.loads(_cli(tmp_path, "status", job_id, "-o", "json").stdout)
        pod = data["pods"][0]
        assert pod["reason"] == "CrashLoopBackOff"
        assert (pod["containers"][0]["state"], pod["containers"][0]["exitCode"]) == ("waiting", 2)
    finally:
        _cli(tmp_path, "delete", job_id)


def test_bench_local_exits_non_zero_when_a_target_is_missed(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_local_run.py"
    spec = importlib.util.spec_from_file_location("bench_local_run", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look themselves up there
    try:
        spec.loader.exec_module(bench)

        def summaries(torchjob_wall: float) -> list[object]:
            job = bench.Summary("torchjob", 2, [bench.Run("torchjob", 2, torchjob_wall, 0.1, 0.2, 0.5, 0.05)])
            shell = bench.Summary("shell", 2, [bench.Run("shell", 2, 1.0, 0.1, 0.2, 0.5, 0.05)])
            return [job, shell]

        assert bench.exit_code(bench.verdicts(summaries(1.05))) == 0
        missed = bench.verdicts(summaries(1.5))
        assert bench.exit_code(missed) == 1
        assert "target missed: 2 ranks: torchjob/shell = 1.500" in capsys.readouterr().err
    finally:
        sys.modules.pop(spec.name, None)


def test_run_output_polish_verbose_after_the_command_quiet_id_and_stopped_pods(tmp_path: Path) -> None:
    job = make_job(
        "polish",
        [
            task(
                "master",
                [container("m", sh("echo done"))],
                policies=[{"event": "TaskCompleted", "action": "CompleteJob"}],
            ),
            task("worker", [container("w", sh("sleep 30"))]),
        ],
    )
    file = write_job(tmp_path, job)
    run = _cli(tmp_path, "run", file, "-v")  # -v after the command
    assert run.returncode == 0, run.stdout + run.stderr
    assert "torchjob DEBUG: pod names" in run.stderr
    both = run.stdout + run.stderr
    assert both.count(" started; ports none; job directory ") == 1, both  # each notice once
    assert both.count("task master policy TaskCompleted -> CompleteJob\n") == 1, both
    assert both.count("all pods stopped") == 1, both  # the final reason once: in the summary
    assert "worker-0  -     127.0.1.2  Stopped (job completed)  0         143" in run.stdout, run.stdout
    job_id = run.stdout.split("torchjob: job ", 1)[1].split(" ", 1)[0]
    listing = _cli(tmp_path, "status").stdout
    assert f"{job_id}  Completed  2 pods: 1 succeeded, 1 stopped" in listing, listing

    one = make_job("single", [task("main", [container("app", sh("echo hi"))])])
    quiet = _cli(tmp_path, "run", "-q", write_job(tmp_path, one, "one.json"))
    lines = quiet.stdout.splitlines()
    assert quiet.returncode == 0 and len(lines) == 2, quiet.stdout
    assert lines[0].startswith("single-") and lines[1].startswith(f"{lines[0]} Completed: ")
    assert "1 pods" not in quiet.stdout
    assert "1 pod: 1 succeeded" in _cli(tmp_path, "status").stdout


def test_rendering_an_sdk_task_on_the_default_image_warns_once_and_says_how_to_set_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tasks.py"
    path.write_text(
        textwrap.dedent(
            """
            from torchjob import PyTorch, task

            @task(task_config=PyTorch(num_workers=1))
            def plain() -> int:
                return 1

            @task(task_config=PyTorch(num_workers=1), image="repo/train:1")
            def imaged() -> int:
                return 2
            """
        )
    )
    plain = _cli(tmp_path, "render", f"{path}:plain")
    assert plain.returncode == 0, plain.stderr
    warnings = [line for line in plain.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, plain.stderr
    assert "default image pytorch/pytorch:latest" in warnings[0] and "@task(image=...)" in warnings[0]
    assert "pytorch/pytorch:latest" in plain.stdout  # the output itself is unchanged
    imaged = _cli(tmp_path, "render", "--target", "volcano", f"{path}:imaged")
    assert imaged.returncode == 0 and "warning" not in imaged.stderr, imaged.stderr


def _pod_columns(out: str) -> dict[str, list[str]]:
    """The summary's pod table: short name -> its cells."""
    return {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line.startswith("  ") and "127.0." in line
    }


def test_the_summary_leads_with_the_root_cause_and_tells_the_reason_once(tmp_path: Path) -> None:
    job = make_job(
        "leads",
        [task("master", [container("m", sh("sleep 30"))]), task("worker", [container("w", sh("exit 4"))])],
        policies=[{"event": "PodFailed", "action": "AbortJob"}],
    )
    run = _cli(tmp_path, "run", write_job(tmp_path, job))
    assert run.returncode == 1, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    cause = next(i for i, line in enumerate(lines) if line.startswith("root cause: worker-0"))
    ended = next(i for i, line in enumerate(lines) if line.startswith("Aborted: "))
    assert cause < ended, run.stdout  # the first thing said after the table is the culprit
    # The policy's cause: once as it happens, once in the summary; not again in "job Aborting".
    assert run.stdout.count("pod worker-0 failed with exit code 4") == 2, run.stdout
    assert "torchjob: job Aborting: AbortJob: stopping the job's pods" in run.stdout, run.stdout
    job_id = lines[ended + 1].split("torchjob logs ")[1].rstrip(")")
    out = _cli(tmp_path, "status", job_id).stdout
    assert out.index("root cause: ") < out.index("pod worker-0 failed"), out


def test_exit_shows_the_last_known_exit_code_of_pods_a_timeout_stopped(tmp_path: Path) -> None:
    job = make_job(
        "lastexit",
        [
            task("quiet", [container("q", sh("trap 'exit 0' TERM; sleep 30 & wait"))]),
            task("killed", [container("k", sh("sleep 30"))]),
            task("looping", [container("l", sh("exit 3"))], restart="OnFailure"),
        ],
    )
    run = _cli(tmp_path, "run", "--timeout", "3", write_job(tmp_path, job))
    assert run.returncode == 1, run.stdout + run.stderr
    rows = _pod_columns(run.stdout[run.stdout.index("\njob lastexit-") :])
    codes = {name: cells[-3] for name, cells in rows.items()}  # ... EXIT ATTEMPT ELAPSED
    assert codes == {"quiet-0": "0", "killed-0": "143", "looping-0": "3"}, run.stdout


def test_validate_says_1_pod(tmp_path: Path) -> None:
    one = make_job("single", [task("main", [container("app", sh("echo hi"))])])
    out = _cli(tmp_path, "validate", write_job(tmp_path, one)).stdout
    assert ": job single: valid; 1 pod (mainx1)" in out, out
