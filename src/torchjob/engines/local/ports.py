"""Host ports for a job's declared ports, reserved so that concurrent local jobs never share one.

On a cluster a port belongs to a pod; here every pod shares the host, so each declared port (the
pytorch plugin's ``--port``, every ``containerPort``) gets a host port: the declared one when it is
free, else another free one. Reservations live in a per-user registry guarded by ``flock``, so
two jobs starting at the same moment cannot pick the same port; an entry whose supervisor died
is ignored. New ports are picked below the kernel's ephemeral range, where outgoing connections
do not take them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torchjob.engines.local.state import process_alive, start_time
from torchjob.files import write_atomic
from torchjob.plugins import build_plugins
from torchjob.spec.model import Job

_FALLBACK_RANGE = (20000, 32767)
LOCK_TIMEOUT = 10.0


def declared_ports(job: Job) -> list[int]:
    """The ports the job's pods use, in a stable order: the plugins' ports, then container ports."""
    ports: list[int] = [port for plugin in build_plugins(job) for port in plugin.ports(job)]
    for task in job.spec.tasks:
        for container in [*task.template.init_containers, *task.template.containers]:
            for entry in container.ports:
                port = entry.get("containerPort")
                if isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535:
                    ports.append(port)
    return list(dict.fromkeys(ports))


def registry_dir() -> Path:
    """Per-user and independent of the job state directory, so every local job sees every other."""
    base = Path(os.environ.get("TORCHJOB_RUNTIME_DIR") or Path(_temp_dir()) / f"torchjob-{os.getuid()}")
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    return base


def _temp_dir() -> str:
    # tempfile.gettempdir's order of choices, without importing tempfile before the first pod.
    for name in ("TMPDIR", "TEMP", "TMP"):
        value = os.environ.get(name)
        if value and os.path.isdir(value):
            return value
    return "/tmp"


def port_is_free(port: int) -> bool:
    """True when nothing listens on ``port`` on any local address (TCP, IPv4 and IPv6)."""
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
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_RANGE
    return (10000, low - 1) if low > 12000 else _FALLBACK_RANGE


def _owner_alive(entry: dict[str, Any]) -> bool:
    try:
        return process_alive(int(entry["pid"]), float(entry["created"]))
    except (KeyError, ValueError, TypeError):
        return False


@contextlib.contextmanager
def _locked_registry() -> Iterator[dict[str, Any]]:
    root = registry_dir()
    with open(root / "ports.lock", "a+") as lock:
        deadline = time.monotonic() + LOCK_TIMEOUT
        while True:  # held for milliseconds by each job; never wait forever on a stuck holder
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise OSError(f"the port registry {root / 'ports.lock'} stays locked") from None
                time.sleep(0.01)
        path = root / "ports.json"
        try:
            data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        except (OSError, ValueError):
            data = {}
        yield data
        write_atomic(path, json.dumps(data, indent=1, sort_keys=True))


def _me() -> dict[str, Any]:
    return {"pid": os.getpid(), "created": start_time(os.getpid())}


def reserve(job_id: str, ports: list[int]) -> dict[int, int]:
    """Map each declared port to a host port that is free and not reserved by a live job."""
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
            chosen = port if port not in taken and port_is_free(port) else None
            tries = 0
            while chosen is None:
                import random  # only when a declared port is taken

                candidate = random.randint(low, high)
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
    with _locked_registry() as data:
        for key in [k for k, v in data.items() if v.get("job") == job_id or not _owner_alive(v)]:
            del data[key]
