"""slurmctld outages against a real Slurm: slurmctld is stopped by its pid and started again with its
saved state (tools/slurm_cluster.py), while jobs run on their nodes without it. The cluster's
MessageTimeout is 5 s, so a client gives up on an absent slurmctld after about 5 s (10 s by
Slurm's default), and the outages here last a little longer than that."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_cluster import SlurmCluster, why_not
from test_slurm_engine import REPO, cli_env, job_file, live_pods, status_json, task, torchjob, wait_for
from test_slurm_steps import no_process_left

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

OUTAGE = 12.0  # seconds slurmctld is away: more than a client's MessageTimeout (5 s here)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    reason = why_not()
    if reason is not None:
        pytest.skip(reason)
    found = SlurmCluster(tmp_path_factory.mktemp("slurm") / "cluster", message_timeout=5, tied=True)
    try:
        yield found.start()
    finally:
        found.stop()


def wait_file(path: Path) -> str:
    """A program that waits (bounded) for ``path`` to appear."""
    return (
        "import os, time\nfor _ in range(1200):\n"
        f"    if os.path.exists({str(path)!r}): break\n    time.sleep(0.1)\n"
    )


def background(env: dict[str, str], out: Path, *args: str) -> subprocess.Popen[bytes]:
    """torchjob in a session of its own (as a terminal runs it), its output in files."""
    with open(out.with_suffix(".out"), "wb") as stdout, open(out.with_suffix(".err"), "wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "torchjob", *args],
            env=env,
            cwd=REPO,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )


def finish(process: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        return process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_an_attached_run_rides_an_outage_and_a_step_that_could_not_start_is_started_again(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    # The pod fails once, before the outage; its policy restarts it 4 s later, during the outage:
    # the new attempt's step must be created while slurmctld is away.
    # A second pod runs on meanwhile (a job whose pods all ended would be judged at once).
    flag, second = tmp_path / "failed-once", tmp_path / "second"
    code = (
        f"import os, sys\nif not os.path.exists({str(flag)!r}):\n"
        f"    open({str(flag)!r}, 'w').close(); print('first', flush=True); sys.exit(3)\n"
        f"open({str(second)!r}, 'w').close(); print('second ran', flush=True)\n"
    )
    job = task("w", code, policies=[{"event": "PodFailed", "action": "RestartPod", "timeout": "4s"}])
    path = job_file(tmp_path, [job, task("keeper", wait_file(second) + "print('keeper done')")])
    env = cli_env(cluster, tmp_path / "root")
    run = background(env, tmp_path / "run", "run", str(path), "--engine", "slurm")
    try:
        wait_for(lambda: "first" in (tmp_path / "run.out").read_text(), 60, "the first attempt ended")
        time.sleep(0.5)  # its step's end reaches slurmctld
        cluster.stop_controller()
        down = time.monotonic()
        time.sleep(6)
        status = torchjob(env, "status", "sj", "--engine", "slurm", timeout=30)
        assert status.returncode == 0, status.stderr  # answered from the job directory, at once
        assert "Slurm does not answer" in status.stdout, status.stdout
        logs = torchjob(env, "logs", "sj", "--engine", "slurm", "--attempt", "0", timeout=30)
        assert (logs.returncode, "w-0 | first" in logs.stdout) == (0, True), logs.stdout + logs.stderr
        # A plan while slurmctld is away: the step limit is not read (no client's retries), assumed
        dry = torchjob(env, "run", "--dry-run", str(path), "--engine", "slurm", timeout=30)
        assumed = "per job: Slurm's default MaxStepCount, assumed: slurmctld does not answer (Slurmctld("
        assert dry.returncode == 0 and assumed in dry.stdout and " is DOWN)" in dry.stdout, dry.stdout
        assert run.poll() is None, (tmp_path / "run.err").read_text()  # still following
        time.sleep(max(0.0, OUTAGE - (time.monotonic() - down)))
    finally:
        cluster.start_controller()
    assert finish(run, 120) == 0, (tmp_path / "run.err").read_text()
    out, err = (tmp_path / "run.out").read_text(), (tmp_path / "run.err").read_text()
    assert "w-0 | second ran" in out, out
    assert "Slurm does not answer" in err and "Slurm answers again" in err, err
    final = status_json(env, "sj")
    pod = final["pods"][0]  # type: ignore[index]
    # The step that could not be created was started again: the attempt the policy made is the
    # last one, with no restart in place and no failure of its own.
    assert (final["phase"], pod["attempt"], pod["restarts"]) == ("Completed", 1, 0), final
    main_log = next((tmp_path / "root").glob("sj-*/logs/sj-w-0/1/main.log")).read_text()
    assert "srun could not start step sj-w-0.main.1 without slurmctld" in main_log, main_log


def test_a_pod_to_stop_during_an_outage_is_stopped_once_slurmctld_is_back(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    marker = uuid.uuid4().hex
    done_file = tmp_path / "done"
    ends = task("ends", wait_file(done_file) + f"print('ends')  # {marker}")
    ends["policies"] = [{"event": "TaskCompleted", "action": "CompleteJob"}]
    sleeper = task("sleeper", f"import time; print('up', flush=True); time.sleep(600)  # {marker}")
    path = job_file(tmp_path, [ends, sleeper])
    env = cli_env(cluster, tmp_path / "root")
    submitted = torchjob(env, "submit", str(path), "--engine", "slurm")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    # A second job, followed by an attached run: Ctrl-C comes while slurmctld is down.
    (tmp_path / "other").mkdir()
    other = job_file(
        tmp_path / "other", [task("c", f"import time; print('up', flush=True); time.sleep(600)  # {marker}")]
    )
    attached = background(env, tmp_path / "attached", "run", str(other), "--engine", "slurm")
    try:
        wait_for(lambda: "up" in (tmp_path / "attached.out").read_text(), 60, "the attached job running")

        def running() -> bool:
            pods = status_json(env, job_id)["pods"]
            return [p["phase"] for p in pods] == ["Running", "Running"]  # type: ignore[union-attr, index]

        wait_for(running, 60, "both pods of the first job running")
        cluster.stop_controller()
        done_file.touch()  # CompleteJob: the sleeper must be stopped, and slurmctld is not there
        time.sleep(2)
        started = time.monotonic()
        os.killpg(attached.pid, signal.SIGINT)  # as a terminal's Ctrl-C
        assert finish(attached, 30) == 130
        assert time.monotonic() - started < 15  # said at once, not after the clients' own retries
        err = (tmp_path / "attached.err").read_text()
        told = re.search(r"Slurm job (\d+) runs on: cancel it with `scancel (\d+)`", err)
        assert told is not None and told[1] == told[2] and "Slurm does not answer" in err, err
        refused = torchjob(env, "run", str(path), "--engine", "slurm", timeout=30)
        assert refused.returncode == 2 and "Slurm does not answer" in refused.stderr, refused.stderr
        assert "Nothing was submitted" in refused.stderr
        time.sleep(max(0.0, OUTAGE - 2))
    finally:
        cluster.start_controller()
    waited = torchjob(env, "wait", job_id, "--engine", "slurm", "--timeout", "90")
    status = status_json(env, job_id)
    assert (waited.returncode, status["phase"]) == (0, "Completed"), status
    assert live_pods(status) == [], status
    # The command the message gave, for the job that Ctrl-C could not cancel; Slurm's own
    # bookkeeping of the steps that ended during the outage lags (~50 s): not waited for.
    assert cluster.run("scancel", told[2]).returncode == 0
    wait_for(lambda: no_process_left(marker) == [], 30, "no process left")
