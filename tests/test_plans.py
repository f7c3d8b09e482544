"""``start`` carries out the plan ``plan`` made, on every engine (issue 31): what a dry run shows is
what a start of that plan does, and a start never decides the job again.

The local engine's side is tests/test_local_plan.py (start expands nothing); the kubernetes
engine's is tests/test_targets_added.py (start sends the plan's objects, rendered once). Here: the
Slurm engine submits under the plan's job id and directory, and its dry run shows no id a run
would not use.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurm_cluster import SlurmCluster
from support import container, make_job, task
from torchjob.engine_api.base import EngineError, StartOptions
from torchjob.engine_api.registry import get_engine

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def test_slurm_submits_the_plan_it_made_and_its_text_names_no_id(
    slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    root = tmp_path / "root"
    engine = get_engine("slurm", job_root=str(root), partition=slurm.partition)
    job = make_job("planned", [task("main", [container("app", ["true"])])])
    plan = engine.plan(job, StartOptions(detach=True, quiet=True))
    text = plan.text
    assert f"# slurm engine: job planned-<id> in {root}/planned-<id>\n" in text, text
    assert not re.search(r"planned-[0-9a-f]{6}", text), "a dry run shows no id: each run draws its own"
    assert not root.exists()  # planned: nothing made
    report = engine.start(plan)
    try:
        assert re.fullmatch(r"planned-[0-9a-f]{6}", report.id), report.id
        # the plan's directory and batch script, with the id the plan drew
        job_dir = root / report.id
        assert (job_dir / "batch.sh").read_text().count(f"TORCHJOB_JOB_DIR={job_dir}\n") == 1
        shown = text.replace("planned-<id>", report.id)
        assert (
            "# submit: sbatch --parsable --job-name=planned" in shown and str(job_dir / "batch.sh") in shown
        )
        assert engine.wait(report.id, timeout=60).phase == "Completed"
    finally:
        engine.delete([report.id])
    with pytest.raises(EngineError, match="a plan of the slurm engine cannot be started by the local engine"):
        get_engine("local", state_dir=str(tmp_path / "local")).start(plan)
