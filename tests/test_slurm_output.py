"""A step's output against a real, private Slurm: the container's log holds what the program
wrote (as on the local engine), srun's own messages only when they say more than the exit code."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slurm_cluster import SlurmCluster
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
    # A path with % (srun's filename patterns: %j, %t, ...) is given to srun escaped (%%): the same
    # log, srun's line beside it. Only a backslash, which srun's patterns drop, keeps the relay.
    assert steps.output_pattern(Path("/r/100%j/app.log")) == "/r/100%%j/app.log"
    assert steps.output_pattern(Path("/r/a\\b/app.log")) is None
    odd = tmp_path / "100%j 5%"
    odd.mkdir()
    escaped = start_step(slurm, job_id, "escaped", code, odd / "app.log")
    assert escaped.wait(60) == 3
    assert (odd / "app.log").read_text().splitlines() == ["out", "err"]
    assert escaped.messages() == []
    assert "Exited with exit code 3" in (odd / "app.log.srun").read_text()
    assert sorted(p.name for p in odd.iterdir()) == ["app.log", "app.log.srun"]


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
