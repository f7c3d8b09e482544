"""Lifecycle decisions carried out with real processes: restarts, task failure, dependsOn, delays."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_local_support import container, leftovers, log_text, make_job, run, sh, status_of, task

pytestmark = pytest.mark.timeout(60)


def _fail_once(flag: Path) -> list[str]:
    return sh(f"if [ -e {flag} ]; then echo recovered; else touch {flag}; echo crash; exit 3; fi")


def test_restart_pod_recreates_only_the_failed_pod(tmp_path: Path) -> None:
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
    attempts = {p.name.split("rpod-")[1]: p.log_dir.name for p in result.pods}
    assert attempts == {"master-0": "attempt-0", "worker-0": "attempt-0", "worker-1": "attempt-1"}
    assert status_of(result)["retryCount"] == 1
    assert "crash" in log_text(result, "worker-1", "w", attempt=0)
    assert "fine" in log_text(result, "worker-1", "w", attempt=1)


def test_restart_task_recreates_the_whole_task_and_leaves_the_others(tmp_path: Path) -> None:
    job = make_job(
        "rtask",
        [
            task("master", [container("m", sh("sleep 1.5"))]),
            task(
                "worker",
                [container("w", _fail_once(tmp_path / "flag"))],
                policies=[{"event": "PodFailed", "action": "RestartTask"}],
            ),
        ],
    )
    result = run(job, tmp_path)
    assert result.ok, result.reason
    by_task = {p.task: p.log_dir.name for p in result.pods}
    assert by_task == {"master": "attempt-0", "worker": "attempt-1"}


def test_max_retry_used_up_fails_the_job_and_keeps_the_last_logs(tmp_path: Path) -> None:
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
    assert leftovers(result.job_id) == []


def test_depends_on_starts_a_task_once_its_dependency_runs(tmp_path: Path) -> None:
    marker = tmp_path / "server-up"
    job = make_job(
        "deps",
        [
            task(
                "client",
                [container("c", sh(f"test -e {marker} && echo server was up"))],
                dependsOn={"name": ["server"]},
            ),
            # ": >" is the shell's own redirection: no fork and exec of touch, which under load
            # could come after the client (started one tick after the server runs) looked.
            task("server", [container("s", sh(f": > {marker}; sleep 0.5"))]),
        ],
    )
    result = run(job, tmp_path)
    assert result.ok, result.reason
    assert "server was up" in log_text(result, "client-0", "c")


def test_a_policy_timeout_delays_its_action(tmp_path: Path) -> None:
    job = make_job(
        "pendingtoolong",
        [task("main", [container("app", sh("true"))], init=[container("slow", sh("sleep 30"))])],
        policies=[{"event": "PodPending", "action": "AbortJob", "timeout": "1s"}],
    )
    result = run(job, tmp_path)
    assert result.phase == "Aborted"
    assert "PodPending" in result.reason
    assert leftovers(result.job_id) == []


def test_a_later_event_cancels_a_delayed_action(tmp_path: Path) -> None:
    job = make_job(
        "pendingbriefly",
        [task("main", [container("app", sh("sleep 1.5"))], init=[container("quick", sh("sleep 0.1"))])],
        policies=[{"event": "PodPending", "action": "AbortJob", "timeout": "1s"}],
    )
    result = run(job, tmp_path)
    assert result.ok, result.reason
