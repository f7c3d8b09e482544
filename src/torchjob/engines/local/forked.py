"""The processes a fork server (forkserver.py) makes the engine's children: a container's
(:class:`Forked`) and, for the warm pool, spares forked ahead of the next job (:class:`Spares`).

A fork of a process that imported torch copies its page tables: several milliseconds each on a
small machine, one container after another, while the job's ranks wait for the last of them. A
server kept from one job to the next (pool.py) is asked, once none of the containers it forked
runs any more (a job's ranks have all ended), for a spare per container that ended (up to
``MAX_SPARES``); the spare is forked then, waits idle in the server's session, and is handed the
next container's request, so that the fork is off that container's start. A spare is never a
container until it is handed one (it then starts a session of its own, as every container does,
before it runs anything); it ends with its server.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable

SPARE = b"spare..."  # forkserver.SPARE: the 8-byte head of a request that asks for a spare
MAX_SPARES = 8  # spares kept at most, whatever the size of the last job


class Forked:
    """A container's process forked by the server and reparented to this process: waited for as a
    ``subprocess.Popen`` child is (``pid``, ``returncode``, ``poll``, ``wait``)."""

    def __init__(self, pid: int, ended: Callable[[int], None] | None = None) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.ended = ended  # told once, as the process is found to have ended

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else: its status is lost
                pid, status = self.pid, 255 << 8
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                if self.ended is not None:
                    self.ended(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired([str(self.pid)], timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode


class Spares:
    """A server's spares as this process knows them: their pids (told by the server's ``spare
    <pid>`` replies, which come among its answers to containers), how many were asked for and not
    yet told of; the containers forked that still run, and how many ended since the last ask."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.asked = 0
        self.possible = True  # False once the server said it cannot (no clone: nospare)
        self.running: set[int] = set()
        self.ended = 0

    def took(self, pid: int) -> None:
        """A container's process was forked, or handed to the spare ``pid``."""
        self.running.add(pid)
        if pid in self.pids:
            self.pids.remove(pid)

    def finished(self, pid: int, requests: int) -> None:
        """A container forked from the server ended; once none runs (the job's ranks have all
        ended: a fork now takes no CPU from them), a spare is asked for each that ended."""
        self.running.discard(pid)
        self.ended += 1
        if not self.running:
            self.ask(requests, self.ended)
            self.ended = 0

    def told(self, line: bytes) -> bool:
        """Take note of a reply line about spares; False for any other line (a container's answer)."""
        if line.startswith(b"gone "):  # a spare that died idle (killed): reaped here, its pid freed
            pid = int(line[5:])
            if pid in self.pids:
                self.pids.remove(pid)
            reap([pid])
            return True
        if line != b"nospare" and not line.startswith(b"spare "):
            return False
        self.asked = max(0, self.asked - 1)
        if line == b"nospare":
            self.possible = False
        else:
            self.pids.append(int(line[6:]))
        return True

    def ask(self, requests: int, count: int) -> None:
        """Ask the server (its request pipe) for ``count`` spares, up to ``MAX_SPARES`` in all: not
        waited for, the server forks them while this process goes on (ends the job, returns,
        prepares the next)."""
        count = min(count, MAX_SPARES - len(self.pids) - self.asked)
        if not self.possible or count <= 0 or requests < 0:
            return
        try:
            os.write(requests, SPARE * count)
        except OSError:
            return  # the server ended: the next job finds out
        self.asked += count

    def end(self) -> None:
        """The server is gone: its spares (ended, or about to, at the end of their pipe) reaped."""
        pids, self.pids, self.asked = self.pids, [], 0
        reap(pids)


def reap(pids: list[int]) -> None:
    """Kill and wait for children of ours that must end now: idle spares, a process that could not
    be set up as its container (ours until reaped here: no pid can be another's)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 1.0
    left = list(pids)
    while left and time.monotonic() < deadline:
        for pid in list(left):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                left.remove(pid)
        if left:
            time.sleep(0.005)
