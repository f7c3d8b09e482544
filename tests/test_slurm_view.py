"""The Slurm view's word on a job its controller failed a moment ago: a time limit (or a cancel,
a preemption) ends every step at once, and the controller may see the steps end before Slurm's
signal reaches it. Slurm's final state then names the cause. In-process: Slurm's answer is the
state a view of a job directory remembers, or what a view standing in for slurmctld says."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from torchjob.engines.slurm.view import OPTIONS_FILE, SLURM_FILE, SlurmView
from torchjob.reports import FailureReport, JobReport


class Answering(SlurmView):
    """A view to which slurmctld answers ``state`` (None: it is never to be asked)."""

    def __init__(self, root: Path, state: str | None) -> None:
        super().__init__(root)
        self.answer = state
        self.asks = 0

    def state(self, slurm_id: str) -> tuple[str | None, str]:
        assert self.answer is not None, "Slurm was asked"
        self.asks += 1
        return self.answer, ""


def job_dir(tmp_path: Path, phase: str, ended: float, remembered: str | None = None) -> Path:
    folder = tmp_path / "sj-abc123"
    folder.mkdir()
    failure = FailureReport(pod="sj-sleeper-0", short="sleeper-0", exit_code=1, reason="Error")
    report = JobReport("slurm", folder.name, "sj", phase, "pod sleeper-0 failed", finished_at=ended)
    report.first_failure = failure if phase == "Failed" else None
    (folder / "status.json").write_text(json.dumps(report.to_dict()))
    slurm = {"jobId": "7", **({"state": remembered} if remembered else {})}
    (folder / SLURM_FILE).write_text(json.dumps(slurm))
    (folder / OPTIONS_FILE).write_text("{}")
    return folder


def test_a_job_failed_as_slurms_time_limit_ended_its_steps_is_told_as_timeout(tmp_path: Path) -> None:
    folder = job_dir(tmp_path, "Failed", time.time(), remembered="TIMEOUT")
    report = Answering(tmp_path, None).report(folder)
    assert (report.phase, report.reason) == (
        "Failed",
        "Slurm: TIMEOUT: the allocation reached its time limit",
    )


@pytest.mark.parametrize(("answer", "phase"), [("RUNNING", "Terminating"), ("FAILED", "Failed")])
def test_until_slurm_has_a_final_state_the_job_is_still_ending(
    tmp_path: Path, answer: str, phase: str
) -> None:
    folder = job_dir(tmp_path, "Failed", time.time())
    view = Answering(tmp_path, answer)
    report = view.report(folder)
    assert report.phase == phase and view.asks == 1
    assert report.reason == "pod sleeper-0 failed" and report.first_failure is not None


@pytest.mark.parametrize(("phase", "ago"), [("Completed", 1.0), ("Failed", 3600.0)])
def test_a_job_that_completed_or_failed_long_ago_asks_slurm_nothing(
    tmp_path: Path, phase: str, ago: float
) -> None:
    folder = job_dir(tmp_path, phase, time.time() - ago)
    report = Answering(tmp_path, None).report(folder)
    assert report.phase == phase
