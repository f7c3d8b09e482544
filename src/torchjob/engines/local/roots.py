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
import re
import stat
from pathlib import Path

from torchjob.engines.local.state import DIR_MODE, FILE_MODE, JobDir, make_private_dirs


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
        path = root / f"{job_name}-{os.urandom(3).hex()}"  # secrets.token_hex, without hmac/OpenSSL
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(path, DIR_MODE)
        return JobDir(path)
    raise OSError(f"cannot create a job directory in {root}")


ROOT_MARKER = ".torchjob-state"  # written into every root torchjob keeps jobs in
_MARKER_TEXT = "torchjob state directory: job directories live here; do not put other files in it\n"
# <job name (a DNS-1123 label)>-<6 hex digits>: the only names new_job_dir gives
_JOB_ID = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?-[0-9a-f]{6}")


def mark_root(root: Path) -> None:
    """Say in ``root`` that torchjob keeps jobs there; an existing marker is left as it is."""
    try:
        fd = os.open(root / ROOT_MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    except FileExistsError:
        return
    try:
        os.write(fd, _MARKER_TEXT.encode())
    finally:
        os.close(fd)


def is_state_root(root: Path) -> bool:
    """Whether torchjob may remove jobs from ``root``: its default root, or one holding its marker
    (a regular file of this user's)."""
    if root == state_root():
        return True
    try:
        info = os.lstat(root / ROOT_MARKER)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid()


def _own(path: Path, kind: int, strict: bool = False) -> bool:
    """``path`` is, without following a symlink, of this ``kind`` (S_IFDIR, S_IFREG) and this user's.
    ``strict``: a directory on the way that this user may not search raises (PermissionError)."""
    try:
        info = os.lstat(path)
    except PermissionError:
        if strict:
            raise
        return False
    except OSError:
        return False
    return stat.S_IFMT(info.st_mode) == kind and info.st_uid == os.getuid()


def is_job_dir(path: Path) -> bool:
    """Whether ``path`` is a job directory torchjob made: named ``<name>-<6 hex>``, a real directory of
    this user's holding the two files every job's supervisor writes first (``supervisor.pid``, then
    ``status.json``), both regular files of this user's. A user's own directory that happens to
    hold a ``status.json`` or an ``expires`` is not a job: never listed, never removed."""
    return (
        _JOB_ID.fullmatch(path.name) is not None
        and _own(path, stat.S_IFDIR)
        # A job directory of this user's that it made unreadable is its to repair: said, not skipped.
        and _own(path / "status.json", stat.S_IFREG, strict=True)
        and _own(path / "supervisor.pid", stat.S_IFREG, strict=True)
    )


def collect_expired(root: Path, now: float) -> list[str]:
    """Remove the finished jobs whose ttlSecondsAfterFinished has passed, as Volcano's garbage
    collector deletes them from a cluster; their ids. A job's supervisor writes when that is
    (``expires``) once its processes are gone, and a job is removed only once the supervisor is
    gone too. Nothing is removed from a root without torchjob's marker, nor anything but a job."""
    import shutil

    if not root.is_dir() or not is_state_root(root):
        return []
    removed = []
    for path in root.iterdir():
        where = JobDir(path)
        if is_job_dir(path) and _own(where.expiry_file, stat.S_IFREG) and where.expired(now):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(where.id)
    return removed


def list_jobs(root: Path) -> list[JobDir]:
    """Job directories, oldest first."""
    if not root.is_dir():
        return []
    dirs = [JobDir(p) for p in root.iterdir() if is_job_dir(p)]
    return sorted(dirs, key=lambda d: (d.status_file.stat().st_mtime if d.status_file.exists() else 0, d.id))
