"""A job whose directory is removed while it runs (a user's ``rm -rf``, a test's tmp dir cleaned)
ends: its supervisor notices on its next scan, stops every pod and ends itself, with no
traceback, and writes nothing where the directory was. A real job, real processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_local_support import container, leftovers, make_job, sh, task, wait_until
from torchjob.spec.manifest import job_manifest

pytestmark = pytest.mark.timeout(60)


def _running(job_dir: Path) -> bool:
    try:
        return bool(json.loads((job_dir / "status.json").read_text())["phase"] == "Running")
    except (OSError, ValueError, KeyError):
        return False


def test_a_job_whose_directory_is_removed_stops_with_all_its_processes(tmp_path: Path) -> None:
    job = make_job(
        "vanishing",
        [
            task("master", [container("main", sh("echo up; setsid sleep 300 & sleep 300"))]),
            task("worker", [container("stubborn", sh("trap '' TERM; echo up; sleep 300"))]),
        ],
    )
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job_manifest(job)))
    home = tmp_path / "home"
    out = tmp_path / "out.txt"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "torchjob", "run", "--no-prewarm", str(path)],
            env={**os.environ, "TORCHJOB_HOME": str(home)},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        jobs = home / "jobs"
        assert wait_until(lambda: jobs.is_dir() and any(jobs.iterdir()), 15), out.read_text()
        job_dir = next(jobs.iterdir())
        assert wait_until(lambda: len(leftovers(job_dir.name)) >= 4, 15), out.read_text()
        assert wait_until(lambda: _running(job_dir), 15), out.read_text()
        shutil.rmtree(job_dir)
        removed = time.monotonic()
        code = proc.wait(timeout=20)
        took = time.monotonic() - removed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    text = out.read_text()
    assert code == 1, text
    assert wait_until(lambda: not leftovers(job_dir.name), 5), [p.cmdline() for p in leftovers(job_dir.name)]
    assert "was removed" in text and "Traceback" not in text, text
    assert not job_dir.exists(), "nothing is written where the job's directory was"
    # Noticed within a scan (0.5 s); the stubborn pod then gets its grace (2 s here) before the
    # SIGKILL; the rest is the machine's load.
    assert took < 15, took
