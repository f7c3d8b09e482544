"""Reading Linux's /proc directly: cheaper than psutil, which costs 10 ms to import, for the few
facts the engines need about a process on the way to starting or stopping a job."""

from __future__ import annotations

import functools
import os


def read(path: str) -> bytes:
    """The whole of a small /proc file. Plain system calls: a third cheaper than ``open()``, which
    builds a buffered file object, and the scans of the process table read one per process."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _rest(fd)
    finally:
        os.close(fd)


def reread(fd: int) -> bytes:
    """The whole of a /proc file kept open (``fd``), read anew: the kernel makes it again from its
    start (a network namespace's TCP table, opened while this process could still reach it)."""
    os.lseek(fd, 0, os.SEEK_SET)
    return _rest(fd)


def _rest(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def pids() -> list[int]:
    """The processes /proc shows now (those of other users too, unless it hides them). Raises
    OSError where there is no /proc."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def uid(pid: int) -> int:
    """Whose process ``pid`` is: the owner of its /proc directory (its effective uid; root for a
    process that is not dumpable). Raises OSError."""
    return os.stat(f"/proc/{pid}").st_uid


def environ(pid: int) -> bytes:
    """The environment ``pid`` was started with, as NUL-separated entries each after a NUL (so
    ``b"\\0NAME=value\\0"`` finds a whole entry); empty when it cannot be read (gone, another
    user's)."""
    try:
        return b"\0" + read(f"/proc/{pid}/environ")
    except OSError:
        return b""


def command(pid: int) -> str:
    """The command line of ``pid`` on one line for a person: its words joined by a space, white
    space folded, cut to 80 characters. Empty for a zombie or a kernel thread; raises OSError."""
    argv = read(f"/proc/{pid}/cmdline").split(b"\0")
    text = " ".join(" ".join(arg.decode(errors="replace").split()) for arg in argv if arg)
    return text if len(text) <= 80 else text[:77] + "..."


def _stat(pid: int) -> bytes:
    """``/proc/<pid>/stat`` after the command name ("pid (comm) state ppid ..."): comm may hold
    spaces and parentheses, so it is cut after the last ")". It fits one read (under 1 KB)."""
    fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    try:
        stat = os.read(fd, 4096)
    finally:
        os.close(fd)
    end = stat.rfind(b")")
    if end < 0:
        raise ValueError(f"unreadable /proc/{pid}/stat")
    return stat[end + 1 :]


def stat_fields(pid: int) -> list[bytes]:
    """The fields of ``/proc/<pid>/stat`` after the command name: [0] state, [1] ppid,
    [19] start time in clock ticks since boot. Raises OSError (no such process) or ValueError."""
    return _stat(pid).split()


def start_ticks(pid: int) -> int:
    """When ``pid`` started, in clock ticks since boot: with the pid, names one process for good."""
    return int(stat_fields(pid)[19])


def ppid(pid: int) -> int:
    """The parent of ``pid``; raises OSError or ValueError (or IndexError)."""
    return int(_stat(pid).split(None, 2)[1])  # only the first fields: read for every process


@functools.cache
def boot_time() -> float:
    """When this machine booted, in seconds since the epoch (read once: it does not change)."""
    with open("/proc/stat", "rb") as handle:
        for line in handle:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    raise ValueError("no btime in /proc/stat")


def ticks_now() -> int:
    """Now, in the clock ticks since boot that a process's start time is given in (field [19] of
    :func:`stat_fields`). Raises OSError or ValueError."""
    return int(float(read("/proc/uptime").split()[0]) * os.sysconf("SC_CLK_TCK"))
