"""The Slurm wrappers and pod steps against a real, private Slurm (tools/slurm_cluster.py)."""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from slurm_cluster import SlurmCluster, alive
from torchjob.engines.slurm import clients, steps
from torchjob.engines.slurm.plan import Resources, SlurmPlan, plan_job
from torchjob.engines.slurm.settings import SlurmSettings
from torchjob.jobs import load_jobs_from_text

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

JOB = """
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: steps}
spec:
  tasks:
    - name: worker
      replicas: %(replicas)d
      template:
        spec:
          containers:
            - name: main
              image: python:3.11
              command: ["python", "-c", "pass"]
              resources: {limits: {cpu: "%(cpus)d"}}
"""


def make_plan(
    tmp_path: Path, cluster: SlurmCluster, replicas: int = 2, cpus: int = 1, **settings: Any
) -> SlurmPlan:
    job = load_jobs_from_text(JOB % {"replicas": replicas, "cpus": cpus})[0].job
    assert job is not None
    job_dir = tmp_path / "job"
    job_dir.mkdir(exist_ok=True)
    return plan_job(job, SlurmSettings(**settings), str(job_dir), ["sleep", "600"])


def submit(plan: SlurmPlan, cluster: SlurmCluster) -> str:
    script = Path(plan.job_dir) / "batch.sh"
    script.write_text(plan.script)
    return clients.submit(plan.sbatch_args, script, cluster.env)


def wait_state(cluster: SlurmCluster, job_id: str, wanted: set[str], timeout: float = 60) -> clients.JobState:
    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        states = clients.show_job(job_id, cluster.env)
        assert states is not None
        state = states[0]
        if state.state in wanted:
            return state
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} not in {wanted} after {timeout} s: {state}")


def start_step(cluster: SlurmCluster, job_id: str, name: str, code: str, log: Path, *args: str) -> steps.Step:
    return steps.Step.start(
        job_id,
        name,
        [sys.executable, "-c", code, *args],
        host=cluster.host,
        resources=Resources(cpus=1),
        env=cluster.env,
        log=log,
    )


def no_process_left(marker: str, timeout: float = 15) -> list[int]:
    """The processes with ``marker`` on their command line still alive after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return processes_with(marker)


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes() and alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_two_steps_in_one_allocation_report_their_exit_codes(slurm: SlurmCluster, tmp_path: Path) -> None:
    job_id = submit(make_plan(tmp_path, slurm), slurm)
    wait_state(slurm, job_id, {"RUNNING"})
    ok = start_step(
        slurm, job_id, "pod-0", "import os; print('rank', os.environ['SLURM_STEP_ID'])", tmp_path / "0.log"
    )
    bad = start_step(slurm, job_id, "pod-1", "import sys; print('failing'); sys.exit(3)", tmp_path / "1.log")
    assert ok.wait(60) == 0
    assert bad.wait(60) == 3
    assert (tmp_path / "0.log").read_text().startswith("rank ")
    assert "failing" in (tmp_path / "1.log").read_text()


def test_a_step_is_terminated_with_grace_then_killed(slurm: SlurmCluster, tmp_path: Path) -> None:
    job_id = submit(make_plan(tmp_path, slurm), slurm)
    wait_state(slurm, job_id, {"RUNNING"})
    graceful = (
        "import signal, sys, time\n"
        "def bye(*_):\n    print('got TERM', flush=True); sys.exit(7)\n"
        "signal.signal(signal.SIGTERM, bye)\nprint('ready', flush=True)\ntime.sleep(300)\n"
    )
    stubborn = (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\ntime.sleep(300)\n"
    )
    marker = uuid.uuid4().hex
    polite = start_step(slurm, job_id, "polite", graceful, tmp_path / "p.log", marker)
    rude = start_step(slurm, job_id, "rude", stubborn, tmp_path / "r.log", marker)
    for log in ("p.log", "r.log"):
        deadline = time.monotonic() + 30
        while "ready" not in (tmp_path / log).read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
    assert polite.terminate(grace=10) == 7
    assert "got TERM" in (tmp_path / "p.log").read_text()
    started = time.monotonic()
    code = rude.terminate(grace=1)
    assert code is not None and code != 0
    assert time.monotonic() - started < 30
    deadline = time.monotonic() + 15
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(marker) == []
    assert set(steps.steps(job_id, slurm.env).values()) <= {"batch", "extern"}


def test_a_job_pending_on_resources_shows_slurms_reason(slurm: SlurmCluster, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    whole = make_plan(tmp_path / "a", slurm, replicas=slurm.cpus)
    first = submit(whole, slurm)
    wait_state(slurm, first, {"RUNNING"})
    second = submit(make_plan(tmp_path / "b", slurm, replicas=1), slurm)
    state = wait_state(slurm, second, {"PENDING"})
    deadline = time.monotonic() + 20
    while state.reason != "Resources" and time.monotonic() < deadline:
        time.sleep(0.2)
        state = (clients.show_job(second, slurm.env) or [state])[0]
    assert state.state == "PENDING" and state.reason == "Resources"
    assert clients.queue(second, slurm.env) == [(second, "PENDING", "Resources")]
    clients.cancel(first, slurm.env)
    wait_state(slurm, second, {"RUNNING"})


def test_a_refused_sbatch_is_one_line_with_slurms_reason(slurm: SlurmCluster, tmp_path: Path) -> None:
    plan = make_plan(tmp_path, slurm, partition="no-such-partition")
    with pytest.raises(steps.SlurmError) as caught:
        submit(plan, slurm)
    message = str(caught.value)
    assert "\n" not in message
    assert message == "sbatch failed: Batch job submission failed: Invalid partition name specified"
    assert slurm.jobs() == []
    assert clients.show_job("999999", slurm.env) is None  # a job the controller does not know
    assert clients.queue("999999", slurm.env) == []


def test_no_sbatch_on_path_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(steps.SlurmError, match=r"^sbatch is not on PATH: run torchjob on a Slurm login node"):
        clients.submit(["--ntasks=1"], tmp_path / "batch.sh")


def test_a_client_that_does_not_answer_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "squeue"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    # The outage this call notes is this process's memory: kept to this test, or a later test's
    # step that Slurm refuses would be taken for one refused just after an outage and started again.
    monkeypatch.setattr(clients, "_down_at", [])
    started = time.monotonic()
    with pytest.raises(steps.SlurmError, match=r"^squeue did not answer within 0.5 s"):
        clients.run(["squeue"], timeout=0.5)
    assert time.monotonic() - started < 10
    assert clients.down_recently()


def test_scancel_leaves_no_step_and_no_process(slurm: SlurmCluster, tmp_path: Path) -> None:
    job_id = submit(make_plan(tmp_path, slurm), slurm)
    wait_state(slurm, job_id, {"RUNNING"})
    marker = uuid.uuid4().hex
    sleeper = "import time; print('ready', flush=True); time.sleep(300)"
    running = [
        start_step(slurm, job_id, f"pod-{i}", sleeper, tmp_path / f"{i}.log", marker) for i in range(2)
    ]
    deadline = time.monotonic() + 30
    while len(processes_with(marker)) < 4 and time.monotonic() < deadline:  # srun and task, twice
        time.sleep(0.1)
    assert len(steps.steps(job_id, slurm.env)) >= 3  # batch and the two pods
    clients.cancel(job_id, slurm.env)
    wait_state(slurm, job_id, {"CANCELLED"})
    for step in running:
        assert step.wait(30) is not None
    deadline = time.monotonic() + 20
    while (processes_with(marker) or clients.queue(job_id, slurm.env)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with(marker) == []
    assert clients.queue(job_id, slurm.env) == []


def test_two_private_clusters_do_not_meet_and_stop_leaves_nothing(tmp_path: Path) -> None:
    import slurm_cluster

    reason = slurm_cluster.why_not()
    if reason is not None:
        pytest.skip(reason)
    clusters = [SlurmCluster(tmp_path / name, tied=True) for name in ("a", "b")]
    try:
        for cluster in clusters:
            cluster.start()
        a, b = clusters
        job_a = submit(make_plan(tmp_path / "a", a), a)
        wait_state(a, job_a, {"RUNNING"})
        assert a.jobs() == [job_a]
        assert b.jobs() == []  # b's controller knows nothing of a's job
        step = start_step(a, job_a, "pod-0", "import time; time.sleep(300)", tmp_path / "a.log")
        assert step.find_step_id() is not None
        pids = [pid for cluster in clusters for pid in cluster.pids.values()]
        assert len(pids) == 6 and all(alive(pid) for pid in pids)
        assert a.step_daemons()
    finally:
        for cluster in clusters:
            cluster.stop()
    assert not any(alive(pid) for pid in pids)
    assert a.step_daemons() == [] and b.step_daemons() == []
    assert step.wait(30) is not None
