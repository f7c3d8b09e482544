"""``torchjob run --dry-run``: the plan, and what ``run`` would refuse it with, as ``run`` says it.

A job that ``run`` refuses before it starts anything (exit 2, one line per problem at the job
file's line) is refused alike by its dry run, after the plan is printed: a script that checks a
job with ``--dry-run`` gets the exit code the run would give. A job ``run`` accepts still dry-runs
with exit 0. Nothing is started or written either way. In-process (conftest's ``run_main``): the
runs here are all refused before a job directory is made.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from support import Ran

Run = Callable[..., Ran]

JOB = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: dry}
spec:
  tasks:
    - name: w
      replicas: REPLICAS
      template:
        spec:
          containers:
            - name: c
              image: x
              command: ["true"]
"""


def _write(tmp_path: Path, replicas: int, extra: str = "", name: str = "job.yaml") -> str:
    (tmp_path / name).write_text(JOB.replace("REPLICAS", str(replicas)) + extra)
    return name


def _nothing_made(home: Path) -> None:
    assert not home.exists() or not any(home.rglob("*")), sorted(home.rglob("*"))


def _refused_alike(run_main: Run, tmp_path: Path, *argv: str) -> Ran:
    """The dry run of ``argv`` and the run: both exit 2 with the same words on stderr; the dry
    run's plan on stdout. The dry run's result."""
    dry = run_main("run", "--dry-run", *argv, cwd=tmp_path)
    real = run_main("run", *argv, cwd=tmp_path)
    assert real.returncode == 2, real
    assert dry.returncode == 2, dry
    assert dry.stderr == real.stderr, (dry.stderr, real.stderr)
    assert "Traceback" not in dry.stderr
    assert "cannot run here" not in dry.stdout  # said once, as the run says it
    return dry


def test_a_job_too_large_for_this_machine_dry_runs_as_run_refuses_it(
    run_main: Run, tmp_path: Path, home: Path
) -> None:
    """40,000 pods against the local engine's limit of 32,768 processes: the plan (no pod, none
    is planned) and the run's one line, at the file's line, exit 2."""
    name = _write(tmp_path, 40_000)
    dry = _refused_alike(run_main, tmp_path, name)
    assert dry.stdout.startswith("local job dry: 40000 pod(s) on this machine\n"), dry.stdout
    assert "\npod " not in dry.stdout
    assert dry.stderr.startswith("job.yaml:5: spec.tasks: the job has 40000 pods; expected at most ")
    assert dry.stderr.count("\n") == 1, dry.stderr
    _nothing_made(home)


def test_a_container_that_cannot_run_here_dry_runs_with_its_field_and_line(
    run_main: Run, tmp_path: Path, home: Path
) -> None:
    (tmp_path / "job.yaml").write_text(
        JOB.replace("REPLICAS", "2").replace(
            'command: ["true"]', 'workingDir: /no/such/dir\n              command: ["true"]'
        )
    )
    dry = _refused_alike(run_main, tmp_path, "job.yaml")
    assert "\npod dry-w-1\n" in dry.stdout, dry.stdout  # the plan, every pod of it
    assert dry.stderr.startswith("job.yaml:13: spec.tasks[0].template.spec.containers[0].workingDir: "), (
        dry.stderr
    )
    assert "'/no/such/dir' does not exist here" in dry.stderr and dry.stderr.count("\n") == 1
    _nothing_made(home)


def test_the_local_queue_refuses_under_dry_run_as_it_does_a_run(
    run_main: Run, tmp_path: Path, home: Path, queue_env: Path
) -> None:
    """A job that asks for resources goes through the local queue, which refuses a queue it does
    not have: said by the dry run too; with --no-queue the job is not queued, and runs."""
    resources = "              resources: {requests: {cpu: '1'}}\n"
    name = _write(tmp_path, 1, resources)
    text = (tmp_path / name).read_text().replace("spec:\n  tasks:", "spec:\n  queue: nosuch\n  tasks:")
    (tmp_path / name).write_text(text)
    dry = _refused_alike(run_main, tmp_path, name)
    assert dry.stderr.startswith("job.yaml:5: spec.queue: no local queue 'nosuch' (queues: default"), (
        dry.stderr
    )
    assert dry.stderr.count("\n") == 1
    unqueued = run_main("run", "--dry-run", "--no-queue", name, cwd=tmp_path)
    assert unqueued.returncode == 0 and unqueued.stderr == "", unqueued
    _nothing_made(home)
    assert not any((queue_env / "runtime").iterdir())  # no queue state made, no lock file


def test_a_state_directory_run_cannot_use_is_refused_by_the_dry_run(
    run_main: Run, tmp_path: Path, home: Path
) -> None:
    name = _write(tmp_path, 1)
    (tmp_path / "state").write_text("a file, not a directory\n")
    dry = _refused_alike(run_main, tmp_path, "--state-dir", "state", name)
    assert dry.stderr == "torchjob: --state-dir state: state is not a directory\n", dry.stderr


def test_a_job_run_accepts_dry_runs_with_exit_0(run_main: Run, tmp_path: Path, home: Path) -> None:
    name = _write(tmp_path, 2)
    dry = run_main("run", "--dry-run", name, cwd=tmp_path)
    assert dry.returncode == 0, dry
    assert dry.stderr == ""
    assert dry.stdout.startswith("local job dry: 2 pod(s) on this machine\n")
    assert "\npod dry-w-0\n  c: true\npod dry-w-1\n  c: true" in dry.stdout, dry.stdout
    _nothing_made(home)


# --- the Slurm engine --------------------------------------------------------------------------------


@pytest.fixture
def no_allocation(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Outside any Slurm allocation, whatever runs the tests; the engine's jobs under tmp_path;
    a slurm.conf that is not there, so that no cluster's MaxStepCount replaces Slurm's default."""
    for name in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_HET_SIZE", "SLURM_TASKS_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("SLURM_JOB_CPUS_PER_NODE", raising=False)
    monkeypatch.delenv("TORCHJOB_SLURM_NEW_ALLOCATION", raising=False)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-slurm.conf"))
    root = tmp_path / "slurm-jobs"
    monkeypatch.setenv("TORCHJOB_SLURM_JOB_ROOT", str(root))
    return root


def test_a_job_of_more_steps_than_slurm_allows_is_refused_by_its_dry_run(
    run_main: Run, tmp_path: Path, home: Path, no_allocation: Path
) -> None:
    """Slurm's own limit (MaxStepCount) stops the plan itself: the run's one line, exit 2, and no
    plan (it cannot be made)."""
    name = _write(tmp_path, 40_001)
    dry = _refused_alike(run_main, tmp_path, "--engine", "slurm", name)
    assert dry.stdout == ""
    assert dry.stderr.startswith("job.yaml:5: spec.tasks: the job has 40001 pods, each a job step; "), (
        dry.stderr
    )
    assert dry.stderr.count("\n") == 1
    assert not no_allocation.exists()


def test_an_allocation_too_small_for_the_job_is_refused_by_the_dry_run(
    run_main: Run, tmp_path: Path, home: Path, no_allocation: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside an allocation (salloc) a run checks, from its variables alone, that the job's pods
    fit its tasks; the dry run says the same line. One task more, and it dry-runs with exit 0."""
    name = _write(tmp_path, 3)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2")
    dry = run_main("run", "--dry-run", "--engine", "slurm", name, cwd=tmp_path)
    assert dry.returncode == 2, dry
    assert "# inside allocation 77: no sbatch" in dry.stdout, dry.stdout
    assert dry.stderr == (
        "torchjob: allocation 77 has 2 task(s) (SLURM_TASKS_PER_NODE=2) and the job 3 pods, one task "
        "each: ask salloc for one task per pod, or run with --new-allocation (salloc -n 3 ...)\n"
    ), dry.stderr
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "3")
    fits = run_main("run", "--dry-run", "--engine", "slurm", name, cwd=tmp_path)
    assert fits.returncode == 0 and fits.stderr == "", fits
    assert not no_allocation.exists()
