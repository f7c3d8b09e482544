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
without libuv; so do Python's ``socket.create_server`` and asyncio), binds it all the same. Right
after a run the port's closed connections wait in TIME_WAIT, which only a bind with
``SO_REUSEADDR`` passes; when the TCP tables show nothing else on the port the claim binds so.
Two such sockets, neither listening, would not exclude each other, so every claim also holds a
lock named for its port (an abstract Unix socket, as per network namespace as the port): a second
claim fails on it whichever way the first bound. The claim is let go once a listener holds the
port (``/proc/net/tcp``), when the attempt it was made for is replaced, or at the controller's
end. A new attempt of the whole job (a restart) claims again: the port the last one used may have
been taken since.

Only the node the controller runs on can be held so (:func:`on_this_node`). When the master's pod
lands elsewhere (an ``salloc`` shell on a login node, a heterogeneous job whose master is not in
its first component), a step of the allocation on the master's node (``srun --overlap``, this
module as its program) chooses the same way and says its choice; its claims end with it, so
there another job may take the port before the master binds it. Where that step cannot run (or
says nothing within :data:`PROBE_TIMEOUT`), the ports are the declared ones, as before, and the
controller says so.
"""

from __future__ import annotations

# _socket, not socket: socket.py's enums cost 2 ms of the controller's start, before its first pod.
import _socket as socket
import errno
import json
import subprocess
import sys
import time

from torchjob.engines.slurm import clients
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    import random
    from collections.abc import Callable, Collection, Mapping
    from typing import Literal

LOWEST = 20000  # new ports are picked from here up to the kernel's ephemeral range
TRIES = 64  # random ports tried before the kernel is asked for any free one
WATCH_EVERY = 0.5  # seconds between two looks for the master's listener
PROBE_TIMEOUT = 30.0  # seconds the step choosing on another node may take
EPHEMERAL_LOW = 32768  # where the kernel's ephemeral range begins when it cannot be read


class Claim:
    """A port held: the socket bound to it, and the lock by which claims of the port meet."""

    def __init__(self, sock: socket.socket, lock: socket.socket | None) -> None:
        self.sock = sock
        self.lock = lock

    def close(self) -> None:
        self.sock.close()
        if self.lock is not None:
            self.lock.close()


def claim(port: int) -> Claim | None:
    """``port`` held on every local address, or None when something holds it: another claim, a
    listener, a connection; not the TIME_WAIT a closed one leaves (the last run's, say)."""
    lock = _lock(port)
    if lock is False:
        return None
    sock = _bind(port, reuse=False)
    if sock is None and lock is not None and _time_wait_alone(port):
        # Only with the lock: two sockets with SO_REUSEADDR, neither listening, do not meet.
        sock = _bind(port, reuse=True)
    if sock is None:
        if lock is not None:
            lock.close()
        return None
    # Now the master's listener, which sets SO_REUSEADDR before it binds, may join it.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return Claim(sock, lock)


def _lock(port: int) -> socket.socket | Literal[False] | None:
    """An abstract Unix socket named for ``port``: as the port's, its name is one per network
    namespace and is let go when its process dies. False when another claim holds it; None where
    none can be made (then a port in TIME_WAIT is not claimed: nothing would tell two claims apart)."""
    try:
        lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError:
        return None
    try:
        lock.bind(f"\0torchjob-port-{port}".encode())
    except OSError as err:
        lock.close()
        return False if err.errno == errno.EADDRINUSE else None
    return lock


def _bind(port: int, *, reuse: bool) -> socket.socket | None:
    """A socket bound to ``port`` on every address (IPv6 and IPv4), or None when the port is held."""
    families = [socket.AF_INET6, socket.AF_INET] if socket.has_ipv6 else [socket.AF_INET]
    for family in families:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            if family == socket.AF_INET6:  # one socket for IPv6 and IPv4 alike
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            if reuse:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("::" if family == socket.AF_INET6 else "", port))
        except OSError as err:
            sock.close()
            if err.errno == errno.EADDRINUSE:
                return None
            continue  # no IPv6 on this host after all: IPv4 alone
        return sock
    return None


def _time_wait_alone(port: int) -> bool:
    """Whether the sockets on ``port`` that the TCP tables list are all closed connections'
    TIME_WAIT (which SO_REUSEADDR binds over): no listener, no live connection."""
    from torchjob.host import tcp

    return tcp.states(port) == {tcp.TIME_WAIT}


def on_this_node(host: str, environ: Mapping[str, str]) -> bool:
    """Whether Slurm's node ``host`` is the machine this process runs on, so that the master's
    ports there are claimed and held here, without a step on it.

    A batch script knows its node (``SLURMD_NODENAME``). An ``salloc`` shell does not: it runs
    where salloc was called, often a node of the allocation itself, and there the node named as
    this machine's short host name is this machine (a node's name is its ``hostname -s`` unless
    slurm.conf gives it another NodeHostname).
    """
    node = environ.get("SLURMD_NODENAME")
    if node:
        return host == node
    return host == socket.gethostname().split(".")[0]


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
        remote: Callable[[list[int], set[int]], dict[int, int] | None] | None = None,
    ) -> None:
        self.declared = declared  # the plugins' ports (what addressing.port is asked for)
        self.avoid = set(avoid)  # the job's own ports on the master's node (other pods' slots)
        self.local = local  # the controller runs on the master's node: its ports can be probed
        self.say = say
        self.rng = rng  # made when a port is taken: most jobs never need one
        self.version: int | None = None
        self.chosen: dict[int, int] = {}  # declared -> the port of this attempt
        self.held: dict[int, Claim] = {}  # chosen port -> its claim
        self.looked_at = 0.0
        self.remote = remote  # chooses on the master's node when the controller is not there

    def for_version(self, version: int) -> dict[int, int]:
        """The ports of the job's attempt ``version``: claimed anew for a new attempt."""
        if version == self.version:
            return self.chosen
        self.release()
        self.version = version
        if not self.declared:
            self.chosen = {}
        elif self.local:
            self.chosen = {port: self._claim(port) for port in self.declared}
        else:
            found = self.remote(self.declared, self.avoid) if self.remote is not None else None
            if found is None or set(found) != set(self.declared):
                found = {port: port for port in self.declared}
                self.say(
                    "the master's node could not be probed for its ports: they are the declared "
                    f"ones ({', '.join(map(str, self.declared))})"
                )
            for declared, port in found.items():
                if port != declared:
                    self.say(
                        f"port {declared} is in use on the master's node: the master gets {port} instead"
                    )
            self.chosen = found
        return self.chosen

    def choose_here(self) -> dict[int, int]:
        """The ports this node would give (the remote step's answer); its claims end with it."""
        try:
            return {port: self._claim(port) for port in self.declared}
        finally:
            self.release()

    def _claim(self, declared: int) -> int:
        sock = claim(declared)
        if sock is not None:
            self.held[declared] = sock
            return declared
        import random

        from torchjob.host import tcp

        rng = self.rng = self.rng or random.Random()
        low = tcp.ephemeral_low()
        high = EPHEMERAL_LOW if low is None else low
        taken = self.avoid | set(self.held) | set(self.declared)
        for _ in range(TRIES):
            port = rng.randrange(LOWEST, high) if high > LOWEST else rng.randrange(1024, 65536)
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
        from torchjob.host import tcp

        for port in {sock.port for sock in tcp.listening(set(self.held))}:
            self.held.pop(port).close()

    def release(self) -> None:
        for sock in self.held.values():
            sock.close()
        self.held.clear()


def probe_on(
    job_id: str, host: str, component: int | None, environ: dict[str, str]
) -> Callable[[list[int], set[int]], dict[int, int] | None]:
    """The ports as a step of the allocation on ``host`` chooses them, or None when it cannot."""

    def probe(declared: list[int], avoid: set[int]) -> dict[int, int] | None:
        asked = json.dumps({"declared": declared, "avoid": sorted(avoid)})
        try:
            argv = [clients.client("srun"), f"--jobid={job_id}"]
            argv += [f"--het-group={component}"] if component is not None else []
            argv += [f"--nodelist={host}", "--nodes=1", "--ntasks=1", "--overlap", "--quiet"]
            argv += ["--job-name=torchjob-ports", "--", sys.executable, "-m", __name__, asked]
            done = subprocess.run(
                argv,
                env=clients.step_env(environ),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT,
                check=False,
            )
            lines = done.stdout.strip().splitlines()
            answer = json.loads(lines[-1]) if done.returncode == 0 and lines else None
            return {int(k): int(v) for k, v in answer.items()} if isinstance(answer, dict) else None
        except (clients.SlurmError, OSError, subprocess.TimeoutExpired, ValueError, AttributeError):
            return None

    return probe


def main(argv: list[str]) -> int:
    """On the master's node: ``{"declared": [...], "avoid": [...]}`` in, ``{declared: port}`` out."""
    asked = json.loads(argv[0])
    ports = MasterPorts(
        [int(p) for p in asked["declared"]], [int(p) for p in asked["avoid"]], local=True, say=lambda _: None
    )
    print(json.dumps(ports.choose_here()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
