"""Issue 11's conveniences through the real CLI: validate --local, overrides, quick mode, housekeeping."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)


def _cli(
    tmp_path: Path, *args: str, timeout: float = 60, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TORCHJOB_HOME": str(tmp_path / "home")}
    env.pop("NO_COLOR", None)
    return subprocess.run(
        [sys.executable, "-m", "torchjob", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or tmp_path,
    )


BROKEN = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: broken}
spec:
  tasks:
    - name: main
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          containers:
            - name: nocmd
              image: busybox
              env:
                - name: TOKEN
                  valueFrom: {secretKeyRef: {name: s, key: k}}
            - name: nodir
              image: busybox
              command: [sh, -c, "true"]
              workingDir: /no/such/dir/anywhere
            - name: noscript
              image: busybox
              command: [python3, -u]
              args: [missing_train.py, --lr, "0.1"]
"""


def test_validate_local_and_run_report_every_local_problem_at_once(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(BROKEN)
    plain = _cli(tmp_path, "validate", "job.yaml")
    assert plain.returncode == 0, plain.stderr  # the job itself is valid
    for args in (("validate", "--local", "job.yaml"), ("run", "job.yaml")):
        proc = _cli(tmp_path, *args)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = proc.stderr.splitlines()
        where = "job.yaml:{}: spec.tasks[0].template.spec.containers[{}]"
        expected = [
            (where.format(12, 0) + ".command:", "has no command"),
            (where.format(16, 0) + ".env[0].valueFrom.secretKeyRef:", "Secrets are not available"),
            (where.format(20, 1) + ".workingDir:", "does not exist here"),
            (where.format(24, 2) + ".args[0]:", "'missing_train.py' does not exist"),
        ]
        for start, text in expected:
            assert any(line.startswith(start) and text in line for line in lines), (start, lines)
        assert not (tmp_path / "home" / "jobs").exists() or not list((tmp_path / "home" / "jobs").iterdir())


def test_a_script_that_exists_in_the_working_directory_passes(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('trained')\n")
    job = BROKEN.split("          containers:")[0] + (
        "          containers:\n"
        "            - name: main\n"
        "              image: x\n"
        f"              workingDir: {tmp_path / 'code'}\n"
        "              command: [python, -X, dev, train.py]\n"
    )
    (tmp_path / "job.yaml").write_text(job)
    proc = _cli(tmp_path, "validate", "--local", "job.yaml")
    assert proc.returncode == 0, proc.stderr
    proc = _cli(tmp_path, "run", "job.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "trained" in proc.stdout
