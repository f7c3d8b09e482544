"""The local commands through the real CLI: run, run --detach, status, logs, delete."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import cli, container, leftovers, make_job, sh, task, wait_until, write_job

pytestmark = pytest.mark.timeout(60)


def _two_ranks(tmp_path: Path, script: str = "echo hello from $RANK; sleep 0.2") -> str:
    job = make_job(
        "cli",
        [
            task("master", [container("m", sh(script))]),
            task("worker", [container("w", sh(script))], replicas=2),
        ],
        plugins={"pytorch": ["--master=master", "--worker=worker"]},
    )
    return write_job(tmp_path, job)


def test_run_prints_prefixed_lines_and_a_summary(tmp_path: Path) -> None:
    proc = cli(tmp_path, "run", _two_ranks(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for prefix, rank in (("master-0 r0", 0), ("worker-0 r1", 1), ("worker-1 r2", 2)):
        assert any(line.startswith(prefix) and line.endswith(f"| hello from {rank}") for line in lines), lines
    assert "\x1b[" not in proc.stdout  # no colors when stdout is not a terminal
    assert any(line.startswith("Completed:") for line in lines)


def test_decisions_are_logged_on_stderr_with_v_or_torchjob_log_and_not_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = _two_ranks(tmp_path, "true")
    quiet = cli(tmp_path, "run", file)
    assert quiet.returncode == 0 and "torchjob INFO" not in quiet.stderr, quiet.stderr
    verbose = cli(tmp_path, "-v", "run", file)
    assert verbose.returncode == 0, verbose.stderr
    assert "torchjob DEBUG: pod names" in verbose.stderr
    # the notices are printed once, on the console, not logged a second time
    assert "torchjob: job Running" in verbose.stdout and "torchjob INFO" not in verbose.stderr
    monkeypatch.setenv("TORCHJOB_LOG", "info")
    by_env = cli(tmp_path, "run", "-q", file)  # no console: the notices are log records
    assert "torchjob INFO: job Completed" in by_env.stderr
    assert "torchjob DEBUG" not in by_env.stderr


def test_run_exits_1_when_the_job_fails(tmp_path: Path) -> None:
    job = make_job("failing", [task("main", [container("app", sh("echo bad; exit 9"))])])
    proc = cli(tmp_path, "run", write_job(tmp_path, job))
    assert proc.returncode == 1
    assert "Failed:" in proc.stdout and "exit code 9" in proc.stdout


def test_detach_status_logs_and_delete(tmp_path: Path) -> None:
    proc = cli(
        tmp_path, "run", "--detach", _two_ranks(tmp_path, "echo hello from $RANK; sleep 1.5; echo done")
    )
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    assert job_id.startswith("cli-")
    status = cli(tmp_path, "status", job_id)
    assert status.returncode == 0 and ("Running" in status.stdout or "Pending" in status.stdout)
    follow = cli(tmp_path, "logs", job_id, "-f")
    assert follow.returncode == 0
    assert sorted(line for line in follow.stdout.splitlines() if line.endswith("| done")) == [
        "master-0 r0 | done",
        "worker-0 r1 | done",
        "worker-1 r2 | done",
    ]
    final = json.loads(cli(tmp_path, "status", job_id, "-o", "json").stdout)
    assert final["phase"] == "Completed"
    one = cli(tmp_path, "logs", "cli", "worker-1")  # by job name and short pod name
    assert one.stdout.splitlines() == ["worker-1 r2 | hello from 2", "worker-1 r2 | done"]
    listing = cli(tmp_path, "status")
    assert job_id in listing.stdout and "Completed" in listing.stdout
    deleted = cli(tmp_path, "delete", job_id)
    assert deleted.returncode == 0
    assert not (tmp_path / "home" / "jobs" / job_id).exists()


def test_delete_stops_a_running_job(tmp_path: Path) -> None:
    job = make_job("longrun", [task("main", [container("app", sh("echo up; sleep 300"))])])
    proc = cli(tmp_path, "run", "-d", write_job(tmp_path, job))
    job_id = proc.stdout.strip()
    assert wait_until(lambda: len(leftovers(job_id)) >= 2, 10)
    deleted = cli(tmp_path, "delete", job_id)
    assert deleted.returncode == 0, deleted.stderr
    assert leftovers(job_id) == []
    assert not (tmp_path / "home" / "jobs" / job_id).exists()


def test_unknown_job_or_pod_is_bad_input(tmp_path: Path) -> None:
    assert cli(tmp_path, "status", "nope").returncode == 2
    assert cli(tmp_path, "logs", "nope").returncode == 2
    job = make_job("known", [task("main", [container("app", sh("true"))])])
    assert cli(tmp_path, "run", "-q", write_job(tmp_path, job)).returncode == 0
    missing = cli(tmp_path, "logs", "known", "worker-7")
    assert missing.returncode == 2 and "main-0" in missing.stderr


def test_on_a_terminal_lines_are_colored_and_a_status_table_is_kept_below(tmp_path: Path) -> None:
    import pty

    master, slave = pty.openpty()
    env = {**os.environ, "TORCHJOB_HOME": str(tmp_path / "home"), "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchjob", "run", _two_ranks(tmp_path, "echo hi; sleep 1.2")],
        env=env,
        stdout=slave,
        stderr=slave,
        stdin=subprocess.DEVNULL,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the terminal closed: the run is over
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=30) == 0
    text = b"".join(chunks).decode(errors="replace")
    assert "\x1b[36mmaster-0 r0" in text  # the pod's color
    assert "POD" in text and "ELAPSED" in text  # the live table
    assert "\x1b[J" in text  # erased and redrawn below new lines
    assert "\x1b[32mCompleted\x1b[0m:" in text


def test_run_refuses_a_container_without_a_command_with_its_line_and_starts_nothing(tmp_path: Path) -> None:
    path = tmp_path / "nocommand.yaml"
    path.write_text(
        "apiVersion: batch.volcano.sh/v1alpha1\n"
        "kind: Job\n"
        "metadata: {name: nocommand}\n"
        "spec:\n"
        "  tasks:\n"
        "    - name: main\n"
        "      replicas: 1\n"
        "      template:\n"
        "        spec:\n"
        "          containers:\n"
        "            - name: app\n"
        "              image: busybox:1.36\n"
    )
    proc = cli(tmp_path, "run", str(path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith(f"{path}:11: spec.tasks[0].template.spec.containers[0].command:"), lines
    assert "busybox:1.36" in lines[0] and "add a 'command'" in lines[0]
    assert not (tmp_path / "home" / "jobs").exists() or not any((tmp_path / "home" / "jobs").iterdir())


@pytest.mark.parametrize("value", ["nan", "0", "-5", "inf", "-inf"])
def test_run_refuses_a_timeout_that_is_not_a_positive_number(tmp_path: Path, value: str) -> None:
    job = write_job(tmp_path, make_job("timeout", [task("main", [container("app", ["true"])])]))
    proc = cli(tmp_path, "run", f"--timeout={value}", job)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr == (  # the value as typed
        f"<command line>: --timeout: expected a positive, finite number of seconds, got {value}\n"
    )
    assert not (tmp_path / "home" / "jobs").exists() or not any((tmp_path / "home" / "jobs").iterdir())


def _ttl_job(tmp_path: Path, name: str, ttl: int | None, script: str = "echo ran") -> str:
    spec = {} if ttl is None else {"ttlSecondsAfterFinished": ttl}
    return write_job(
        tmp_path, make_job(name, [task("main", [container("main", sh(script))])], **spec), f"{name}.json"
    )


def test_ttl_seconds_after_finished_removes_a_finished_job_at_the_first_command_after_it(
    tmp_path: Path,
) -> None:
    """As Volcano's garbage collector does on a cluster: Completed or Failed, the job and its logs
    go once its TTL has passed; a job without one, or whose TTL has not passed, stays."""
    jobs = tmp_path / "home" / "jobs"
    gone = cli(tmp_path, "run", _ttl_job(tmp_path, "gone", 0))
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert "ttlSecondsAfterFinished 0: the first torchjob command from 0s after" in gone.stdout
    failed = cli(tmp_path, "run", _ttl_job(tmp_path, "failed", 0, "exit 3"))
    assert failed.returncode == 1, failed.stdout + failed.stderr
    before = time.time()
    kept = cli(tmp_path, "run", _ttl_job(tmp_path, "kept", 3600))
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert cli(tmp_path, "run", _ttl_job(tmp_path, "plain", None)).returncode == 0
    (kept_dir,) = jobs.glob("kept-*")
    assert before + 3600 <= float((kept_dir / "expires").read_text()) <= before + 3660
    assert len(list(jobs.iterdir())) == 4  # nothing is removed before a command looks
    listing = json.loads(cli(tmp_path, "status", "-o", "json").stdout)
    assert sorted(item["name"] for item in listing["items"]) == ["kept", "plain"]
    assert sorted(p.name.rsplit("-", 1)[0] for p in jobs.iterdir()) == ["kept", "plain"]
    missing = cli(tmp_path, "logs", "gone")
    assert missing.returncode == 2 and "gone" in missing.stderr


def test_a_running_job_is_not_removed_before_its_ttl_counts(tmp_path: Path) -> None:
    # Long enough for `status` and `wait` to come while it runs on a loaded machine: with `sleep 1`
    # the CI's `wait` came after the job had ended, and its TTL of 0 had it removed by then.
    job = _ttl_job(tmp_path, "slow", 0, "echo up; sleep 6")
    started = cli(tmp_path, "run", "-d", job)
    assert started.returncode == 0, started.stderr
    job_id = started.stdout.strip()
    running = json.loads(cli(tmp_path, "status", job_id, "-o", "json").stdout)
    assert running["phase"] in ("Pending", "Running")
    waited = cli(tmp_path, "wait", job_id, "--timeout", "30", timeout=40)
    assert waited.returncode == 0, waited.stdout + waited.stderr  # it completed
    assert wait_until(lambda: cli(tmp_path, "status", job_id).returncode == 2, 10)
    assert not (tmp_path / "home" / "jobs" / job_id).exists()
