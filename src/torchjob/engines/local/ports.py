"""Host ports for a job's declared ports, reserved so that concurrent local jobs never share one.

On a cluster a port belongs to a pod; here every pod shares the host, so each declared port (the
pytorch plugin's ``--port``, every ``containerPort``) gets a host port. A plugin's rendezvous port
(``MASTER_PORT``) always gets a random free one: the declared 23456 is what every other job on the
machine asks for too, and a port nobody can predict is one nobody takes between its reservation
and the master's ``bind`` by accident (or on purpose: wait-for-master also checks the listener's
uid). A ``containerPort`` keeps its declared number when it is free, else gets another free one.
Reservations live in a per-user registry guarded by ``flock``, so two jobs starting at the same
moment cannot pick the same port; an entry whose supervisor died is ignored. New ports are picked
below the kernel's ephemeral range, where outgoing connections do not take them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import time
from collections.abc import Collection, Iterator
from pathlib import Path

from torchjob.engines.local.admission import place
from torchjob.engines.local.state import process_alive, start_time
from torchjob.errors import Problem, SpecError
from torchjob.files import swap_in
from torchjob.host import tcp
from torchjob.plugins import build_plugins
from torchjob.spec.model import Job
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

_FALLBACK_RANGE = (20000, 32767)
LOCK_TIMEOUT = 10.0  # seconds to wait for the registry's lock, unless LOCK_TIMEOUT_ENV says
LOCK_TIMEOUT_ENV = "TORCHJOB_PORT_LOCK_TIMEOUT"
# Bounds of that setting: it changes how long to wait for the lock, never whether it is taken.
LOCK_TIMEOUT_RANGE = (0.1, 600.0)


def rendezvous_ports(job: Job) -> list[int]:
    """The plugins' ports (the pytorch plugin's ``--port``): the job's own, never reached from outside."""
    return [port for plugin in build_plugins(job) for port in plugin.ports(job)]


def declared_ports(job: Job) -> list[int]:
    """The ports the job's pods use, in a stable order: the plugins' ports, then container ports."""
    ports: list[int] = rendezvous_ports(job)
    for task in job.spec.tasks:
        for container in [*task.template.init_containers, *task.template.containers]:
            for entry in container.ports:
                port = entry.get("containerPort")
                if isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535:
                    ports.append(port)
    return list(dict.fromkeys(ports))


class RegistryError(SpecError):
    """The port registry cannot be used safely (or at all); one line, the registry's path first."""

    def __init__(self, where: Path, message: str) -> None:
        super().__init__([Problem("", message, str(where))])


def registry_dir() -> Path:
    """Per-user and independent of the job state directory, so every local job sees every other.

    ``$TORCHJOB_RUNTIME_DIR`` if set, else ``/tmp/torchjob-<uid>``, the same for every session of
    the user (an ssh login, a cron job, a service) whatever their ``XDG_RUNTIME_DIR`` or ``TMPDIR``
    say: two sessions with two registries could give two jobs the same port. (The local queue's
    private place is the same directory, ``admission/place.py``.) Whichever it is, it must be a real
    directory (not a symlink) owned by this user with mode 0700, or :class:`RegistryError` says so:
    in a shared ``/tmp`` another user can create the directory first and plant symlinks in it.
    """
    base = place.user_dir()
    _make_private_dir(base)
    return base


def _make_private_dir(path: Path) -> None:
    """Create ``path`` 0700 (parents as needed), or check that the existing one is this user's alone."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # ours, just made: the umask must not loosen or tighten it
        return
    except FileExistsError:
        pass
    except OSError as err:
        raise RegistryError(
            path, f"cannot create the port registry directory: {err.strerror or err}"
        ) from None
    try:
        info = os.lstat(path)
    except OSError as err:
        raise RegistryError(path, f"cannot use the port registry directory: {err.strerror or err}") from None
    _refuse_unless_private(path, info)


def _refuse_unless_private(path: Path, info: os.stat_result) -> None:
    fix = "remove it (or set TORCHJOB_RUNTIME_DIR to a private directory)"
    if stat.S_ISLNK(info.st_mode):
        raise RegistryError(path, f"the port registry directory is a symlink; refusing to use it: {fix}")
    if not stat.S_ISDIR(info.st_mode):
        raise RegistryError(path, f"the port registry directory is not a directory: {fix}")
    if info.st_uid != os.getuid():
        raise RegistryError(
            path,
            f"the port registry directory belongs to uid {info.st_uid}, not to you (uid {os.getuid()}); "
            f"refusing to use it: {fix}",
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        raise RegistryError(
            path,
            f"the port registry directory has mode {stat.S_IMODE(info.st_mode):04o}, expected 0700; "
            f"refusing to use it: {fix}",
        )


def check_registry() -> None:
    """Raise :class:`RegistryError` now, before a job is created, if the registry is unusable."""
    with _locked_registry(write=False):
        pass


def port_is_free(port: int) -> bool:
    """True when nothing listens on ``port`` on any local address (TCP, IPv4 and IPv6)."""
    import socket  # 1.2 ms that a job without ports does not pay

    for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            # SO_REUSEADDR so a port in TIME_WAIT counts as free, as it does for torch's TCPStore.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((addr, port))
        except OSError as err:
            if err.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                continue  # no IPv6 here
            return False
        finally:
            sock.close()
    return True


def _pick_range() -> tuple[int, int]:
    low = tcp.ephemeral_low()
    return (10000, low - 1) if low is not None and low > 12000 else _FALLBACK_RANGE


def _owner_alive(entry: dict[str, Any]) -> bool:
    try:
        return process_alive(int(entry["pid"]), float(entry["created"]))
    except (KeyError, ValueError, TypeError):
        return False


_OPEN_FLAGS = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


@contextlib.contextmanager
def _locked_registry(write: bool = True) -> Iterator[dict[str, Any]]:
    root = registry_dir()
    # Every file is opened relative to the checked directory and never through a symlink.
    try:
        dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | _OPEN_FLAGS)
    except OSError as err:
        raise RegistryError(root, f"cannot open the port registry directory: {err.strerror or err}") from None
    try:
        _refuse_unless_private(root, os.fstat(dir_fd))  # the directory opened is the one checked
        lock = _open_in(dir_fd, root, "ports.lock", os.O_RDWR | os.O_CREAT)
        try:
            _lock(lock, root / "ports.lock")
            data = _read_registry(dir_fd)
            yield data
            if write:
                _write_registry(dir_fd, root, data)
        finally:
            os.close(lock)  # and with it the lock
    finally:
        os.close(dir_fd)


def _open_in(dir_fd: int, root: Path, name: str, flags: int) -> int:
    try:
        return os.open(name, flags | _OPEN_FLAGS, 0o600, dir_fd=dir_fd)
    except OSError as err:
        raise RegistryError(root / name, f"cannot open the port registry: {err.strerror or err}") from None


def lock_timeout() -> float:
    """How long to wait for the registry's lock: ``$TORCHJOB_PORT_LOCK_TIMEOUT`` seconds when set
    (within ``LOCK_TIMEOUT_RANGE``, else SpecError), else ``LOCK_TIMEOUT``."""
    text = os.environ.get(LOCK_TIMEOUT_ENV)
    if text is None:
        return LOCK_TIMEOUT
    low, high = LOCK_TIMEOUT_RANGE
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not low <= seconds <= high:  # NaN too
        message = f"must be a number of seconds from {low:g} to {high:g}, got {text!r}"
        raise SpecError([Problem(LOCK_TIMEOUT_ENV, message, "<environment>")])
    return seconds


def _lock(fd: int, path: Path) -> None:
    timeout = lock_timeout()
    deadline = time.monotonic() + timeout
    while True:  # held for milliseconds by each job; never wait forever on a stuck holder
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise RegistryError(
                    path,
                    f"the port registry has been locked by another process for more than {timeout:g}s; "
                    "if no other torchjob is starting, find the holder with 'fuser' and stop it",
                ) from None
            time.sleep(0.01)


def _read_registry(dir_fd: int) -> dict[str, Any]:
    try:
        fd = os.open("ports.json", os.O_RDONLY | _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError:
        return {}  # none yet (or unreadable: start afresh, dead entries are dropped anyway)
    try:
        with os.fdopen(fd, "rb") as handle:
            data = json.loads(handle.read())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_registry(dir_fd: int, root: Path, data: dict[str, Any]) -> None:
    """Write a fresh temporary file (O_EXCL: never an existing one) and rename it over ports.json."""
    tmp = f"ports.json.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dir_fd)  # left by a process of ours that died with this pid
    fd = _open_in(dir_fd, root, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(data, indent=1, sort_keys=True))
    swap_in(tmp, "ports.json", dir_fd=dir_fd)  # (without ext4's flush of a rename over a file)


def _me() -> dict[str, Any]:
    return {"pid": os.getpid(), "created": start_time(os.getpid())}


def reserve(job_id: str, ports: list[int], unpredictable: Collection[int] = ()) -> dict[int, int]:
    """Map each declared port to a host port that is free and not reserved by a live job; those in
    ``unpredictable`` to a random one, never their declared number."""
    mapping: dict[int, int] = {}
    if not ports:
        return mapping
    owner = {**_me(), "job": job_id, "at": time.time()}
    with _locked_registry() as data:
        for key in [k for k, v in data.items() if not _owner_alive(v)]:
            del data[key]
        taken = {int(k) for k in data}
        low, high = _pick_range()
        for port in ports:
            keep = port not in unpredictable and port not in taken
            chosen = port if keep and port_is_free(port) else None
            tries = 0
            while chosen is None:
                # os.urandom rather than the random module, whose import a job start would pay
                candidate = low + int.from_bytes(os.urandom(4), "big") % (high - low + 1)
                tries += 1
                if candidate not in taken and candidate not in ports and port_is_free(candidate):
                    chosen = candidate
                elif tries > 2000:
                    raise OSError(f"no free host port found for port {port}")
            mapping[port] = chosen
            taken.add(chosen)
            data[str(chosen)] = {**owner, "declared": port}
    return mapping


def release(job_id: str) -> None:
    """Drop the job's reservations; quietly nothing when the registry cannot be used (the job is
    ending, and its entries die with its supervisor anyway)."""
    with contextlib.suppress(RegistryError), _locked_registry() as data:
        for key in [k for k, v in data.items() if v.get("job") == job_id or not _owner_alive(v)]:
            del data[key]
