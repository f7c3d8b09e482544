"""What `delete`, `status` and `--all` may touch under a Slurm job root: only job directories torchjob
made, in a root it marked, named by a reference that picks one job (engine_api/jobdirs.py, the rules
the local engine follows too). No Slurm is needed: these jobs never reached it (no slurm.json), as a
job whose sbatch has not answered yet."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support import unremovable
from torchjob.cli import main
from torchjob.engine_api import jobdirs

pytestmark = pytest.mark.timeout(60)


def make_job(root: Path, job_id: str, started: float = 0.0) -> Path:
    """A job directory as the engine makes one before sbatch: job.json and options.json."""
    root.mkdir(mode=0o700, exist_ok=True)
    jobdirs.mark_root(root)
    job_dir = root / job_id
    job_dir.mkdir(mode=0o700)
    (job_dir / "job.json").write_text("{}\n")
    (job_dir / "options.json").write_text(json.dumps({"id": job_id}) + "\n")
    if started:
        os.utime(job_dir / "options.json", (started, started))
    return job_dir


@pytest.fixture(autouse=True)
def own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchjob's own notes (where jobs were last started) are this test's, not the user's."""
    monkeypatch.setenv("TORCHJOB_HOME", str(tmp_path / "home"))
    for name in [n for n in os.environ if n.startswith("TORCHJOB_SLURM_")]:
        monkeypatch.delenv(name)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main([*args, "--engine", "slurm"])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_folder_that_is_not_a_job_is_never_deleted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A project directory given as --job-root by mistake: its data has an options.json too.
    project = tmp_path / "proj"
    data = project / "data-v2"
    data.mkdir(parents=True)
    (data / "options.json").write_text("{}")
    (data / "dataset.bin").write_bytes(b"precious")
    code, _, err = cli(capsys, "delete", "data", "--job-root", str(project))
    assert code == 2
    assert err == (
        f"torchjob: {project} is not a torchjob state directory (torchjob writes .torchjob-state into "
        "each one it keeps jobs in); refusing to delete anything there (if it holds jobs of an older "
        f"torchjob, create {project / '.torchjob-state'})\n"
    )
    assert cli(capsys, "delete", "--all", "--job-root", str(project))[0] == 2
    assert (data / "dataset.bin").read_bytes() == b"precious"
    # In a root of torchjob's, a folder that is not a job is neither listed nor removed.
    root = tmp_path / "root"
    job = make_job(root, "train-0a1b2c")
    stray = root / "data-v2"
    stray.mkdir()
    (stray / "options.json").write_text("{}")
    (stray / "job.json").write_text("{}")
    code, out, _ = cli(capsys, "delete", "data", "--job-root", str(root))
    assert code == 2
    code, out, _ = cli(capsys, "delete", "--all", "--job-root", str(root))
    assert (code, out) == (0, "deleted train-0a1b2c\n")
    assert stray.is_dir() and not job.exists()


def test_a_reference_must_pick_one_job_to_delete(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "root"
    old = make_job(root, "train-111111", started=1000.0)
    new = make_job(root, "train-222222", started=2000.0)
    worker = make_job(root, "worker-333333")
    flags = ("--job-root", str(root))
    # One letter picks by chance: too short to delete by.
    code, _, err = cli(capsys, "delete", "w", *flags)
    assert code == 2 and "'w' is too short a prefix to pick a job by" in err and "nothing was deleted" in err
    # A name two jobs have: which is meant is not guessed.
    code, _, err = cli(capsys, "delete", "train", *flags)
    assert code == 2
    assert "job 'train' names 2 jobs (train-222222, train-111111, newest first): give the id of one" in err
    assert old.exists() and new.exists() and worker.exists()
    # Reading by name takes the newest, as before.
    code, out, _ = cli(capsys, "status", "train", "-o", "json", *flags)
    assert code == 0 and json.loads(out)["id"] == "train-222222"
    assert cli(capsys, "delete", "train-222222", "work", *flags)[:2] == (
        0,
        "deleted train-222222\ndeleted worker-333333\n",
    )
    # Now one job has the name: the name deletes it.
    assert cli(capsys, "delete", "train", *flags)[:2] == (0, "deleted train-111111\n")
    code, _, err = cli(capsys, "status", "train", *flags)
    assert (code, err) == (2, f"torchjob: no slurm job 'train' in {root}\n")


def test_delete_names_what_it_could_not_remove(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Removal is checked, not assumed (engine_api/jobdirs.py, as on the local engine): a job whose
    directory stays in part is not said deleted; delete names where what is left is (exit 2), and
    the job, renamed aside first, is listed no more."""
    root = tmp_path / "root"
    stuck = make_job(root, "train-0a1b2c")
    other = make_job(root, "eval-0d1e2f")
    flags = ("--job-root", str(root))
    with unremovable(stuck):
        code, out, err = cli(capsys, "delete", "train-0a1b2c", "eval-0d1e2f", *flags)
        assert (code, out) == (2, ""), err
        (left,) = root.glob(".train-0a1b2c.removed-*")
        assert err == f"torchjob: train-0a1b2c: {left} could not be removed (deleted: eval-0d1e2f)\n"
        assert not stuck.exists() and not other.exists()
        assert (left / "logs" / "stuck").is_dir()
        assert not (left / "job.json").exists()  # all the rest is gone
        code, out, _ = cli(capsys, "status", *flags)
        assert code == 0 and "train-0a1b2c" not in out, out
    assert jobdirs.remove(left) is None
    assert sorted(p.name for p in root.iterdir()) == [jobdirs.ROOT_MARKER]


def test_a_job_past_its_ttl_that_stays_in_part_is_listed_no_more(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A finished job past its ttlSecondsAfterFinished is removed by the first command that looks,
    checked: what stays of it is renamed aside, so that no half-removed job is listed, and -v
    says where it is."""
    root = tmp_path / "root"
    stuck = make_job(root, "train-0a1b2c")
    (stuck / "expires").write_text("1.0\n")
    flags = ("--job-root", str(root))
    with unremovable(stuck):
        code, out, err = cli(capsys, "-v", "status", *flags)
        assert code == 0 and "train-0a1b2c" not in out, out
        (left,) = root.glob(".train-0a1b2c.removed-*")
        assert f"train-0a1b2c: {left} could not be removed" in err, err
    assert jobdirs.remove(left) is None
