"""Issue 19's messages that point at the fix, through the real CLI: each mistake is refused (or told)
in one line that says what to do instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_local_support import container, make_job, sh, task, write_job

pytestmark = pytest.mark.timeout(120)


def _cli(
    tmp_path: Path, *args: str, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TORCHJOB_HOME": str(tmp_path / "home")}
    return subprocess.run(
        [sys.executable, "-m", "torchjob", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or tmp_path,
    )


def _jobs(tmp_path: Path) -> list[str]:
    root = tmp_path / "home" / "jobs"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def test_a_misspelt_preload_module_is_refused_before_the_job_starts(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "mylib.py").write_text("VALUE = 1\n")  # beside the program: the server finds it there
    (work / "main.py").write_text("import mylib\nprint('value', mylib.VALUE)\n")
    job = make_job("pre", [task("main", [container("app", ["python", "main.py"], workingDir=str(work))])])
    file = write_job(tmp_path, job)
    for modules, hint in (("troch", "'torch'"), ("json,torch.distribted", "'torch.distributed'")):
        proc = _cli(tmp_path, "run", "--preload", modules, file)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("<command line>: --preload: no module named"), lines
        assert f"for {sys.executable}; did you mean {hint}?" in lines[0], lines
        assert proc.stdout == "" and _jobs(tmp_path) == []  # nothing started, nothing written
    proc = _cli(tmp_path, "run", "-q", "--preload", "json,mylib,os.path", file)
    assert proc.returncode == 0, proc.stdout + proc.stderr
