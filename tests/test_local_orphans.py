"""No orphans, no hangs: Ctrl-C, SIGTERM, a SIGKILLed supervisor and the job's own end.

Each job has a container that starts a grandchild ``sleep`` in a new session (it leaves the
container's process group) and one that ignores SIGTERM, so the grace period and the SIGKILL
after it are exercised too. Every check looks for processes that carry the job's marker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from test_local_support import container, leftovers, make_job, run, sh, task, wait_until
from torchjob.spec.manifest import job_manifest

pytestmark = pytest.mark.timeout(60)

SPAWNER = """
import subprocess, time
subprocess.Popen(["sleep", "300"], start_new_session=True)  # leaves the container's group
subprocess.Popen(["sleep", "301"])  # stays in it
print("spawned", flush=True)
time.sleep(300)
"""


def _job(tmp_path: Path, name: str) -> Path:
    (tmp_path / "spawner.py").write_text(SPAWNER)
    job = make_job(
        name,
        [
            task("master", [container("spawner", ["python", str(tmp_path / "spawner.py")])]),
            task("worker", [container("stubborn", sh("trap '' TERM; echo stubborn; sleep 300"))]),
        ],
    )
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job_manifest(job)))
    return path


def _start(tmp_path: Path, name: str) -> tuple[subprocess.Popen[bytes], str]:
    home = tmp_path / "home"
    env = {**os.environ, "TORCHJOB_HOME": str(home)}
    out = open(tmp_path / "out.txt", "wb")  # noqa: SIM115 - closed by the test's end
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchjob", "run", str(_job(tmp_path, name))],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    jobs = home / "jobs"
    assert wait_until(lambda: jobs.is_dir() and any(jobs.iterdir()), 15), "the job never started"
    job_id = next(jobs.iterdir()).name
    logs = jobs / job_id / "logs"

    def ready() -> bool:
        spawned = list(logs.glob("*master-0/attempt-0/spawner.log"))
        stubborn = list(logs.glob("*worker-0/attempt-0/stubborn.log"))
        return bool(
            spawned
            and "spawned" in spawned[0].read_text()
            and stubborn
            and "stubborn" in stubborn[0].read_text()
        )

    assert wait_until(ready, 20), (tmp_path / "out.txt").read_text()
    assert wait_until(lambda: len(leftovers(job_id)) >= 5, 5)
    sessions = {os.getsid(p.pid) for p in leftovers(job_id) if p.name() == "sleep"}
    assert len(sessions) >= 2, "the test needs a grandchild in a session of its own"
    return proc, job_id


def _exit_code(proc: subprocess.Popen[bytes]) -> int:
    return proc.wait(timeout=20)


def test_ctrl_c_stops_every_process_and_exits_130(tmp_path: Path) -> None:
    proc, job_id = _start(tmp_path, "sigint")
    proc.send_signal(signal.SIGINT)
    assert _exit_code(proc) == 130
    assert leftovers(job_id) == []
    status = json.loads(next((tmp_path / "home" / "jobs").glob("*/status.json")).read_text())
    assert status["phase"] == "Terminated" and "SIGINT" in status["reason"]


def test_sigterm_stops_every_process_and_exits_1(tmp_path: Path) -> None:
    proc, job_id = _start(tmp_path, "sigterm")
    proc.send_signal(signal.SIGTERM)
    assert _exit_code(proc) == 1
    assert leftovers(job_id) == []


def test_a_sigkilled_supervisor_leaves_nothing_after_two_seconds(tmp_path: Path) -> None:
    proc, job_id = _start(tmp_path, "sigkill")
    victims = leftovers(job_id)
    proc.kill()
    killed_at = time.monotonic()
    proc.wait(timeout=5)

    def victims_alive() -> bool:
        # A dying process loses its environment (so its marker) before it becomes a zombie.
        try:
            return any(v.is_running() and v.status() != psutil.STATUS_ZOMBIE for v in victims)
        except psutil.NoSuchProcess:
            return victims_alive()  # one just went; look again

    gone = wait_until(lambda: not leftovers(job_id) and not victims_alive(), 2.0)
    took = time.monotonic() - killed_at
    assert gone, f"still alive {took:.2f}s after the SIGKILL: {[p.cmdline() for p in leftovers(job_id)]}"
    assert not victims_alive()


def test_the_end_of_a_job_stops_grandchildren_that_left_the_group(tmp_path: Path) -> None:
    (tmp_path / "spawner.py").write_text(SPAWNER)
    job = make_job(
        "ending",
        [
            task("master", [container("spawner", ["python", str(tmp_path / "spawner.py")])]),
            task("worker", [container("quick", sh("sleep 0.5; exit 3"))]),
        ],
        policies=[{"event": "PodFailed", "action": "AbortJob"}],
    )
    result = run(job, tmp_path)
    assert result.phase == "Aborted"
    assert leftovers(result.job_id) == []


def test_a_timeout_kills_a_container_that_ignores_sigterm(tmp_path: Path) -> None:
    job = make_job("stubborn", [task("main", [container("app", sh("trap '' TERM; sleep 300"))])])
    result = run(job, tmp_path, timeout=0.5)
    assert result.phase == "Terminated"
    assert result.pods[0].exit_code == 137  # SIGKILL after the 2 s grace period
    assert leftovers(result.job_id) == []


def test_a_restart_leaves_nothing_of_the_previous_attempt(tmp_path: Path) -> None:
    pid_file = tmp_path / "daemon.pid"
    first = (
        "import subprocess, sys\n"
        "daemon = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(daemon.pid))\n"
        "sys.exit(1)\n"  # at once, before any scan of descendants could record the daemon
    )
    second = (
        "import os, sys\n"
        "try:\n"
        f"    os.kill(int(open({str(pid_file)!r}).read()), 0)\n"
        "except OSError:\n"
        "    sys.exit(0)  # the daemon of attempt 0 is gone\n"
        "sys.exit(5)\n"
    )
    (tmp_path / "first.py").write_text(first)
    (tmp_path / "second.py").write_text(second)
    script = (
        f'[ "$TORCHJOB_ATTEMPT" = 0 ] && exec python {tmp_path}/first.py; exec python {tmp_path}/second.py'
    )
    job = make_job(
        "norest",
        [task("main", [container("app", sh(script))])],
        policies=[{"event": "PodFailed", "action": "RestartJob"}],
    )
    result = run(job, tmp_path)
    assert result.ok, result.reason
    assert result.pods[0].log_dir.name == "attempt-1"
