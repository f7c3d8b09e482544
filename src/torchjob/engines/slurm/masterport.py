"""The master's port on its node, chosen once the allocation runs: the declared one when it is free.

On Kubernetes each pod has an address of its own; on Slurm the master pod shares its node with
whatever else runs there (another job of a non-exclusive partition, another user's), and every
job that declares ``--port=23456`` asks for the same number. So the controller, on the batch host,
claims each of the plugins' ports (``MASTER_PORT``, a torchrun rendezvous port) on the master's
node before the master's pod is made: the declared port when nothing holds it (a job alone on its
node sees no change), else a random free one below the kernel's ephemeral range (where outgoing
connections do not take it, and where two jobs choosing at the same moment seldom meet).

A claim is a socket bound to the port on every address without ``SO_REUSEADDR`` (so it fails
when anything holds the port, even a socket that only bound it), then switched to
``SO_REUSEADDR`` and kept: another controller's claim of the same port fails meanwhile, while the
master's own listener, which sets ``SO_REUSEADDR`` before it binds (torch's TCPStore does, with or
without libuv; so do Python's ``socket.create_server`` and asyncio), binds it all the same. The
claim is let go once a listener holds the port (``/proc/net/tcp``), when the attempt it was made
for is replaced, or at the controller's end. A new attempt of the whole job (a restart) claims
again: the port the last one used may have been taken since.

Only the node the controller runs on can be probed so; when the master's pod lands elsewhere
(an allocation made by ``salloc``, a heterogeneous job whose master is not in its first
component) its ports are the declared ones, as before, and the controller says so.
"""

from __future__ import annotations

import contextlib
import errno
import random
import socket
import time
from pathlib import Path

from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterable

LOWEST = 20000  # new ports are picked from here up to the kernel's ephemeral range
TRIES = 64  # random ports tried before the kernel is asked for any free one
WATCH_EVERY = 0.5  # seconds between two looks for the master's listener
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column


def claim(port: int) -> socket.socket | None:
    """A socket holding ``port`` on every local address, or None when something holds it."""
    families = [socket.AF_INET6, socket.AF_INET] if socket.has_ipv6 else [socket.AF_INET]
    for family in families:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            if family == socket.AF_INET6:  # one socket for IPv6 and IPv4 alike
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(("::" if family == socket.AF_INET6 else "", port))
        except OSError as err:
            sock.close()
            if err.errno == errno.EADDRINUSE:
                return None
            continue  # no IPv6 on this host after all: IPv4 alone
        # Bound without SO_REUSEADDR, so nothing held it; now the master's listener may join it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        return sock
    return None


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def listening(ports: Collection[int], tables: Iterable[str] = TABLES) -> set[int]:
    """Which of ``ports`` a socket of this host's network listens on."""
    found: set[int] = set()
    for table in tables:
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 3 and fields[3] == _LISTEN:
                    port = int(fields[1].rsplit(":", 1)[1], 16)
                    if port in ports:
                        found.add(port)
    return found


class MasterPorts:
    """The ports the master's pod listens on for an attempt of the job, held until it does."""

    def __init__(
        self,
        declared: list[int],
        avoid: Collection[int],
        *,
        local: bool,
        say: Callable[[str], None],
        rng: random.Random | None = None,
    ) -> None:
        self.declared = declared  # the plugins' ports (what addressing.port is asked for)
        self.avoid = set(avoid)  # the job's own ports on the master's node (other pods' slots)
        self.local = local  # the controller runs on the master's node: its ports can be probed
        self.say = say
        self.rng = rng or random.Random()
        self.version: int | None = None
        self.chosen: dict[int, int] = {}  # declared -> the port of this attempt
        self.held: dict[int, socket.socket] = {}  # chosen port -> its claim
        self.looked_at = 0.0

    def for_version(self, version: int) -> dict[int, int]:
        """The ports of the job's attempt ``version``: claimed anew for a new attempt."""
        if version == self.version:
            return self.chosen
        self.release()
        self.version = version
        if not self.local:
            self.chosen = {port: port for port in self.declared}
            if self.declared and version == 0:
                self.say(
                    "the master's pod runs on another node than the controller: its ports are the "
                    f"declared ones ({', '.join(map(str, self.declared))}), not probed"
                )
            return self.chosen
        self.chosen = {}
        for port in self.declared:
            self.chosen[port] = self._claim(port)
        return self.chosen

    def _claim(self, declared: int) -> int:
        sock = claim(declared)
        if sock is not None:
            self.held[declared] = sock
            return declared
        high = ephemeral_low()
        taken = self.avoid | set(self.held) | set(self.declared)
        for _ in range(TRIES):
            port = self.rng.randrange(LOWEST, high) if high > LOWEST else self.rng.randrange(1024, 65536)
            if port in taken:
                continue
            sock = claim(port)
            if sock is not None:
                self.held[port] = sock
                self.say(f"port {declared} is in use on the master's node: the master gets {port} instead")
                return port
        self.say(f"port {declared} is in use on the master's node and no free port was found: kept")
        return declared

    def watch(self, now: float | None = None) -> None:
        """Let go of each claim whose port the master now listens on (looked at twice a second)."""
        if not self.held:
            return
        now = time.monotonic() if now is None else now
        if now - self.looked_at < WATCH_EVERY:
            return
        self.looked_at = now
        for port in listening(set(self.held)):
            self.held.pop(port).close()

    def release(self) -> None:
        for sock in self.held.values():
            sock.close()
        self.held.clear()
