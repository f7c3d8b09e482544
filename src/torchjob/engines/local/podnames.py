"""Pod names that resolve locally: every container process sees its pod's own ``/etc/hosts``.

On a cluster ``<hostname>.<subdomain>`` is a DNS name. Here each container process is started in
a mount namespace of its own (Linux), where ``/etc/hosts`` is a bind mount of its pod's hosts file:
the machine's ``/etc/hosts``, one line per pod of the job, then the pod's ``hostAliases``. Each pod
attempt has a file of its own, as each pod on a cluster has, so what one pod writes there no other
pod sees. Without root the mount namespace comes
with a user namespace that maps the user's uid and gid to themselves, so ids, file access and
signals stay as they were. Namespaces and mounts belong to the processes and vanish with them.

Whether this works is probed once per job in a short-lived child; when it does not (another
system, user namespaces disabled, ``TORCHJOB_POD_DNS=0``) the engine gives addresses instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence

from torchjob.engines.local.libc import LIBC
from torchjob.records import record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

SWITCH = "TORCHJOB_POD_DNS"  # "0" turns names off
ETC_HOSTS = "/etc/hosts"
PROBE_TIMEOUT = 3.0  # seconds

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWUSER = 0x10000000
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 0x40000
_PR_SET_DUMPABLE = 4
_MS_RDONLY = 0x1
_MS_REMOUNT = 0x20
# statvfs's f_flag bit -> the mount flag that keeps it (most have the same value; relatime not)
_KEPT_FLAGS = ((0x2, 0x2), (0x4, 0x4), (0x8, 0x8), (0x400, 0x400), (0x800, 0x800), (0x1000, 0x200000))


def hostname_of(pod_name: str, pod_spec: dict[str, Any]) -> str:
    """The pod's host name as the kubelet gives it: ``spec.hostname``, else the pod's name cut to
    63 characters (a host name's most) without a trailing ``-`` or ``.``."""
    return str(pod_spec.get("hostname") or pod_name[:63].rstrip("-."))


# NCCL tells hosts apart by this variable, else by the host name and the boot's id: with a host
# name of its own each pod would be a host of its own to NCCL, and ranks on this machine's GPUs
# would talk over the network instead of shared memory and NVLink. Pods that get their own host
# name get the machine's identity as NCCL reads it outside a pod (a container's own value wins).
NCCL_HOST = "NCCL_HOSTID"


def machine_identity(boot_id: str = "/proc/sys/kernel/random/boot_id") -> str:
    """NCCL's host identity of a process of this machine that keeps its host name: the host
    name, then the boot id's first word."""
    try:
        with open(boot_id) as source:
            boot = (source.read().split() or [""])[0]
    except OSError:
        boot = ""
    return os.uname().nodename + boot


def hosts_text(machine: str, entries: Iterable[tuple[str, Sequence[str]]]) -> str:
    """The machine's hosts file, then ``<address> <name>...`` per pod, each name listed once."""
    lines = [machine.rstrip("\n")] if machine.strip() else []
    lines.append("# pods of this torchjob job")
    seen: set[str] = set()
    for address, names in entries:
        fresh = [n for n in dict.fromkeys(names) if n and n not in seen]
        seen.update(fresh)
        if fresh:
            lines.append(" ".join([address, *fresh]))
    return "\n".join(lines) + "\n"


def with_aliases(text: str, aliases: object) -> str:
    """A pod's hosts file: the job's, then its ``hostAliases`` as the kubelet appends them (validated
    before: IP addresses and DNS names only, so no entry can add a line of its own)."""
    lines = []
    for alias in aliases if isinstance(aliases, list) else []:
        if not isinstance(alias, dict) or not isinstance(alias.get("ip"), str):
            continue
        hostnames = [n for n in alias.get("hostnames") or [] if isinstance(n, str)]
        if hostnames:
            lines.append("\t".join([alias["ip"], *hostnames]))
    if not lines:
        return text
    return text + "\n# Entries added by HostAliases.\n" + "\n".join(lines) + "\n"


def _libc() -> ctypes.CDLL | None:
    """The C library with ``unshare`` and ``mount`` typed, or None."""
    if LIBC is None:
        return None
    try:
        LIBC.unshare.argtypes = [ctypes.c_int]
        LIBC.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
        LIBC.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    except AttributeError:
        return None
    return LIBC


@record(frozen=True)
class HostsMount:
    """How to give a process ``source`` as its ``/etc/hosts``; everything precomputed for the child."""

    source: bytes
    uid_map: bytes
    gid_map: bytes
    # First try a mount namespace alone, which root may have, and so may a process in its job's user
    # namespace (netns.py); else (or False) with a user namespace of its own.
    alone: bool = True
    read_only: int = 0  # mount flags to remount the bind mount read-only with; 0: left writable
    # The pod's host name, in a UTS namespace of its own as a container has it (b"": the machine's,
    # for a view several pods share): torchrun's c10d rendezvous hosts its store in the agent whose
    # host name is the endpoint's, and gloo binds to the address its host name resolves to.
    hostname: bytes = b""

    @classmethod
    def of(cls, source: str, read_only: bool = False, hostname: str = "") -> HostsMount:
        uid, gid = os.geteuid(), os.getegid()
        return cls(
            os.fsencode(os.path.abspath(source)),
            f"{uid} {uid} 1".encode(),
            f"{gid} {gid} 1".encode(),
            read_only=_read_only_flags(source) if read_only else 0,
            hostname=hostname.encode(),
        )

    def enter(self) -> None:
        """Called in the forked child before exec: new namespaces, then the bind mount.

        Raises OSError. The child is single-threaded here, which ``unshare`` of a user namespace needs.
        """
        libc = _LIBC
        if libc is None:
            raise OSError("no libc")
        flags = _CLONE_NEWNS | (_CLONE_NEWUTS if self.hostname else 0)
        if not (self.alone and libc.unshare(flags) == 0):
            # Not root, or root without CAP_SYS_ADMIN (a container): a user namespace grants it.
            if libc.unshare(_CLONE_NEWUSER | flags) != 0:
                _raise("unshare")
            # A process that changed its ids is not dumpable, so /proc/self/*_map would be root's.
            libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
            with contextlib.suppress(FileNotFoundError):  # kernels before 3.19 have no such file
                _write(b"/proc/self/setgroups", b"deny")
            _write(b"/proc/self/uid_map", self.uid_map)
            _write(b"/proc/self/gid_map", self.gid_map)
        # Private, so that the bind mount never propagates back to the machine's namespace.
        if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
            _raise("mount --make-rprivate /")
        if libc.mount(self.source, ETC_HOSTS.encode(), None, _MS_BIND, None) != 0:
            _raise("mount --bind /etc/hosts")
        if self.read_only:  # a view several pods share: none of them may change it for the others
            # A failure leaves it writable, as a pod's own view is; the job still runs.
            libc.mount(None, ETC_HOSTS.encode(), None, self.read_only, None)
        if self.hostname and libc.sethostname(self.hostname, len(self.hostname)) != 0:
            _raise("sethostname")


def _read_only_flags(source: str) -> int:
    """``MS_REMOUNT | MS_BIND | MS_RDONLY`` plus the flags of the file system holding ``source``:
    inside a user namespace a remount must keep them (nosuid, nodev, ... are locked)."""
    try:
        have = os.statvfs(source).f_flag
    except OSError:
        have = 0
    flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
    for st_flag, ms_flag in _KEPT_FLAGS:
        if have & st_flag:
            flags |= ms_flag
    return flags


_LIBC = _libc()


def _raise(what: str) -> None:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def _write(path: bytes, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def probe(mount: HostsMount, timeout: float = PROBE_TIMEOUT) -> str | None:
    """None when a child can enter ``mount`` and then reads the job's file as /etc/hosts; else why not."""
    return start_probe(mount).result(timeout)


class Probe:
    """A probe running in a child, so the supervisor can prepare the rest of the job meanwhile."""

    def __init__(
        self, reason: str | None = None, pid: int = 0, pipe: int = -1, entered: bool = False
    ) -> None:
        self._reason = reason  # known without a child: the answer
        self._pid = pid
        self._pipe = pipe
        self.entered = entered  # its child ran the ``before`` it was given (the job's network)

    def result(self, timeout: float = PROBE_TIMEOUT) -> str | None:
        """Wait for the child (at most ``timeout`` s): None if names resolve, else why not."""
        if self._pid == 0:
            return self._reason
        pid, read_end, self._pid = self._pid, self._pipe, 0
        try:
            deadline = time.monotonic() + timeout
            status: int | None = None
            while status is None:
                done, raw = os.waitpid(pid, os.WNOHANG)
                if done:
                    status = raw
                elif time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    self._reason = f"the namespace probe did not finish in {timeout:g}s"
                    return self._reason
                else:  # the pipe reads end-of-file as the child exits
                    select.select([read_end], [], [], 0.01)
            reason = b""
            with contextlib.suppress(OSError):
                reason = os.read(read_end, 1000)
        finally:
            os.close(read_end)
        if os.waitstatus_to_exitcode(status) != 0:
            self._reason = reason.decode(errors="replace") or f"the namespace probe failed (status {status})"
        return self._reason


def start_probe(mount: HostsMount, before: Callable[[], None] | None = None) -> Probe:
    """Start checking, in a child, whether ``mount`` works here (after ``before``, as the job's
    processes enter their network first); :meth:`Probe.result` tells."""
    if os.environ.get(SWITCH, "").strip().lower() in ("0", "false", "no", "off"):
        return Probe(f"{SWITCH}=0")
    if _LIBC is None:
        return Probe(f"not supported on {sys.platform}")
    if not os.path.exists(ETC_HOSTS):
        return Probe(f"{ETC_HOSTS} does not exist")
    try:
        with open(mount.source, "rb") as handle:
            expected = handle.read()
    except OSError as err:
        return Probe(f"cannot read the job's hosts file: {err}")
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():  # the child only makes system calls, so threads cannot hurt it
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(read_end)
            if before is not None:
                before()
            mount.enter()
            fd = os.open(ETC_HOSTS, os.O_RDONLY)
            seen = os.read(fd, len(expected) + 1)
            if seen != expected:
                raise OSError("the bind mount did not take effect")
            code = 0
        except BaseException as err:  # every failure is a reason for the parent
            with contextlib.suppress(BaseException):
                os.write(write_end, str(err).encode()[:500])
        finally:
            os._exit(code)
    os.close(write_end)
    return Probe(pid=pid, pipe=read_end, entered=before is not None)
