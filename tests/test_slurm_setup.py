"""A job whose setup cannot work on this Slurm is one clear line, exit 2, and leaves nothing: a job
root the compute node does not share, a request beyond the partition's limits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_cluster import SlurmCluster, why_not
from test_slurm_engine import cli_env, job_dirs, job_file, status_json, task, torchjob

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


@pytest.fixture
def apart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SlurmCluster, Path]]:
    """A cluster whose node does not share a directory with this host (the login node), and that
    directory: the node sees an empty filesystem there."""
    reason = why_not()
    if reason is not None:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("slurm")
    local = base / "local"
    local.mkdir(mode=0o700)
    cluster = SlurmCluster(base / "cluster", unshared=local, tied=True)
    try:
        yield cluster.start(), local
    finally:
        cluster.stop()


def test_a_job_root_the_batch_host_does_not_share_is_one_line(
    apart: tuple[SlurmCluster, Path], tmp_path: Path
) -> None:
    slurm, local = apart
    root = local / "root"
    env = cli_env(slurm, root)
    path = job_file(tmp_path, [task("w", "print('never')")])
    done = torchjob(env, "run", str(path), "--engine", "slurm")
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()[-1:]
    assert line.startswith("torchjob: the job directory " + str(root)), done.stderr
    assert f"is not on the batch host {slurm.host}: the job root {root} must be on a filesystem" in line
    assert "Traceback" not in done.stderr
    assert job_dirs(root) == []  # nothing left behind
    assert slurm.jobs() == []
    # Submitted, the job's status says the same once Slurm ended it.
    done = torchjob(env, "submit", str(path), "--engine", "slurm")
    assert done.returncode == 0, done.stderr
    waited = torchjob(env, "wait", "sj", "--engine", "slurm", "--timeout", "60")
    assert waited.returncode == 1, waited.stdout + waited.stderr
    status = status_json(env, "sj")
    assert status["phase"] == "Failed"
    assert f"is not on the batch host {slurm.host}" in str(status["reason"])


def test_a_shared_job_root_runs(apart: tuple[SlurmCluster, Path], tmp_path: Path) -> None:
    slurm, _ = apart
    env = cli_env(slurm, tmp_path / "root")  # the node sees this one
    path = job_file(tmp_path, [task("w", "print('ran here')")])
    done = torchjob(env, "run", str(path), "--engine", "slurm")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "w-0 | ran here" in done.stdout


@pytest.mark.parametrize(
    ("enforced", "ask", "said"),
    [
        # Without EnforcePartLimits, sbatch accepts the job and Slurm keeps it pending for ever
        # (the time limit's reason is PartitionTimeLimit or PartitionConfig, by the pass that saw it).
        (False, "time", "Slurm will not start job 1 as asked: Partition"),
        (False, "cpu", "Slurm will not start job 1 as asked: PartitionConfig (no node of the partition"),
        # With it, sbatch refuses the job and says why.
        (True, "time", "sbatch failed: Batch job submission failed: Requested time limit is invalid"),
    ],
)
def test_a_request_beyond_the_partitions_limits_is_one_line(
    slurm: SlurmCluster, tmp_path: Path, enforced: bool, ask: str, said: str
) -> None:
    if enforced:
        with open(slurm.conf, "a") as conf:
            conf.write("EnforcePartLimits=ALL\n")
        assert slurm.run("scontrol", "reconfigure").returncode == 0
    limit = slurm.run("scontrol", "update", f"partitionname={slurm.partition}", "maxtime=2")
    assert limit.returncode == 0, limit.stderr
    env = cli_env(slurm, tmp_path / "root")
    pod = task("w", "print('never')")
    args = ["--time-limit", "5"] if ask == "time" else []
    if ask == "cpu":  # more than the node's 8
        pod["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "16"}}  # type: ignore[index]
    path = job_file(tmp_path, [pod])
    done = torchjob(env, "run", str(path), "--engine", "slurm", *args, timeout=90)
    assert done.returncode == 2, done.stdout + done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("torchjob: " + said), done.stderr
    assert "Traceback" not in done.stderr
    assert job_dirs(tmp_path / "root") == []
    assert slurm.jobs() == []
