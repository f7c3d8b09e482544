"""A job's own network: a network namespace that every process of the job enters, and no other user.

On a shared machine every local user can connect to every port of the loopback: another user who
reads a job's rendezvous port from ``/proc/net/tcp`` could write into its c10d store, whose values
torch unpickles. So each local job runs in a network namespace of its own (Linux): a loopback
interface only, brought up, where 127.0.0.0/8 works as on the machine, so that the pods keep their
addresses, ports and names; the pods of the job reach each other, and nothing outside reaches them.

The namespace is made once per job in a short-lived child: as root by ``unshare(CLONE_NEWNET)``;
otherwise (or for root without the capability, in a container) a user namespace that maps the
user's own uid and gid to themselves comes first and owns it, so that only this user (and root)
may enter it. It is kept as file descriptors (:class:`Network`), held by the supervisor (by the
calling process for the SDK's warm pool, ``pool.py``), and each process of the job enters it just
before its program starts (:meth:`Network.enter`). It ends with the last process in it once the
descriptors are closed. Where it cannot be made (another system, user namespaces disabled, a
seccomp filter), or the job asks for the machine's network, the job runs there as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import select
import signal
import socket
import struct
import sys
import time
import warnings
from collections.abc import Iterable

from torchjob.engines.local.libc import LIBC
from torchjob.host import procfs, sockdiag
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from torchjob.spec.model import Job

SWITCH = "TORCHJOB_NETWORK"  # "host": every local job uses the machine's network
MAKE_TIMEOUT = 3.0  # seconds for the child that makes the namespace, and for the one that enters it
ENTERING = "setns"  # how a failure to enter the namespace begins (Network.enter)

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_PR_SET_DUMPABLE = 4
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = 40  # sizeof(struct ifreq) on 64-bit Linux; a larger buffer is harmless


def hosts_entries(machine: str, pods: Iterable[str] = ()) -> list[tuple[str, list[str]]]:
    """Lines for the job's hosts file in its own network, where no name server answers (a lookup
    there fails with "try again", not "not found"): this machine's name, when its hosts file does
    not name it, is the loopback (gloo looks it up for the address to bind); and a reverse name for
    the loopback and each of the ``pods``' addresses in its IPv4-mapped form (``::ffff:127.0.1.2``),
    the form a dual-stack socket sees its IPv4 peers in (torch's store looks each one up to log it,
    and glibc's files backend, 2.36 here, does not answer it from the address's IPv4 line).

    That name is the IPv4 address itself: a resolver takes a numeric name for an address and never
    looks it up (getaddrinfo, gethostbyname's digits-and-dots path, getent), so no forward lookup
    of any name changes. A pod's name on such a line would answer IPv6 lookups of that name with
    the mapped address (``getent hosts POD``), unlike a cluster."""
    named = {name for line in machine.splitlines() for name in line.split("#", 1)[0].split()[1:]}
    host = socket.gethostname()
    entries = [(f"::ffff:{address}", [address]) for address in dict.fromkeys(["127.0.0.1", *pods])]
    if host and host not in named:
        entries.insert(0, ("127.0.0.1", [host]))
    return entries


def why_host(job: Job) -> str | None:
    """Why ``job`` runs on the machine's network (the switch, a pod's ``hostNetwork``); None: its own."""
    if os.environ.get(SWITCH, "").strip().lower() == "host":
        return f"{SWITCH}=host"
    for task in job.spec.tasks:
        if task.template.spec.get("hostNetwork") is True:
            return f"task {task.name} sets hostNetwork: true"
    return None


class Network:
    """A network namespace (and the user namespace that owns it, without root), as descriptors."""

    def __init__(
        self, net: int, user: int, tables: tuple[int, int], diag: socket.socket | None = None
    ) -> None:
        self.net = net
        self.user = user  # -1: none (root made the namespace in the machine's user namespace)
        self.tables = tables  # its /proc/net/tcp and tcp6, opened by this process: the uids are real
        self.diag = diag  # a sock_diag socket made inside it (host/sockdiag.py): its listeners, cheaply
        # (asked through network.JobNetwork.listeners)

    def enter(self) -> None:  # pragma: no cover - runs in the forked child before exec
        """Move the calling (single-threaded) process into the namespace. Raises OSError."""
        libc = _LIBC
        if libc is None or self.net < 0:
            raise OSError("the job's network namespace is closed")
        # Its own user namespace first: only a member may enter the network namespace it owns. The
        # uid and gid map to themselves, so the process keeps its ids (its capabilities there end
        # when it runs its program, as for any process that is not root).
        if self.user >= 0 and libc.setns(self.user, _CLONE_NEWUSER) != 0:
            _raise("setns (the job's user namespace)")
        if libc.setns(self.net, _CLONE_NEWNET) != 0:
            _raise("setns (the job's network namespace)")

    def read_tables(self) -> list[bytes]:
        """The namespace's TCP tables (IPv4, IPv6), read anew; empty where one cannot be read."""
        found = []
        for fd in self.tables:
            with contextlib.suppress(OSError):
                found.append(procfs.reread(fd))
        return found

    def close(self) -> None:
        if self.diag is not None:
            self.diag.close()
            self.diag = None
        for fd in (self.net, self.user, *self.tables):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.net = self.user = -1
        self.tables = (-1, -1)


def _libc() -> ctypes.CDLL | None:
    if LIBC is None:
        return None
    try:
        LIBC.unshare.argtypes = [ctypes.c_int]
        LIBC.setns.argtypes = [ctypes.c_int, ctypes.c_int]
    except AttributeError:
        return None
    return LIBC


_LIBC = _libc()


def _raise(what: str) -> None:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _make(uid: int, gid: int) -> None:  # pragma: no cover - runs in the forked child
    """New namespaces for this (single-threaded) child, its loopback up."""
    libc = _LIBC
    assert libc is not None
    if not (uid == 0 and libc.unshare(_CLONE_NEWNET) == 0):
        if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
            _raise("unshare")
        libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)  # its /proc files stay this user's to open
        with contextlib.suppress(FileNotFoundError):  # kernels before 3.19 have no such file
            _write("/proc/self/setgroups", b"deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1".encode())
        _write("/proc/self/gid_map", f"{gid} {gid} 1".encode())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh", b"lo", 0).ljust(_IFREQ, b"\0")
        flags = struct.unpack_from("16sh", fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(
            sock.fileno(), _SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | _IFF_UP).ljust(_IFREQ, b"\0")
        )


def _fork() -> int:
    with (
        warnings.catch_warnings()
    ):  # the child only makes system calls: this process's threads cannot hurt it
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _answer(read_end: int, pid: int, deadline: float) -> bytes | None:
    """What the child wrote before it closed its end; None (and the child killed) past ``deadline``."""
    data = b""
    while True:
        ready, _, _ = select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            return None
        chunk = os.read(read_end, 1000)
        if not chunk or chunk.endswith(b"\n"):
            return data + chunk
        data += chunk


class Pending:
    """A namespace being made in a child, so that the supervisor prepares the rest of the job meanwhile."""

    def __init__(
        self,
        reason: str | None = None,
        pid: int = 0,
        pipes: tuple[int, int] = (-1, -1),
        channel: socket.socket | None = None,
    ) -> None:
        self._reason = reason  # known without a child: the answer
        self._pid = pid
        self._pipes = pipes  # the child's answer; the pipe it waits on until its files are opened
        self._channel = channel  # where the child sends its sock_diag socket
        self._deadline = time.monotonic() + MAKE_TIMEOUT

    def result(self) -> Network | str:
        """The job's network (not entered yet: see :func:`verify`); or why there can be none here."""
        if self._pid == 0:
            return self._reason or "no network namespace was asked for"
        pid, (read_end, hold), self._pid = self._pid, self._pipes, 0
        try:
            answer = _answer(read_end, pid, self._deadline)
            if answer is None:
                return f"making a network namespace took more than {MAKE_TIMEOUT:g}s"
            if answer != b"ok\n":
                return answer.decode(errors="replace").strip() or "making a network namespace failed"
            try:
                network = _opened(pid)
            except OSError as err:
                return f"cannot open the new network namespace: {err}"
            network.diag = _received(self._channel)
        finally:
            if self._channel is not None:
                self._channel.close()
            os.close(read_end)
            os.close(hold)  # the child ends
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        return network


def _opened(pid: int) -> Network:
    """The namespaces of ``pid`` (and its TCP tables) as descriptors of this process."""
    flags = os.O_RDONLY | os.O_CLOEXEC
    opened: list[int] = []
    try:
        for path in ("ns/net", "net/tcp", "net/tcp6"):
            opened.append(os.open(f"/proc/{pid}/{path}", flags))
        user = -1
        if os.readlink(f"/proc/{pid}/ns/user") != os.readlink("/proc/self/ns/user"):
            user = os.open(f"/proc/{pid}/ns/user", flags)
    except OSError:
        for fd in opened:
            os.close(fd)
        raise
    return Network(opened[0], user, (opened[1], opened[2]))


def _received(channel: socket.socket | None) -> socket.socket | None:
    """The sock_diag socket the child sent before it said "ok" (so it is there now), if it could
    make one (a seccomp filter may refuse netlink sockets: the job runs all the same)."""
    if channel is None:
        return None
    channel.setblocking(False)
    try:
        _, fds, _, _ = socket.recv_fds(channel, 1, 1)
    except OSError:
        return None
    if not fds:
        return None
    os.set_inheritable(fds[0], False)  # received without close-on-exec
    return socket.socket(fileno=fds[0])


def _send_diag(channel: int) -> None:  # pragma: no cover - runs in the forked child
    with (
        contextlib.suppress(OSError),
        sockdiag.open_socket() as diag,
        socket.socket(fileno=channel) as sender,
    ):
        socket.send_fds(sender, [b"d"], [diag.fileno()])


def _close_all_but(*keep: int) -> None:  # pragma: no cover - runs in the forked child
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 65536)


def start() -> Pending:
    """Start making a network namespace for a job; :meth:`Pending.result` gives it."""
    if _LIBC is None:
        return Pending(f"not supported on {sys.platform}")
    uid, gid = os.geteuid(), os.getegid()
    read_end, write_end = os.pipe()
    hold_read, hold_write = os.pipe()  # the child waits on it until this process has opened its files
    channel, child_channel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    pid = _fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            # Nothing of this process's is kept while the child waits: another thread's lock (the
            # port registry's flock) would be held by the child's copy of its descriptor too.
            _close_all_but(write_end, hold_read, child_channel.fileno())
            _make(uid, gid)
            _send_diag(child_channel.fileno())
            os.write(write_end, b"ok\n")
            os.read(hold_read, 1)  # end of file once the parent is done
            os._exit(0)
        except BaseException as err:
            with contextlib.suppress(BaseException):
                os.write(write_end, (str(err)[:500] + "\n").encode())
            os._exit(1)
    os.close(write_end)
    os.close(hold_read)
    child_channel.close()
    return Pending(pid=pid, pipes=(read_end, hold_write), channel=channel)


def create() -> Network | str:
    """A new network namespace for a job, or why there can be none here (it is not entered: see
    :func:`verify`)."""
    return start().result()


def verify(network: Network, timeout: float = MAKE_TIMEOUT) -> str | None:
    """None when a child of this process can enter ``network`` (as every process of the job will);
    else why not. (The names probe, podnames.py, does the same on its way when it runs.)"""
    deadline = time.monotonic() + timeout
    read_end, write_end = os.pipe()
    pid = _fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(read_end)
            network.enter()
            os.write(write_end, b"ok\n")
            code = 0
        except BaseException as err:
            with contextlib.suppress(BaseException):
                os.write(write_end, (str(err)[:500] + "\n").encode())
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        answer = _answer(read_end, pid, deadline)
    finally:
        os.close(read_end)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    if answer == b"ok\n":
        return None
    if answer is None:
        return "entering the network namespace did not finish in time"
    return answer.decode(errors="replace").strip() or "entering the network namespace failed"
