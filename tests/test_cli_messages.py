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


ENV_JOB = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: envjob}
spec:
  plugins:
    pytorch: ["--master=master", "--worker=worker"]
  tasks:
    - name: master
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          containers:
            - name: master
              image: busybox:1.36
              command: ["sh", "-c", "echo port $MASTER_PORT"]
              env:
                - {name: MASTER_PORT, value: "29500"}
                - {name: OTHER, value: "1"}
    - name: worker
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          containers:
            - name: worker
              image: busybox:1.36
              command: ["sh", "-c", "true"]
              env:
                - {name: MASTER_ADDR, value: localhost}
                - {name: RANK, value: "1"}
    - name: extra
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          containers:
            - name: extra
              image: busybox:1.36
              command: ["sh", "-c", "true"]
              env:
                - {name: RANK, value: "7"}
"""


def test_env_the_pytorch_plugin_overrides_is_warned_of_by_validate_render_and_run(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(ENV_JOB)
    expected = [
        "job.yaml:18: spec.tasks[0].template.spec.containers[0].env[0]: warning: the pytorch plugin sets "
        "MASTER_PORT to its --port (23456) after this entry, which is ignored; remove it, or set the port "
        "with --port=N in spec.plugins.pytorch",
        "job.yaml:30: spec.tasks[1].template.spec.containers[0].env[0]: warning: the pytorch plugin sets "
        "MASTER_ADDR to the master pod's address after this entry, which is ignored; remove it",
        "job.yaml:31: spec.tasks[1].template.spec.containers[0].env[1]: warning: the pytorch plugin sets "
        "RANK to each pod's rank (master 0, workers 1 to N) after this entry, which is ignored; remove it",
    ]  # the extra task's RANK is its own: the plugin gives a task that is neither master nor worker none
    for command in (["validate"], ["render"], ["run", "-q"]):
        proc = _cli(tmp_path, *command, "job.yaml")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stderr.splitlines() == expected, proc.stderr
    log = next((tmp_path / "home" / "jobs").glob("envjob-*/logs/envjob-master-0/attempt-0/master.log"))
    assert log.read_text() != "port 29500\n"  # what the warning says: the plugin's value wins (maybe remapped)


WORKSPACE_JOB = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: ws}
spec:
  tasks:
    - name: main
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          initContainers:
            - name: prep
              image: busybox:1.36
              workingDir: /workspace/data
              command: ["sh", "-c", "pwd"]
          containers:
            - name: main
              image: busybox:1.36
              workingDir: /workspace
              command: ["python", "/workspace/train.py"]
              args: ["--out", "/workspace/out", "/workspacex"]
"""


def test_workdir_maps_a_jobs_own_working_directory_and_the_error_says_how(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(WORKSPACE_JOB)
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "train.py").write_text("import os, sys\nprint('cwd', os.getcwd(), sys.argv[1:])\n")
    # A plain --workdir is for containers without a working directory: the error says what works.
    refused = _cli(tmp_path, "run", "--workdir", "project", "job.yaml")
    assert refused.returncode == 2 and _jobs(tmp_path) == [], refused.stdout + refused.stderr
    assert (
        "job.yaml:19: spec.tasks[0].template.spec.containers[0].workingDir: container 'main': working "
        "directory '/workspace' does not exist here; --workdir /workspace=DIR runs it in a local DIR instead"
    ) in refused.stderr.splitlines(), refused.stderr
    ran = _cli(tmp_path, "run", "--workdir", "/workspace=project", "job.yaml")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"main-0/prep | {project / 'data'}" in ran.stdout, ran.stdout  # below it: the same place
    # The script's path is mapped too; an argument that only begins with the same letters is not.
    assert f" | cwd {project} ['--out', '{project / 'out'}', '/workspacex']" in ran.stdout
    missing = _cli(tmp_path, "run", "--workdir", "/workspace=nowhere", "job.yaml")
    assert (
        missing.returncode == 2
        and missing.stderr == "<command line>: --workdir: 'nowhere' is not a directory\n"
    )
