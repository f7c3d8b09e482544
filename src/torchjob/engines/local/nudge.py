"""Waking torchjob's own waiting helpers when one of the job's ports starts listening.

The wait-for-master init container polls for the master's port in a shell loop. Each poll forks
a read of /proc/net/tcp and tcp6 (3.4 ms of the kernel's time each here: it walks TCP tables every
network shares) and a ``sleep``; at the 20 ms the engine once set, that was a third of a core taken
from the ranks importing torch on the same cores. Now the script naps a second
(``creation.NUDGED_INTERVAL``) and the supervisor watches instead, between its loop's passes, every
``NUDGE_EVERY`` seconds while such a helper runs (``WARMING_EVERY`` while its pod's warm processes
still import): it asks the job's network for its listening sockets (``network.JobNetwork.listeners``:
a sock_diag socket made inside the job's own namespace, or this process's on the machine's network;
tens of microseconds, as only the listening sockets are walked) and, when a socket starts
listening on one of the job's ports, sends each helper's shell
SIGWINCH, which ends its nap: it probes again at once (``plugins/waitmaster.py``). A nudge only
makes the script look; whether the listener is the master, and the job's, it still decides itself.
Where netlink is refused (a seccomp filter) there are no nudges and the script keeps the short
poll.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Mapping

from torchjob.controller.kubelet import Pod
from torchjob.engines.local import prewarm, runner
from torchjob.engines.local.creation import PodFactory
from torchjob.engines.local.waiter import Look

NUDGE_EVERY = 0.01  # seconds between looks at the job's listeners while a helper waits
# While every waiting pod's main is a warm process still importing (prewarm.py), seldom: each look
# wakes this process on a core where a rank imports torch (about 0.2 ms of CPU each, measured), and
# a worker that is not warm yet could not start any sooner. A warm process says when its imports
# are done; the master, importing the same modules, is then about to listen: from then on, often.
WARMING_EVERY = 0.05
WARM_EVERY = 0.005


class Nudges:
    def __init__(self, pods: Mapping[tuple[str, int], Pod], factory: PodFactory) -> None:
        self.pods = pods
        self.factory = factory  # its network and ports are decided as the job starts
        self.seen: frozenset[int] = frozenset()  # the listening sockets at the last look

    def look(self) -> Look | None:
        """Nudge the waiting helpers if a socket began listening on one of the job's ports since
        the last look; when to look next, or None while no helper waits (or the job's listeners
        cannot be asked for)."""
        helpers, cold, warming, heard = self._waiting()
        found = self.factory.net.listeners() if helpers else None
        if found is None:
            # Anything listening when a helper next starts is news to it: its first probe may
            # have come just before.
            self.seen = frozenset()
            return None
        ports = {*self.factory.ports, *self.factory.ports.values()}  # declared, and as mapped
        now = frozenset(sock.inode for sock in found if sock.port in ports)
        if now - self.seen:
            for pid in helpers:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGWINCH)
        self.seen = now
        if heard:
            return Look(WARM_EVERY)
        if cold or not warming:
            return Look(NUDGE_EVERY)
        return Look(WARMING_EVERY, warming)  # and at once when one of them says it is warm

    def _waiting(self) -> tuple[list[int], bool, tuple[int, ...], bool]:
        """The main processes of the running helper init containers (not yet reaped: the pid is
        still theirs); whether one of their pods has no warm process (nothing tells when its
        master may listen); the sockets of their warm processes still importing; whether one of
        those said it is done."""
        found: list[int] = []
        warming: list[int] = []
        cold = heard = False
        for pod in self.pods.values():
            if pod.terminating or pod.mains_started:
                continue
            waits = False
            for c in pod.inits:
                proc = runner.of(c).proc if c.running else None
                if proc is not None and proc.returncode is None and runner.of(c).run.helper:
                    found.append(proc.pid)
                    waits = True
            if not waits:
                continue
            warms = [w for w in (runner.of(c).warm for c in pod.mains) if w is not None]
            cold = cold or not warms
            for warm in warms:
                if prewarm.hear(warm):
                    heard = True
                else:
                    warming.append(warm.go)
        return found, cold, tuple(warming), heard
