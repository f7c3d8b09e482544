"""Lifecycle decisions carried out with real processes, where the local engine shows more than
tests/test_engine_lifecycle.py (which runs the same scenarios on every engine) can ask of all:
each attempt's own log files and ``TORCHJOB_ATTEMPT``, and no process left after an abort."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import container, leftovers, log_dir, log_text, make_job, run, sh, status_of, task

pytestmark = pytest.mark.timeout(60)


def test_restart_pod_recreates_only_the_failed_pod(tmp_path: Path) -> None:
    # Beyond the engine scenario: the failed attempt's log stays in its own file beside the new one.
    flag = tmp_path / "flag"
    script = (
        f"if [ $VK_TASK_INDEX = 1 ] && [ ! -e {flag} ]; then touch {flag}; echo crash; exit 3; fi;"
        " echo fine; sleep 0.5"
    )
    job = make_job(
        "rpod",
        [
            task("master", [container("m", sh("sleep 1"))]),
            task(
                "worker",
                [container("w", sh(script))],
                replicas=2,
                policies=[{"event": "PodFailed", "action": "RestartPod"}],
            ),
        ],
        plugins={"env": []},
    )
    result = run(job, tmp_path)
    assert result.ok, result.reason
    attempts = {p.name.split("rpod-")[1]: log_dir(result, p).name for p in result.pods}
    assert attempts == {"master-0": "attempt-0", "worker-0": "attempt-0", "worker-1": "attempt-1"}
    assert status_of(result)["retryCount"] == 1
    assert "crash" in log_text(result, "worker-1", "w", attempt=0)
    assert "fine" in log_text(result, "worker-1", "w", attempt=1)


def test_max_retry_used_up_fails_the_job_and_keeps_the_last_logs(tmp_path: Path) -> None:
    # Beyond the engine scenario: TORCHJOB_ATTEMPT in each attempt, each attempt's log kept.
    job = make_job(
        "exhaust",
        [task("main", [container("app", sh("echo attempt $TORCHJOB_ATTEMPT; exit 1"))])],
        maxRetry=2,
        policies=[{"event": "PodFailed", "action": "RestartJob"}],
    )
    result = run(job, tmp_path)
    assert result.phase == "Failed"
    assert status_of(result)["retryCount"] == 2
    assert "maxRetry 2" in result.reason
    assert log_text(result, "main-0", "app", attempt=0).strip() == "attempt 0"
    assert log_text(result, "main-0", "app", attempt=1).strip() == "attempt 1"
    assert result.pods[0].phase == "Failed" and result.pods[0].exit_code == 1


def test_task_failed_fires_when_container_restarts_reach_the_task_max_retry(tmp_path: Path) -> None:
    # Beyond the engine scenario: no process of the crash-looping container is left after the abort.
    job = make_job(
        "taskfail",
        [
            task(
                "main",
                [container("app", sh("exit 2"))],
                restart="OnFailure",
                maxRetry=2,
                policies=[{"event": "TaskFailed", "action": "AbortJob"}],
            )
        ],
    )
    result = run(job, tmp_path)
    assert result.phase == "Aborted"
    assert result.pods[0].restarts >= 2
    assert "TaskFailed" in result.reason
    assert leftovers(result.id) == []


def test_a_policy_timeout_delays_its_action(tmp_path: Path) -> None:
    # Beyond the engine scenario: the pending pod's running init container is killed with the job.
    job = make_job(
        "pendingtoolong",
        [task("main", [container("app", sh("true"))], init=[container("slow", sh("sleep 30"))])],
        policies=[{"event": "PodPending", "action": "AbortJob", "timeout": "1s"}],
    )
    result = run(job, tmp_path)
    assert result.phase == "Aborted"
    assert "PodPending" in result.reason
    assert leftovers(result.id) == []
