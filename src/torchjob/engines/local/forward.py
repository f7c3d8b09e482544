"""The ports a job declares, reached from this machine although the job has a network of its own.

A job in its own network namespace (``netns.py``) cannot be reached from outside it: that is the
point for its rendezvous port (the c10d store), and a problem for a port the user means to open
(TensorBoard's 6006 as a ``containerPort``). So every declared port but the plugins' rendezvous
ports is forwarded: this process binds each of them on this machine, at ``127.0.0.1`` and at the
address of every pod whose containers declare it, where a job without a namespace would have
listened, and hands the sockets to a small forwarder (``forwarder.py``) that runs in the job's
network and connects each accepted connection to the same address and port there. It forwards
only connections from the user's own processes (and from the uids the job's pods run as), read
from this machine's ``/proc/net/tcp``: other local users reach nothing of the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path

from torchjob.engines.local import process
from torchjob.engines.local.netns import Network

SCRIPT = str(Path(__file__).with_name("forwarder.py"))
LOG = "forward.log"  # in the job directory


class Forwarder:
    """The forwarder process of one job and the pipe whose end of file ends it."""

    def __init__(self, proc: subprocess.Popen[bytes], control: int, where: list[str]) -> None:
        self.proc = proc
        self.control = control
        self.where = where  # "address:port" forwarded, for the status

    def close(self) -> None:
        if self.control >= 0:
            with contextlib.suppress(OSError):
                os.close(self.control)
            self.control = -1
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(1.0)


def start(
    network: Network,
    places: Collection[tuple[str, int]],
    uids: Collection[int],
    job_id: str,
    job_dir: Path,
) -> tuple[Forwarder | None, list[str]]:
    """Bind ``places`` (address, port) here and start forwarding them into ``network``; the
    forwarder (None when nothing could be bound) and one line per place that could not be."""
    problems: list[str] = []
    bound: list[tuple[socket.socket, str, int]] = []
    for address, port in places:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed connection's TIME_WAIT
            sock.bind((address, port))
            sock.listen(64)
        except OSError as err:
            sock.close()
            problems.append(
                f"port {port} cannot be reached at {address} from this machine: {err.strerror or err}"
            )
            continue
        bound.append((sock, address, port))
    if not bound:
        return None, problems
    table = os.open("/proc/self/net/tcp", os.O_RDONLY | os.O_CLOEXEC)  # this machine's network
    control_read, control = os.pipe()
    spec = {
        "listeners": [[sock.fileno(), address, port] for sock, address, port in bound],
        "table": table,
        "uids": sorted(set(uids)),
        "control": control_read,
    }
    fds = (table, control_read, *(sock.fileno() for sock, _, _ in bound))

    def before_exec() -> None:  # pragma: no cover - runs in the forked child
        os.setpgid(0, 0)  # a terminal's Ctrl-C is the supervisor's to handle
        process.die_with_parent()
        network.enter()

    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        with open(os.open(job_dir / LOG, flags, 0o600), "ab", buffering=0) as log:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", SCRIPT, json.dumps(spec)],
                env={process.MARKER: job_id},  # the job's: its end (or the watchdog) sweeps it
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                close_fds=True,
                pass_fds=fds,
                preexec_fn=before_exec,
            )
    except (OSError, subprocess.SubprocessError) as err:
        os.close(control)
        problems.append(f"declared ports cannot be reached from this machine: {err}")
        return None, problems
    finally:
        os.close(table)
        os.close(control_read)
        for sock, _, _ in bound:
            sock.close()
    return Forwarder(proc, control, [f"{address}:{port}" for _, address, port in bound]), problems
