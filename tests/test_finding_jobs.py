"""Finding a job (issue 34, item 6): a job not where a command looked is said to be where it was
last started (engine_api/lastrun.py); the jobs of SDK calls stay out of ``torchjob status``."""

from __future__ import annotations

import json
import os
import shlex
import stat
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from torchjob.cli import main
from torchjob.engine_api import lastrun

if TYPE_CHECKING:
    from kubeapi import FakeKubeAPI


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "home"
    monkeypatch.setenv("TORCHJOB_HOME", str(folder))
    return folder


def test_the_note_of_where_a_job_started(home: Path) -> None:
    assert lastrun.recall("demo") is None
    lastrun.remember(["demo", "demo-1a2b3c"], "slurm", ["--job-root", "/jobs here"], "torchjob run")
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / lastrun.FILE).stat().st_mode) == 0o600
    assert lastrun.recall("demo") == ("slurm", ["--job-root", "/jobs here"], "torchjob run")
    assert lastrun.recall("demo-1a2b3c") == lastrun.recall("demo")
    assert lastrun.hint("status", "demo", "local", []) == (
        "; a slurm job 'demo' was last started by torchjob run: "
        "torchjob status demo --engine slurm --job-root '/jobs here'"
    )
    assert lastrun.hint("logs", "demo", "slurm", ["--job-root", "/jobs here"]) == ""  # looked there
    assert lastrun.hint("wait", "demo", "slurm", []) == (
        "; a job 'demo' was last started by torchjob run: "
        "torchjob wait demo --engine slurm --job-root '/jobs here'"
    )
    # The newest start of a name is the one told; the oldest notes go past KEEP.
    lastrun.remember(["demo"], "local", [], "a Python call")
    assert lastrun.recall("demo") == ("local", [], "a Python call")
    lastrun.remember([f"job-{i}" for i in range(lastrun.KEEP)], "local", [], "torchjob run")
    notes = json.loads((home / lastrun.FILE).read_text())
    assert len(notes) == lastrun.KEEP and "demo" not in notes and "job-0" in notes


def test_a_damaged_or_foreign_note_is_read_as_none(home: Path, tmp_path: Path) -> None:
    home.mkdir(mode=0o700)
    (home / lastrun.FILE).write_text("{not json")
    assert lastrun.recall("demo") is None
    lastrun.remember(["demo"], "slurm", [], "torchjob run")  # written anew
    assert lastrun.recall("demo") == ("slurm", [], "torchjob run")
    (home / lastrun.FILE).write_text(json.dumps({"demo": {"engine": 3, "flags": "x"}}))
    assert lastrun.recall("demo") is None
    # Never read through a symlink; a start replaces the link, not what it points to.
    planted = tmp_path / "planted.json"
    planted.write_text(json.dumps({"demo": {"engine": "slurm", "flags": ["--job-root", "/evil"]}}))
    (home / lastrun.FILE).unlink()
    (home / lastrun.FILE).symlink_to(planted)
    assert lastrun.recall("demo") is None
    lastrun.remember(["other"], "local", [], "torchjob run")
    assert not (home / lastrun.FILE).is_symlink()
    assert json.loads(planted.read_text())["demo"]["flags"] == ["--job-root", "/evil"]


JOB = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: far}
spec:
  tasks:
    - replicas: 1
      name: main
      template:
        spec:
          restartPolicy: Never
          containers: [{name: main, image: busybox:1.36, command: [sh, -c, "echo hi"]}]
"""


def test_status_of_a_cluster_job_without_its_engine_says_where_it_is(
    home: Path, tmp_path: Path, api: FakeKubeAPI, kubeconfig: str, capfd: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("kubernetes")
    job = tmp_path / "far.yaml"
    job.write_text(JOB)
    assert main(["submit", str(job), "--target", "volcano", "--kubeconfig", kubeconfig]) == 0
    capfd.readouterr()
    for command in ("status", "logs", "wait"):
        assert main([command, "far"]) == 2
        err = capfd.readouterr().err
        assert err == (
            f"torchjob: no local job 'far' in {home / 'jobs'}; a kubernetes job 'far' was last started "
            f"by torchjob submit: torchjob {command} far --engine kubernetes --kubeconfig {kubeconfig}\n"
        )
    suggested = err.rsplit(": torchjob ", 1)[1]
    assert main(["status", *shlex.split(suggested)[1:]]) == 0  # the command said finds it
    assert capfd.readouterr().out.startswith("job default/far: ")


@pytest.mark.torch
@pytest.mark.timeout(120)
def test_the_jobs_of_sdk_calls_stay_out_of_the_status_listing(
    home: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    from torchjob import PyTorch, Worker, task

    @task(task_config=PyTorch(worker=Worker(replicas=1)))
    def rank() -> int:
        return int(os.environ["RANK"])

    assert rank() == 0
    calls = home / "calls"
    assert main(["status"]) == 0  # not listed; said where they are
    assert (
        capfd.readouterr().out
        == f"no local jobs\n(1 job of Python calls: torchjob status --state-dir {calls})\n"
    )
    assert main(["status", "--state-dir", str(calls)]) == 0
    (row,) = capfd.readouterr().out.splitlines()[1:]
    job_id, phase = row.split()[:2]
    assert phase == "Completed"
    assert main(["logs", job_id]) == 2
    assert capfd.readouterr().err == (
        f"torchjob: no local job '{job_id}' in {home / 'jobs'}; a job '{job_id}' was last started by a "
        f"Python call: torchjob logs {job_id} --state-dir {calls}\n"
    )
