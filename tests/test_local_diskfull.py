"""A full disk under the job directory: one clear error, a final status, a job that can be deleted.

Each test mounts a 1 MB tmpfs as ``$TORCHJOB_HOME`` (root only) and fills it, from the job's
own program or before the run starts.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import container, leftovers, make_job, sh, task, torchjob
from torchjob.spec.manifest import job_manifest

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root"),
]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mount)], check=False
    )
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)
        if os.path.ismount(mount):
            subprocess.run(["umount", "-l", str(mount)], check=False)


def _job_file(tmp_path: Path, script: str) -> str:
    job = make_job("full", [task("main", [container("app", sh(script))])])
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job_manifest(job)))
    return str(path)


def _fill(disk: Path) -> None:
    """Leave no free block on ``disk``."""
    with open(disk / "filler", "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass


def _every_job_dir_is_visible(home: Path) -> None:
    """No directory that `status` cannot see, so that `delete` cannot remove."""
    jobs = home / "jobs"
    hidden = [p.name for p in jobs.iterdir() if not (p / "status.json").exists()] if jobs.is_dir() else []
    assert hidden == []


def test_a_job_that_fills_the_disk_gets_a_final_status_and_can_be_deleted(
    tmp_path: Path, small_disk: Path
) -> None:
    home = small_disk / "home"
    # 3 MB of output into a 1 MB disk: the log fills it and the status can no longer grow.
    run = torchjob(
        "run",
        _job_file(tmp_path, "yes 0123456789012345678901234567890123456789 | head -c 3000000"),
        home=home,
    )
    assert "Traceback" not in run.stdout + run.stderr, run.stderr
    assert run.returncode == 1
    listed = torchjob("status", "-o", "json", home=home)
    assert listed.returncode == 0, listed.stderr
    (job,) = json.loads(listed.stdout)["items"]
    # Failed whichever write the full disk stopped first: the program's log (its exit code 1) or
    # torchjob's own records (it stops the job); the final phase is kept in status.json's room.
    assert job["phase"] == "Failed", job
    assert leftovers(job["id"]) == []
    deleted = torchjob("delete", job["id"], home=home)
    assert deleted.returncode == 0, deleted.stderr
    assert not (home / "jobs" / job["id"]).exists()


@pytest.mark.parametrize("detach", [False, True], ids=["run", "run-detach"])
def test_a_job_on_a_full_disk_is_refused_in_one_line_and_leaves_nothing_unseen(
    tmp_path: Path, small_disk: Path, detach: bool
) -> None:
    home = small_disk / "home"
    (home / "jobs").mkdir(parents=True)
    _fill(small_disk)
    run = torchjob("run", *(["--detach"] if detach else []), _job_file(tmp_path, "echo hello"), home=home)
    assert run.returncode == 1, run.stdout + run.stderr  # not 0: no job started
    assert "Traceback" not in run.stdout + run.stderr
    said = run.stderr if detach else run.stdout
    assert "No space left on device" in said, said
    if detach:
        assert run.stdout == ""  # no job id for a job that does not exist
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    _every_job_dir_is_visible(home)
    kept = [p.name for p in (home / "jobs").iterdir() if p.name != "filler"]
    for line in (run.stdout + run.stderr).splitlines():  # no path to logs that are not there
        if "logs" in line and str(home / "jobs") in line:
            assert any(job in line for job in kept), line
    listed = json.loads(torchjob("status", "-o", "json", home=home).stdout)["items"]
    for job in listed:  # a job that could record why it never ran is there to read and delete
        assert job["phase"] == "Failed" and "No space left on device" in job["reason"]
        assert torchjob("delete", job["id"], home=home).returncode == 0


def test_a_status_too_long_for_its_room_on_a_full_disk_is_refused_whole(small_disk: Path) -> None:
    """Rewritten in place on a full disk, a longer report would be cut at the file's old size:
    status.json then holds neither report (a damaged file, phase Unknown). It is refused before
    anything is written, and the report kept is the last one whole."""
    from torchjob.engines.local.state import JobDir
    from torchjob.reports import Event, JobReport

    where = JobDir(small_disk / "full-abc123")
    where.path.mkdir()
    where.write_status(JobReport(engine="local", id=where.id, name="full", phase="Running"))
    _fill(small_disk)
    events = [Event(float(i), "x" * 400) for i in range(50)]  # some 25 kB: past the 8 kB kept
    longer = JobReport(engine="local", id=where.id, name="full", phase="Failed", events=events)
    with pytest.raises(OSError):
        where.write_status(longer)
    assert where.read_status_checked()[1] is None  # not damaged
    assert where.read_status().phase == "Running"


def test_the_final_status_on_a_full_disk_keeps_the_final_phase_without_its_events(
    tmp_path: Path, small_disk: Path
) -> None:
    """The last write of a job whose events outgrew the room status.json holds, on a full disk:
    the final phase and reason are kept (without the events), not the phase written before."""
    from torchjob.engines.local.state import JobDir
    from torchjob.engines.local.supervisor import Supervisor
    from torchjob.lifecycle import JobPhase, JobStatus

    job = make_job("full", [task("main", [container("app", sh("true"))])])
    where = JobDir(small_disk / "full-abc123")
    where.path.mkdir()
    supervisor = Supervisor(job, where, console=None, echo_logs=False, timeout=None, extra_env={})
    status = supervisor.status_file
    status.write(must=True)  # as before any pod: Pending
    _fill(small_disk)
    for i in range(50):
        supervisor.notes.record(f"warning {i}: " + "x" * 400)
    supervisor.ctl.status = JobStatus(JobPhase.FAILED, 0, 1, "pod main-0 failed")
    assert status.write_final() == ""
    assert not status.removed
    report, damage = where.read_status_checked()
    assert damage is None
    assert (report.phase, report.reason) == ("Failed", "pod main-0 failed")
    assert report.events == []


def test_a_directory_that_cannot_be_removed_is_said_to_be_left(tmp_path: Path, small_disk: Path) -> None:
    """The removal is checked, not assumed: a directory that stays (here: a file system mounted
    inside it) is named where it was left, for the job's end to say so."""
    from torchjob.engines.local.state import JobDir

    where = JobDir(tmp_path / "jobs" / "stuck-abc123")
    inner = where.path / "logs" / "mounted"
    inner.mkdir(parents=True)
    (where.path / "status.json").write_text("{}")
    subprocess.run(["mount", "--bind", str(small_disk), str(inner)], check=True)
    try:
        left = where.remove(timeout=0.2)
        assert left is not None and left.is_dir(), left
        assert not where.path.exists()  # renamed aside first: the path is free at once
        assert (left / "logs" / "mounted").is_mount()
        assert not (left / "status.json").exists()  # all the rest is gone
    finally:
        mounted = next(tmp_path.glob("jobs/.stuck-abc123.removed-*/logs/mounted"), inner)
        subprocess.run(["umount", str(mounted)], check=False)
    assert JobDir(left).remove() is None
    assert list((tmp_path / "jobs").iterdir()) == []
