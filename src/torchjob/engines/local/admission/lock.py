"""The queue's lock: ``flock`` with a bounded wait, and who holds it when the wait runs out.

Each look holds the lock for a millisecond or so. A process that holds it longer (a torchjob
stopped with Ctrl-Z in the middle of a look, a hung filesystem) is found in ``/proc/locks`` and
named, with its command and whether it is stopped, so that waiting jobs can say what they wait for.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from torchjob.errors import Problem, SpecError
from torchjob.host import procfs


class Busy(SpecError):
    """The lock is held by another process; ``holder`` says which, as far as it can be told."""

    def __init__(self, path: Path, holder: str) -> None:
        self.path = path
        self.holder = holder
        super().__init__([Problem("", f"the queue's lock is held by {holder}", str(path))])

    @property
    def reason(self) -> str:
        return f"the queue's lock ({self.path}) is held by {self.holder}"


def acquire(fd: int, path: Path, wait: float) -> None:
    """Take the exclusive lock on ``fd`` within ``wait`` seconds, else :class:`Busy`."""
    deadline = time.monotonic() + wait
    pause = 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise Busy(path, holder(fd)) from None
            time.sleep(pause)
            pause = min(0.02, pause * 2)


def holder(fd: int) -> str:
    """The process that holds the flock on ``fd``'s file, for a person: ``pid 123 (torchjob queue),
    stopped``; ``another process`` when that cannot be told."""
    pid = _holder_pid(fd)
    if pid is None:
        return "another process"
    return describe(pid)


def _holder_pid(fd: int) -> int | None:
    try:
        info = os.fstat(fd)
        with open("/proc/locks") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    exact = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    by_inode = None
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 1234 00:2e:5678 0 EOF"; a waiter's line has "->" before FLOCK
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or not fields[4].isdigit():
            continue
        if fields[5] == exact:
            return int(fields[4])
        if fields[5].rpartition(":")[2] == str(info.st_ino):  # an overlay reports another device
            by_inode = int(fields[4])
    return by_inode


def describe(pid: int) -> str:
    """``pid 123 (python3 hold.py), stopped``, with the user when it is not this one."""
    parts = [f"pid {pid}"]
    try:
        command = procfs.command(pid)
    except OSError:
        command = ""
    if command:
        parts.append(f"({command})")
    text = " ".join(parts)
    try:
        owner = procfs.uid(pid)
        state = procfs.stat_fields(pid)[0]
    except (OSError, ValueError, IndexError):
        return text
    if owner != os.getuid():
        text += f" of {_user(owner)}"
    if state in (b"T", b"t"):
        text += ", stopped (resume it with fg or kill -CONT, or end it)"
    return text


def _user(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
