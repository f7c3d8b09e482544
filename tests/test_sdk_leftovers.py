"""A single-node Elastic call leaves no process behind once it is over: not the workers torch's
launcher had not finished starting when the deadline came (leftovers.py), not what a worker
started itself. Real launches with gloo on CPU, real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

pytest.importorskip("torch", reason="torch is not installed")
pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parent.parent


def _carrying(name: str, value: str) -> list[psutil.Process]:
    """Live processes of this user whose environment has ``name=value``."""
    found = []
    for proc in psutil.process_iter():
        try:
            ours = proc.uids().real == os.getuid() and proc.status() != psutil.STATUS_ZOMBIE
            if ours and proc.environ().get(name) == value:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def _gone_within(name: str, value: str, seconds: float) -> list[psutil.Process]:
    deadline = time.monotonic() + seconds
    while (left := _carrying(name, value)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _call(tmp_path: Path, script: str, mark: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "caller.py"
    path.write_text(textwrap.dedent(script))
    env = dict(os.environ, LEFTOVER_MARK=mark, TORCHJOB_HOME=str(tmp_path / "home"))
    return subprocess.run(
        [sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )


def test_a_daemon_a_rank_started_dies_with_the_call_at_its_deadline(tmp_path: Path) -> None:
    """The launcher stops its workers with SIGTERM; a process a rank started in a session of its
    own (reparented away from the call once the rank dies) is stopped too."""
    mark = uuid.uuid4().hex
    done = _call(
        tmp_path,
        """
        import subprocess, time
        from torchjob import Elastic, RunPolicy, task
        from torchjob.sdk import TaskFailed

        @task(task_config=Elastic(nproc_per_node=2, run_policy=RunPolicy(active_deadline_seconds=3)))
        def starts_a_daemon() -> None:
            subprocess.Popen(["sleep", "300"], start_new_session=True)
            time.sleep(120)

        try:
            starts_a_daemon()
        except TaskFailed as err:
            print("failed:", err)
        """,
        mark,
    )
    assert "active deadline of 3s passed" in done.stdout, done.stderr
    assert _gone_within("LEFTOVER_MARK", mark, 10) == []


def test_the_workers_of_a_call_whose_deadline_came_while_they_started_are_stopped(tmp_path: Path) -> None:
    """A fresh process's first warm call starts the fork server (which imports torch) while it
    starts the first worker: a 1 s deadline comes in the middle of starting the workers, before
    torch's launcher knows of any. The call returns, the caller goes on living, and none of its
    workers does."""
    mark = uuid.uuid4().hex
    done = _call(
        tmp_path,
        """
        import multiprocessing.forkserver, os, time
        from torchjob import Elastic, RunPolicy, task
        from torchjob.sdk import TaskFailed

        @task(task_config=Elastic(nproc_per_node=4, run_policy=RunPolicy(active_deadline_seconds=1)))
        def sleeps() -> None:
            time.sleep(120)

        try:
            sleeps()
        except TaskFailed as err:
            print("failed:", err, flush=True)
        server = multiprocessing.forkserver._forkserver._forkserver_pid
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            import psutil
            left = [p for p in psutil.Process().children(recursive=True)
                    if p.pid != server and "resource_tracker" not in " ".join(p.cmdline())
                    and p.status() != psutil.STATUS_ZOMBIE]
            if not left:
                break
            time.sleep(0.1)
        print("left:", [p.pid for p in left], flush=True)
        """,
        mark,
    )
    assert "active deadline of 1s passed" in done.stdout, done.stderr
    assert "left: []" in done.stdout, done.stdout + done.stderr
    assert _gone_within("LEFTOVER_MARK", mark, 10) == []
