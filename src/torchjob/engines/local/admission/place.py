"""Where the local queue lives, and the safe opening of its files.

One queue per machine where users share GPUs, else one per user:

* ``$TORCHJOB_QUEUE_DIR`` when it is set;
* else the machine's queue directory :data:`SHARED_DIR` when an administrator has made it: every
  user's jobs queue there together (docs/local-engine.md says how to set it up);
* else this user's own queue: ``$TORCHJOB_RUNTIME_DIR`` when set, else ``/tmp/torchjob-<uid>``, the
  same for every session of the user (an ssh login, a cron job, a service), whatever their
  ``XDG_RUNTIME_DIR`` or ``TMPDIR`` say.

A private directory is the user's own with mode 0700 (made so when missing). A shared one was made
by an administrator: a real directory owned by root (or by this user) that others cannot write to,
writable by the group of the users who share the machine. Its files are created 0660 in that group;
any file is opened relative to the checked directory, never through a symlink, and must be a
regular file with a single link (a hard link to a file elsewhere would have torchjob write there).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from torchjob.errors import Problem, SpecError
from torchjob.records import record

SHARED_DIR = Path("/var/lib/torchjob/queue")
PRIVATE_BASE = Path("/tmp")  # not $TMPDIR, which a session may set and a cron job not
_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)  # NONBLOCK: a planted FIFO


class QueueDirError(SpecError):
    """The queue's directory or one of its files cannot be used safely (or at all); one line."""

    def __init__(self, where: Path, message: str) -> None:
        super().__init__([Problem("", message, str(where))])
        self.where = where
        self.message = message


@record(frozen=True)
class Place:
    path: Path
    shared: bool = False  # other users' jobs queue here too
    gid: int = -1  # the group its files are made in (shared)

    @property
    def settings(self) -> Path:
        """A shared queue's settings, the same for every user (an administrator's file)."""
        return self.path / "queues.yaml"


def locate() -> Place:
    """The queue's directory, checked (and made, for a private one that is missing)."""
    explicit = os.environ.get("TORCHJOB_QUEUE_DIR")
    if explicit:
        return _existing(Path(explicit), may_share=True) or _private(Path(explicit))
    found = _existing(SHARED_DIR, may_share=True)
    if found is not None:
        return found
    return _private(user_dir())


def user_dir() -> Path:
    """This user's own directory for what all their local jobs share (this private queue, the port
    registry, ports.py): ``$TORCHJOB_RUNTIME_DIR``, else ``/tmp/torchjob-<uid>`` in every session.
    Not checked here: each user of it checks it as it opens it."""
    runtime = os.environ.get("TORCHJOB_RUNTIME_DIR")
    return Path(runtime) if runtime else PRIVATE_BASE / f"torchjob-{os.getuid()}"


def shared_place() -> Place | None:
    """The queue's directory when it is a shared one; None for a private one (made by nobody here)."""
    explicit = os.environ.get("TORCHJOB_QUEUE_DIR")
    found = _existing(Path(explicit) if explicit else SHARED_DIR, may_share=True)
    return found if found is not None and found.shared else None


def _existing(path: Path, may_share: bool) -> Place | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise QueueDirError(path, f"cannot use the queue directory: {err.strerror or err}") from None
    return Place(path, *_judge(path, info, may_share))


def _private(path: Path) -> Place:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # ours, just made: the umask must not loosen or tighten it
    except FileExistsError:
        pass
    except OSError as err:
        raise QueueDirError(path, f"cannot create the queue directory: {err.strerror or err}") from None
    found = _existing(path, may_share=False)
    if found is None:
        raise QueueDirError(path, "the queue directory vanished as it was made")
    return found


def _judge(path: Path, info: os.stat_result, may_share: bool) -> tuple[bool, int]:
    """(shared, gid) for a directory that is safe to queue in; QueueDirError saying why not."""
    me = os.getuid()
    fix = "remove it (or set TORCHJOB_RUNTIME_DIR to a private directory)"
    if stat.S_ISLNK(info.st_mode):
        raise QueueDirError(path, f"the queue directory is a symlink; refusing to use it: {fix}")
    if not stat.S_ISDIR(info.st_mode):
        raise QueueDirError(path, f"the queue directory is not a directory: {fix}")
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid == me and mode == 0o700:
        return False, -1
    if may_share and not mode & stat.S_IWGRP:  # shared means: for a group to write in
        raise QueueDirError(
            path,
            f"the queue directory has mode {mode:04o}, owner uid {info.st_uid}: expected 0700 and yours "
            "(a queue of your own) or 2770 and root's (a group's); refusing it",
        )
    if not may_share:
        if info.st_uid != me:
            raise QueueDirError(
                path,
                f"the queue directory belongs to uid {info.st_uid}, not to you (uid {me}); refusing to use "
                f"it: {fix}",
            )
        raise QueueDirError(
            path, f"the queue directory has mode {mode:04o}, expected 0700; refusing it: {fix}"
        )
    admin = "ask the administrator who set up the machine's queue (docs/local-engine.md)"
    if info.st_uid not in (0, me):
        raise QueueDirError(
            path,
            f"the shared queue directory belongs to uid {info.st_uid}, not to root; refusing it: {admin}",
        )
    if mode & stat.S_IWOTH:
        raise QueueDirError(
            path,
            f"the shared queue directory has mode {mode:04o}: anyone may write in it; refusing it: {admin}",
        )
    if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        raise QueueDirError(
            path,
            f"you (uid {me}) may not write in the shared queue directory (group {_group(info.st_gid)}, mode "
            f"{mode:04o}): {admin}",
        )
    return True, info.st_gid


def _group(gid: int) -> str:
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def open_dir(where: Place) -> int:
    """A descriptor of the queue's directory, checked again once open (it may have been swapped)."""
    try:
        fd = os.open(where.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise QueueDirError(where.path, f"cannot open the queue directory: {err.strerror or err}") from None
    try:
        shared, _ = _judge(where.path, os.fstat(fd), may_share=where.shared)
        if shared != where.shared:
            raise QueueDirError(where.path, "the queue directory changed under torchjob; refusing it")
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file(dir_fd: int, name: str, where: Place, *, write: bool, create: bool) -> int | None:
    """``name`` in the queue's directory, opened for reading (and writing); None when it does not
    exist and ``create`` is false. Made 0600 (private) or 0660 in the directory's group (shared)."""
    path = where.path / name
    flags = (os.O_RDWR if write else os.O_RDONLY) | _FLAGS
    made = False
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            return None
        try:
            fd = os.open(
                name, flags | os.O_CREAT | os.O_EXCL, 0o660 if where.shared else 0o600, dir_fd=dir_fd
            )
            made = True
        except FileExistsError:  # another process made it meanwhile
            fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as err:  # ELOOP: a symlink planted in its place
        hint = " (it should be readable and writable by the queue's group)" if where.shared else ""
        raise QueueDirError(path, f"cannot open {name}: {err.strerror or err}{hint}") from None
    try:
        info = os.fstat(fd)
        if made and where.shared:
            os.fchmod(fd, 0o660)  # whatever the umask: the others of the group write it too
            if info.st_gid != where.gid:
                os.fchown(fd, -1, where.gid)
        elif not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise QueueDirError(path, "not a regular file with a single link; refusing to use it: remove it")
        elif stat.S_IMODE(info.st_mode) & stat.S_IWOTH:
            raise QueueDirError(path, "anyone may write it; refusing to use it: remove it")
    except OSError as err:
        os.close(fd)
        raise QueueDirError(path, f"cannot prepare {name}: {err.strerror or err}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd
