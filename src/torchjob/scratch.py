"""Temporary directories that a killed process does not leave behind for ever.

A Python call's arguments (pickled: tens of megabytes for a call that passes data) and the warm
pool's files live in directories under the temporary directory, removed when the call, or the
process, ends. A process killed with SIGKILL removes nothing. So each such directory holds a lock
file, ``.owner``, locked (``flock``) by the process that made it for as long as it uses the
directory; the kernel lets go of the lock with the process's last descriptor of it, however the
process ended. Whoever makes the next directory of the same kind first removes those of this user
whose lock nobody holds any more (:func:`make`). A directory without that file, or not this
user's, or a symlink, is never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from pathlib import Path

OWNER = ".owner"
_NEW = ".owner-new"
_held: dict[str, int] = {}  # directory -> its locked .owner, while in use


def make(prefix: str) -> Path:
    """A new private directory (0700) under the temporary directory, owned by this process until
    :func:`remove`; the abandoned ones of the same prefix are removed first."""
    import tempfile

    sweep(prefix)
    path = tempfile.mkdtemp(prefix=prefix)
    hold(path)
    return Path(path)


def hold(path: Path | str) -> None:
    """Lock the new, empty private directory ``path`` for this process, as :func:`make` does."""
    # Locked before it has its name: a sweep never finds an .owner that nobody holds yet.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(os.path.join(path, _NEW), flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(os.path.join(path, _NEW), os.path.join(path, OWNER))
    except OSError:
        os.close(fd)
        raise
    _held[str(path)] = fd


def remove(path: Path | str) -> None:
    """Remove a directory :func:`make` made (its lock last)."""
    import shutil  # (here: with its compression modules, 2 ms that a job's start need not pay)

    shutil.rmtree(path, ignore_errors=True)
    release(path)


def remove_empty(path: Path | str) -> bool:
    """Remove a held directory in which nothing but its lock is left, without shutil; False when
    something else is in it (then :func:`remove` it)."""
    try:
        if any(entry.name != OWNER for entry in os.scandir(path)):
            return False
        os.unlink(os.path.join(path, OWNER))
        os.rmdir(path)
    except OSError:
        return False
    release(path)
    return True


def release(path: Path | str) -> None:
    """Let go of a held directory's lock (it was removed, or is left for a sweep)."""
    fd = _held.pop(str(path), -1)
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)


def forget(path: Path | str) -> None:
    """Let go of a directory without removing it (a forked child: the directory is its parent's,
    which holds the lock too)."""
    _held.pop(str(path), None)


def sweep(prefix: str, root: str | None = None) -> list[str]:
    """Remove this user's directories of ``prefix`` (in ``root``, else the temporary directory)
    whose maker has ended; their paths."""
    if root is None:
        import tempfile

        root = tempfile.gettempdir()
    removed = []
    try:
        entries = [e.name for e in os.scandir(root) if e.name.startswith(prefix)]
    except OSError:
        return []
    for name in entries:
        path = os.path.join(root, name)
        if path in _held:
            continue
        lock = _abandoned(path)
        if lock is None:
            continue
        try:
            import shutil

            shutil.rmtree(path, ignore_errors=True)  # (symlinks inside are removed, not followed)
            removed.append(path)
        finally:
            os.close(lock)
    return removed


def _abandoned(path: str) -> int | None:
    """The locked ``.owner`` of ``path`` when it is this user's directory (no symlink) and its lock
    was free; None otherwise."""
    try:
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            return None
        folder = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        lock = os.open(OWNER, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    except OSError:  # no lock file: not made here (or by an older torchjob), left alone
        return None
    finally:
        os.close(folder)
    try:
        info = os.fstat(lock)
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return lock
    except OSError:  # held: its maker lives
        pass
    os.close(lock)
    return None
