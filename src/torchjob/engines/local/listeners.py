"""Who listens on a port: read from Linux's /proc/net/tcp and tcp6, for telling a job's failure
caused by a port another process took after torchjob reserved it apart from a program's own error.

Every local job shares the machine's ports with every other process, another user's too; torchjob
reserves a port for a job, but nothing stops a process outside the job from listening there
before the job's master does. When a pod fails, the supervisor asks here once whether that is
what happened, and names the port and, where /proc lets it see, the process.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Mapping

from torchjob.engines.local import procfs
from torchjob.records import record

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column
_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


@record(frozen=True)
class Listener:
    port: int
    uid: int
    inode: int


def listening(ports: Collection[int]) -> list[Listener]:
    """The listening TCP sockets (IPv4 and IPv6) on any of ``ports``; [] where /proc cannot tell."""
    found: list[Listener] = []
    for table in _TABLES:
        try:
            lines = procfs.read(table).decode(errors="replace").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            with contextlib.suppress(ValueError):
                port = int(fields[1].rpartition(":")[2], 16)
                if port in ports:
                    found.append(Listener(port, int(fields[7]), int(fields[9])))
    return found


def owner(inode: int) -> int | None:
    """The pid of a process holding socket ``inode`` open, if one this process may look into does."""
    link = f"socket:[{inode}]"
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue  # gone, or another user's
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{name}/fd/{fd}") == link:
                    return int(name)
    return None


def _marked(pid: int, job_id: str) -> bool:
    from torchjob.engines.local.process import MARKER

    try:
        environ = procfs.read(f"/proc/{pid}/environ")
    except OSError:
        return False
    return f"{MARKER}={job_id}".encode() in environ.split(b"\0")


def _command(pid: int) -> str:
    try:
        argv = procfs.read(f"/proc/{pid}/cmdline").split(b"\0")
    except OSError:
        return "?"
    text = " ".join(a.decode(errors="replace") for a in argv if a)
    return text if len(text) <= 80 else text[:77] + "..."


def taken_ports(ports: Mapping[int, int], job_id: str, job_uids: Collection[int]) -> list[str]:
    """For each of the job's host ports (``ports``: declared -> host) on which something that is not
    the job listens, one sentence naming the port and, when it can be seen, the process."""
    by_host = {host: declared for declared, host in ports.items()}
    found: list[str] = []
    for sock in listening(by_host):
        pid = owner(sock.inode)
        if pid is not None and _marked(pid, job_id):
            continue  # a process of this job: the port is where it belongs
        if pid is None and sock.uid in job_uids:
            continue  # this user's and not visible: most likely the job's own (it may have ended)
        declared = by_host[sock.port]
        port = f"port {sock.port}" + (f" (declared {declared})" if declared != sock.port else "")
        who = (
            f"pid {pid} ({_command(pid)}), uid {sock.uid}"
            if pid is not None
            else f"a process of uid {sock.uid}"
        )
        found.append(f"{port} was taken by another process after torchjob reserved it for this job: {who}")
    return list(dict.fromkeys(found))
