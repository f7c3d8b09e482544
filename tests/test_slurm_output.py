"""A step's output against a real, private Slurm: the container's log holds what the program
wrote (as on the local engine), srun's own messages only when they say more than the exit code."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slurm_cluster import SlurmCluster
from test_slurm_engine import cli_env, job_file, task, torchjob
from test_slurm_steps import make_plan, start_step, submit, wait_state
from torchjob.engines.slurm import steps
from torchjob.engines.slurm.plan import Resources

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def test_a_failing_steps_log_is_the_programs_own(slurm: SlurmCluster, tmp_path: Path) -> None:
    job_id = submit(make_plan(tmp_path, slurm), slurm)
    wait_state(slurm, job_id, {"RUNNING"})
    log = tmp_path / "app.log"
    log.write_text("before\n")  # a restart's step appends to its container's log
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    step = start_step(slurm, job_id, "failing", code, log)
    assert step.wait(60) == 3
    assert log.read_text().splitlines() == ["before", "out", "err"]  # no "srun: error: ... exit code 3"
    assert step.messages() == []  # srun said only how the task ended
    # A directory with what srun's filename patterns read (%j, %t, a backslash, which they drop,
    # doubled or not) names the same log, srun's line beside it: srun is given the name alone.
    assert steps.output_pattern("100%j.log") == "./100%%j.log"
    # ... and a log whose name srun would read as a word of its own ("all": srun's output).
    for folder, log in [("100%j 5%", "app.log"), ("a\\b", "app.log"), ("a\\\\%%b\\", "allreduce.log")]:
        odd = tmp_path / folder
        odd.mkdir()
        escaped = start_step(slurm, job_id, "escaped", code, odd / log)
        assert escaped.wait(60) == 3
        assert (odd / log).read_text().splitlines() == ["out", "err"], folder
        assert escaped.messages() == []
        assert "Exited with exit code 3" in (odd / f"{log}.srun").read_text()
        assert sorted(p.name for p in odd.iterdir()) == [log, f"{log}.srun"]


def test_a_step_runs_where_it_did_before_srun_moved_to_its_logs_directory(
    slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """srun runs in the log's directory; the step in its workingDir, a relative one read from the
    controller's directory, or in the controller's directory without one."""
    job_id = submit(make_plan(tmp_path, slurm), slurm)
    wait_state(slurm, job_id, {"RUNNING"})
    (tmp_path / "logs").mkdir()
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    for name, working_dir, expected in [("plain", None, tmp_path), ("relative", "sub", tmp_path / "sub")]:
        log = tmp_path / "logs" / f"{name}.log"
        step = steps.Step.start(
            job_id,
            name,
            [sys.executable, "-c", "import os; print(os.getcwd())"],
            host=slurm.host,
            resources=Resources(cpus=1),
            env=slurm.env,
            log=log,
            working_dir=working_dir,
        )
        assert step.wait(60) == 0
        assert log.read_text().splitlines() == [str(expected)], name


def test_a_job_root_with_a_backslash_keeps_srun_out_of_the_pods_log(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """The whole engine with such a root: the pod's log in its job directory holds what the program
    wrote, srun's line stays beside it and so out of what the attached run prints."""
    root = tmp_path / "jobs\\x" / "root"
    env = cli_env(slurm, root)
    code = "import sys; print('out', flush=True); print('err', file=sys.stderr, flush=True); sys.exit(3)"
    done = torchjob(env, "run", str(job_file(tmp_path, [task("worker", code)])), "--engine", "slurm")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "worker-0 | out" in done.stdout and "worker-0 | err" in done.stdout, done.stdout
    assert "srun" not in done.stdout + done.stderr, done.stdout + done.stderr
    (log,) = [p for p in root.rglob("main.log") if "worker-0" in str(p)]
    assert log.read_text().splitlines() == ["out", "err"]
    assert "Exited with exit code 3" in log.with_name("main.log.srun").read_text()
    assert slurm.jobs() == []


@pytest.mark.parametrize(
    ("ending", "code", "srun_said"),
    [("os.abort()", 134, "Aborted"), ("os.kill(os.getpid(), signal.SIGSEGV)", 139, "Segmentation fault")],
)
def test_srun_saying_the_signal_that_ended_a_task_stays_out_of_its_log(
    slurm: SlurmCluster, tmp_path: Path, ending: str, code: int, srun_said: str
) -> None:
    """As on the local engine, the log holds what the program wrote; how it ended (SIGABRT: 134)
    is its exit code's to say. srun's line stays beside the log, in its own file."""
    job_id = submit(make_plan(tmp_path, slurm), slurm)
    wait_state(slurm, job_id, {"RUNNING"})
    log = tmp_path / "app.log"
    program = f"import os, signal, sys; print('out', flush=True); {ending}"
    step = start_step(slurm, job_id, "signalled", program, log)
    assert step.wait(60) == code
    assert log.read_text().splitlines() == ["out"]
    assert step.messages() == []  # nothing for the container's log
    (own,) = [line for line in (tmp_path / "app.log.srun").read_text().splitlines() if line.strip()]
    assert own.startswith("srun: error: ") and f": task 0: {srun_said}" in own, own


def test_a_step_slurm_cannot_create_says_why(slurm: SlurmCluster, tmp_path: Path) -> None:
    job_id = submit(make_plan(tmp_path, slurm), slurm)
    wait_state(slurm, job_id, {"RUNNING"})
    step = steps.Step.start(
        job_id,
        "toobig",
        [sys.executable, "-c", "print('never')"],
        host=slurm.host,
        resources=Resources(cpus=64),  # more than the allocation holds
        env=slurm.env,
        log=tmp_path / "big.log",
    )
    code = step.wait(60)
    assert code not in (None, 0)
    said = step.messages()
    assert said and all(line.startswith("srun: ") for line in said), said
    assert "never" not in (tmp_path / "big.log").read_text()
