"""Who listens on a job's port (``host/tcp.py`` reads the TCP tables), for telling a job's failure
caused by a port another process took after torchjob reserved it apart from a program's own error.

Every local job shares the machine's ports with every other process, another user's too; torchjob
reserves a port for a job, but nothing stops a process outside the job from listening there
before the job's master does. When a pod fails, the supervisor asks here once whether that is
what happened, and names the port and, where /proc lets it see, the process.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Collection, Mapping

from torchjob.host import procfs
from torchjob.host.tcp import Listener, Tables, listening


def owner(inode: int, first: Collection[int] = ()) -> int | None:
    """The pid of a process holding socket ``inode`` open, if one this process may look into does;
    the pids ``first`` (the job's own) are looked at before the whole process table."""
    link = f"socket:[{inode}]"
    for pid in (*first, *procfs.pids()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone, or another user's
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == link:
                    return pid
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
        return procfs.command(pid)
    except OSError:
        return "?"


class PortWatch:
    """The listeners on a job's host ports (``ports``: declared -> host), each judged once by its
    socket: a process of the job, or another one (named where /proc shows it)."""

    def __init__(
        self,
        ports: Mapping[int, int],
        job_id: str,
        job_uids: Collection[int],
        tables: Tables | None = None,
        asked: Callable[[], list[Listener] | None] | None = None,
    ) -> None:
        self.by_host = {host: declared for declared, host in ports.items()}
        self.job_id = job_id
        self.job_uids = set(job_uids)
        self.tables = tables  # None: this machine's network
        # The network's listeners asked through sock_diag (network.JobNetwork.listeners): tens of
        # microseconds, where reading the tables walks every TCP socket of the machine (3.4 ms a
        # table here). None from it: the tables are read instead.
        self.asked = asked
        self._judged: dict[int, str] = {}  # socket inode -> "" (the job's) or what took the port

    def _listening(self) -> list[Listener]:
        found = self.asked() if self.asked is not None else None
        if found is None:
            return listening(self.by_host, self.tables)
        return [sock for sock in found if sock.port in self.by_host]

    def taken(self, job_pids: Collection[int] = ()) -> list[str]:
        """One sentence per port on which something that is not the job listens now."""
        found: list[str] = []
        for sock in self._listening():
            if sock.inode not in self._judged:
                self._judged[sock.inode] = self._judge(sock, job_pids)
            if self._judged[sock.inode]:
                found.append(self._judged[sock.inode])
        return list(dict.fromkeys(found))

    def _judge(self, sock: Listener, job_pids: Collection[int]) -> str:
        pid = owner(sock.inode, job_pids)
        if pid is not None and (_descends(pid, job_pids) or _marked(pid, self.job_id)):
            return ""  # a process of this job: the port is where it belongs
        if pid is None and sock.uid in self.job_uids:
            return ""  # this user's and not visible: most likely the job's own (it may have ended)
        declared = self.by_host[sock.port]
        port = f"port {sock.port}" + (f" (declared {declared})" if declared != sock.port else "")
        who = f"a process of uid {sock.uid}"
        if pid is not None:
            who = f"pid {pid} ({_command(pid)}), uid {sock.uid}"
        return f"{port} was taken by another process after torchjob reserved it for this job: {who}"


def _descends(pid: int, ancestors: Collection[int]) -> bool:
    """Whether ``pid`` is one of ``ancestors`` or a descendant of one. A process forked from a fork
    server (``--preload``, the warm pool) shows the server's environment, without the job's marker:
    its ancestry tells instead (the engine knows each container's process)."""
    for _ in range(64):  # deeper than any job's tree: a cycle read during a pid's reuse ends too
        if pid in ancestors:
            return True
        try:
            pid = procfs.ppid(pid)
        except (OSError, ValueError, IndexError):
            return False
        if pid <= 1:
            return False
    return False
