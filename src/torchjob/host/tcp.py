"""This host's TCP sockets as Linux's /proc/net/tcp and tcp6 list them: who listens on a port,
and where the kernel's ephemeral ports (those outgoing connections take) begin.

Read directly, a table at a time: a port that nothing listens on (the common case, asked often
while a job runs) is told from the raw bytes without parsing a line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection

from torchjob.host import procfs
from torchjob.records import record

LISTEN = "0A"  # TCP_LISTEN in the tables' "st" column
TIME_WAIT = "06"
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
PORT_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


@record(frozen=True)
class Listener:
    port: int
    uid: int
    inode: int


Tables = Callable[[], list[bytes]]  # the tables to read (a network namespace's own, say)


def machine_tables() -> list[bytes]:
    """The tables of this process's network, IPv4 and IPv6; those that cannot be read left out."""
    found = []
    for table in TABLES:
        with contextlib.suppress(OSError):
            found.append(procfs.read(table))
    return found


def listening(ports: Collection[int], tables: Tables | None = None) -> list[Listener]:
    """The listening TCP sockets (IPv4 and IPv6) on any of ``ports``; [] where /proc cannot tell."""
    found: list[Listener] = []
    needles = [f":{port:04X} ".encode() for port in ports]  # as a local (or remote) address ends
    for data in (tables or machine_tables)():
        if not any(needle in data for needle in needles):
            continue  # the common case, read often while a job runs: nothing to parse
        for line in data.decode(errors="replace").splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN:
                continue
            with contextlib.suppress(ValueError):
                port = int(fields[1].rpartition(":")[2], 16)
                if port in ports:
                    found.append(Listener(port, int(fields[7]), int(fields[9])))
    return found


def states(port: int, tables: Tables | None = None) -> set[str]:
    """The states ("st": :data:`LISTEN`, :data:`TIME_WAIT`, ...) of the sockets whose local port is
    ``port``, IPv4 and IPv6. A socket only bound, neither listening nor connected, is in no table."""
    found = set()
    ending = f":{port:04X}"
    for data in (tables or machine_tables)():
        if f"{ending} ".encode() not in data:
            continue
        for line in data.decode(errors="replace").splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[1].endswith(ending):
                found.add(fields[3])
    return found


def ephemeral_low() -> int | None:
    """The first port of the kernel's ephemeral range; None where it cannot be read."""
    try:
        return int(procfs.read(PORT_RANGE).split()[0])
    except (OSError, ValueError, IndexError):
        return None
