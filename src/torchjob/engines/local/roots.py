"""The state root: where a user's local jobs live, a new job's directory there, and which of the
directories there are jobs.

The root is ``RunOptions.state_dir`` (``--state-dir``), else ``$TORCHJOB_HOME/jobs``, else
``~/.torchjob/jobs``; torchjob marks any other root it uses with ``<root>/.torchjob-state``. A
root may be any directory the user names, so only what torchjob made counts as a job
(:func:`is_job_dir`: the ``<name>-<6 hex>`` pattern, this user's, a ``status.json`` of its own),
and nothing is removed from a root without torchjob's marker (:func:`is_state_root`); finished
jobs whose ``ttlSecondsAfterFinished`` passed are removed by the first command that looks
(:func:`collect_expired`). A job directory's own layout is :mod:`.state`'s.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from torchjob import logs
from torchjob.engine_api import jobdirs
from torchjob.engine_api.jobdirs import ROOT_MARKER, mark_root
from torchjob.engine_api.jobdirs import owned as _own
from torchjob.engines.local.state import DIR_MODE, JobDir, make_private_dirs

__all__ = ["ROOT_MARKER", "collect_expired", "is_job_dir", "is_state_root", "list_jobs", "new_job_dir"]


def state_root(explicit: Path | None = None) -> Path:
    if explicit is not None:
        return Path(explicit)
    home = os.environ.get("TORCHJOB_HOME")
    return (Path(home) if home else Path.home() / ".torchjob") / "jobs"


def new_job_dir(root: Path, job_name: str) -> JobDir:
    """A fresh, uniquely named directory ``<job-name>-<6 hex>``, 0700 as is the root."""
    make_private_dirs(root)
    if root != state_root():  # the default root is torchjob's own, marked or not
        mark_root(root)
    info = root.stat()
    if root == state_root() and info.st_uid == os.getuid() and info.st_mode & 0o077:
        # torchjob's own default root, made looser by an earlier torchjob; a --state-dir that
        # already exists is the user's to set (it could be a shared directory such as /tmp).
        os.chmod(root, DIR_MODE)
    for _ in range(100):
        path = root / jobdirs.new_id(job_name)
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(path, DIR_MODE)
        return JobDir(path)
    raise OSError(f"cannot create a job directory in {root}")


# The marks of a local job directory: the two files every job's supervisor writes first.
JOB_MARKS = ("status.json", "supervisor.pid")


def is_state_root(root: Path) -> bool:
    """Whether torchjob may remove jobs from ``root``: its default root, or one holding its marker."""
    return jobdirs.is_marked_root(root, state_root())


def is_job_dir(path: Path) -> bool:
    """Whether ``path`` is a local job directory torchjob made (engine_api/jobdirs.py): named
    ``<name>-<6 hex>``, a real directory of this user's holding ``status.json`` and
    ``supervisor.pid`` of its own. A user's own directory that happens to hold a ``status.json``
    or an ``expires`` is not a job: never listed, never removed."""
    return jobdirs.is_job_dir(path, JOB_MARKS)


def collect_expired(root: Path, now: float) -> list[str]:
    """Remove the finished jobs whose ttlSecondsAfterFinished has passed, as Volcano's garbage
    collector deletes them from a cluster; their ids. A job's supervisor writes when that is
    (``expires``) once its processes are gone, and a job is removed only once the supervisor is
    gone too. Nothing is removed from a root without torchjob's marker, nor anything but a job.
    A directory that stays in part is no job any more (renamed aside: jobdirs.remove), and -v says
    where it is."""
    if not root.is_dir() or not is_state_root(root):
        return []
    removed = []
    for path in root.iterdir():
        where = JobDir(path)
        if is_job_dir(path) and _own(where.expiry_file, stat.S_IFREG) and where.expired(now):
            left = where.remove()
            if left is None:
                removed.append(where.id)
            else:
                logs.info("expired job %s", jobdirs.not_removed(where.id, left))
    return removed


def list_jobs(root: Path) -> list[JobDir]:
    """Job directories, oldest first."""
    if not root.is_dir():
        return []
    dirs = [JobDir(p) for p in root.iterdir() if is_job_dir(p)]
    return sorted(dirs, key=lambda d: (d.status_file.stat().st_mtime if d.status_file.exists() else 0, d.id))
