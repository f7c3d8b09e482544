"""Job directories, the same rules on every engine that keeps its jobs in directories (local, Slurm).

A root (the local ``--state-dir``, Slurm's ``--job-root``) may be any directory a user names, so:

- only what torchjob made counts as a job (:func:`is_job_dir`): a directory named
  ``<job name>-<6 hex>``, this user's, holding the files the engine writes into each job first
  (its ``marks``), regular files of this user's; a project's own folder that happens to hold an
  ``options.json`` or a ``status.json`` is never listed, never removed;
- nothing is removed from a root that torchjob did not mark as its own (:func:`check_removable`:
  the engine's default root, or one holding :data:`ROOT_MARKER`, written when the first job is made);
- a reference picks one job or none (:func:`choose`): its id, its name (the newest job of that
  name; to delete, a name that several jobs have is ambiguous), or an id prefix that one job has,
  of :data:`MIN_DELETE_PREFIX` characters or more to delete;
- a job directory is removed checked, not assumed (:func:`remove`), and what stays is said
  (:func:`not_removed`): ``delete``, a TTL's collection, a start that failed.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from torchjob.engine_api.base import EngineError, JobNotFound
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

ROOT_MARKER = ".torchjob-state"  # written into every root torchjob keeps jobs in
_MARKER_TEXT = "torchjob state directory: job directories live here; do not put other files in it\n"
# <job name (a DNS-1123 label)>-<6 hex digits>: the only names the engines give job directories
JOB_ID = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?-[0-9a-f]{6}"
MIN_DELETE_PREFIX = 4  # shorter id prefixes match too easily to delete by
REMOVE_TIMEOUT = 2.0  # seconds remove() tries again while something is left in the directory


def new_id(name: str) -> str:
    """A job id: its name and six random hex digits (``os.urandom``: ``secrets`` would import hmac
    and hashlib on the way to the first pod)."""
    return f"{name}-{os.urandom(3).hex()}"


def mark_root(root: Path) -> None:
    """Say in ``root`` that torchjob keeps jobs there; an existing marker is left as it is."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    try:
        fd = os.open(root / ROOT_MARKER, flags, 0o600)
    except FileExistsError:
        return
    try:
        os.write(fd, _MARKER_TEXT.encode())
    finally:
        os.close(fd)


def is_marked_root(root: Path, default: Path) -> bool:
    """Whether torchjob may remove jobs from ``root``: the engine's ``default`` root, or one
    holding its marker (a regular file of this user's)."""
    if root == default:
        return True
    return owned(root / ROOT_MARKER, stat.S_IFREG)


def check_removable(root: Path, default: Path) -> None:
    """An EngineError unless torchjob may remove jobs from ``root`` (a missing root holds none)."""
    if root.exists() and not is_marked_root(root, default):
        raise EngineError(
            f"{root} is not a torchjob state directory (torchjob writes {ROOT_MARKER} into each one "
            "it keeps jobs in); refusing to delete anything there (if it holds jobs of an older "
            f"torchjob, create {root / ROOT_MARKER})"
        )


def owned(path: Path, kind: int, strict: bool = False) -> bool:
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


def is_job_dir(path: Path, marks: tuple[str, ...]) -> bool:
    """Whether ``path`` is a job directory torchjob made: named ``<name>-<6 hex>``, a real directory
    of this user's holding each of ``marks`` (the files its engine writes into a job first), each a
    regular file of this user's."""
    if re.fullmatch(JOB_ID, path.name) is None or not owned(path, stat.S_IFDIR):
        return False
    # A job directory of this user's that it made unreadable is its to repair: said, not skipped.
    return all(owned(path / mark, stat.S_IFREG, strict=True) for mark in marks)


def name_of(job_id: str) -> str:
    """The job name in a job id (``<name>-<6 hex>``)."""
    return job_id.rpartition("-")[0] or job_id


def choose(
    ref: str,
    ids: list[str],
    started: Callable[[str], float],
    *,
    engine: str,
    root: Path,
    deleting: bool = False,
) -> str:
    """The one job id ``ref`` names among ``ids``: the id itself; else a name, the newest job of
    that name by ``started`` (to delete, a name several jobs have is ambiguous: which of them is
    meant is not a guess to make); else an id prefix one job has (to delete, of
    MIN_DELETE_PREFIX characters or more)."""
    if not ref:
        raise EngineError("a job reference cannot be empty: give a job id, an id prefix or a name")
    if ref in ids:
        return ref
    named = sorted((i for i in ids if name_of(i) == ref), key=started, reverse=True)
    if len(named) > 1 and deleting:
        listed = ", ".join(named)
        raise EngineError(f"job {ref!r} names {len(named)} jobs ({listed}, newest first): give the id of one")
    if named:
        return named[0]
    prefixed = sorted(i for i in ids if i.startswith(ref))
    if prefixed and deleting and len(ref) < MIN_DELETE_PREFIX:
        raise EngineError(
            f"job {ref!r} is too short a prefix to pick a job by: give the job's name, its id "
            f"or at least {MIN_DELETE_PREFIX} characters of it"
        )
    if len(prefixed) == 1:
        return prefixed[0]
    if prefixed:
        raise EngineError(f"job {ref!r} is ambiguous: {', '.join(prefixed)}")
    raise JobNotFound(f"no {engine} job {ref!r} in {root}", ref)


def remove(path: Path, timeout: float = REMOVE_TIMEOUT) -> Path | None:
    """Remove the job directory ``path`` and everything in it: None once it is gone (checked, not
    assumed), else where what is left of it is.

    It is first renamed aside, to a hidden name in its root, so that no process still writing into
    it by its path (a straggler of the job, a helper's last log line, a node of a shared file
    system) can add a file there any more, and so that a job half removed is never listed; then
    removed, again while something is left (a file added through a descriptor opened before, a
    file an NFS client keeps while it is open), for at most ``timeout`` seconds. A single
    ``rmtree(ignore_errors=True)`` leaves the directory behind at the first "Directory not empty",
    without the files that made it a job: a job that no command can see or delete."""
    import shutil
    import time

    target = path.with_name(f".{path.name}.removed-{os.getpid()}")
    try:
        os.rename(path, target)
    except FileNotFoundError:
        return path if os.path.lexists(path) else None
    except OSError:
        target = path  # cannot be renamed (its root is not writable...): removed where it is
    deadline = time.monotonic() + timeout
    while True:
        shutil.rmtree(target, ignore_errors=True)
        if not os.path.lexists(target):
            return None
        if time.monotonic() >= deadline:
            return target
        time.sleep(0.01)


def not_removed(job_id: str, left: Path) -> str:
    """What ``delete`` says of a job whose directory stayed in part (every engine alike)."""
    return f"{job_id}: {left} could not be removed"
