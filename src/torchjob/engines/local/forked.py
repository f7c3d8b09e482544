"""The processes a fork server (forkserver.py) makes the engine's children: a container's
(:class:`Forked`) and, for the warm pool, spares forked ahead of the next job (:class:`Spares`).

A fork of a process that imported torch copies its page tables: several milliseconds each on a
small machine, one container after another, while the job's ranks wait for the last of them. A
server kept from one job to the next (pool.py) is asked for a spare each time a container it
forked ends (so a job's end leaves as many as it had ranks, up to ``MAX_SPARES``); the spare is
forked then, waits idle in the server's session, and is handed the next container's request, so
that the fork is off that container's start. A spare is never a container until it is handed one
(it then starts a session of its own, as every container does, before it runs anything); it ends
with its server.
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

    def __init__(self, pid: int, ended: Callable[[], None] | None = None) -> None:
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
                    self.ended()
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
    <pid>`` replies, which come among its answers to containers) and how many were asked for and
    not yet told of."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.asked = 0
        self.possible = True  # False once the server said it cannot (no clone: nospare)

    def took(self, pid: int) -> None:
        """A container's process was forked, or handed to the spare ``pid``."""
        if pid in self.pids:
            self.pids.remove(pid)

    def told(self, line: bytes) -> bool:
        """Take note of a reply line about spares; False for any other line (a container's answer)."""
        if line.startswith(b"gone "):  # a spare that died idle (killed): reaped here, its pid freed
            pid = int(line[5:])
            if pid in self.pids:
                self.pids.remove(pid)
            _reap([pid])
            return True
        if line != b"nospare" and not line.startswith(b"spare "):
            return False
        self.asked = max(0, self.asked - 1)
        if line == b"nospare":
            self.possible = False
        else:
            self.pids.append(int(line[6:]))
        return True

    def ask(self, requests: int) -> None:
        """Ask the server (its request pipe) for a spare, up to ``MAX_SPARES``: not waited for, the
        server forks it while this process goes on (ends the job, returns, prepares the next)."""
        if not self.possible or len(self.pids) + self.asked >= MAX_SPARES or requests < 0:
            return
        try:
            os.write(requests, SPARE)
        except OSError:
            return  # the server ended: the next job finds out
        self.asked += 1

    def end(self) -> None:
        """The server is gone: its spares (ended, or about to, at the end of their pipe) reaped."""
        pids, self.pids, self.asked = self.pids, [], 0
        _reap(pids)


def _reap(pids: list[int]) -> None:
    """Kill and wait for idle spares, our children (ours until reaped: no pid can be another's)."""
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
