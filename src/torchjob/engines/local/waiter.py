"""Sleep until a container process ends, a signal arrives, or a timeout passes.

The supervisor used to wake every 20 ms to poll its pods; most of those wakes found nothing new
and cost CPU that the job's own processes (importing torch on a few cores) needed. Here each
container's main process gets a pidfd (Linux 5.3+), which becomes readable when the process
exits, and signal handlers write to a pipe: the loop wakes at once for what matters and sleeps
otherwise. Without pidfds (other systems, old kernels) ``wait`` falls back to short sleeps.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import time
from collections.abc import Callable

from torchjob.records import record

FALLBACK_TICK = 0.02  # seconds between polls when process exits cannot be waited for


@record
class Look:
    """When a watch wants to look again: after ``every`` seconds, or at once when one of the
    descriptors ``sooner`` becomes readable (the watch reads them itself)."""

    every: float
    sooner: tuple[int, ...] = ()


class ExitWaiter:
    def __init__(self, watch: Callable[[], Look | None] | None = None) -> None:
        # Called as each wait begins and every so often during it: it looks at something no event
        # announces (nudge.py) and says when to look again, and which descriptors becoming readable
        # mean it should look at once (None: not during this wait).
        self._watch = watch
        self._selector = selectors.DefaultSelector()
        self._pidfds: dict[int, int] = {}  # pid -> pidfd
        self._usable = hasattr(os, "pidfd_open")
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._closed = False

    def add(self, pid: int) -> None:
        """Wake up when ``pid`` (a child not yet reaped) exits."""
        if not self._usable or pid in self._pidfds:
            return
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # no pidfd support here: poll instead
            self._usable = False
            return
        self._pidfds[pid] = fd
        self._selector.register(fd, selectors.EVENT_READ)

    def remove(self, pid: int) -> None:
        fd = self._pidfds.pop(pid, None)
        if fd is not None:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._selector.unregister(fd)  # unless it already woke us
            os.close(fd)

    def wake(self) -> None:
        """Make the current or next ``wait`` return at once; safe in a signal handler."""
        if self._closed:  # the pipe's descriptor numbers may belong to other files by now
            return
        with contextlib.suppress(OSError):  # a full pipe already wakes the loop
            os.write(self._wake_w, b"\0")

    def wait(self, timeout: float, readable: int | None = None) -> None:
        """Until a watched process exits, ``wake`` is called, ``timeout`` seconds pass, or the file
        descriptor ``readable`` (watched for this wait only, and not read) can be read."""
        end = time.monotonic() + max(0.0, timeout)
        while True:
            look = self._watch() if self._watch is not None else None
            left = end - time.monotonic()
            if look is None:
                self._wait(left, readable)
                return
            woke = self._wait(min(left, look.every), readable, look.sooner)
            if woke or not self._usable or time.monotonic() >= end:  # (no pidfds: poll the exits)
                return

    def _wait(self, timeout: float, readable: int | None, sooner: tuple[int, ...] = ()) -> bool:
        """One wait; whether something woke it (not one of ``sooner``: they only end the wait)."""
        timeout = max(0.0, timeout)
        if not self._usable:
            timeout = min(timeout, FALLBACK_TICK)
        extra: list[int] = []  # watched for this wait only, and not read
        for fd in (readable, *sooner) if readable is not None else sooner:
            with contextlib.suppress(KeyError, ValueError, OSError):
                extra.append(self._selector.register(fd, selectors.EVENT_READ).fd)
        try:
            found = self._selector.select(timeout)
        finally:
            for fd in extra:
                with contextlib.suppress(KeyError, ValueError, OSError):
                    self._selector.unregister(fd)
        woke = False
        for key, _events in found:
            if key.fd in extra:
                woke = woke or key.fd == readable
                continue
            woke = True
            if key.fd == self._wake_r:
                with contextlib.suppress(OSError):
                    while os.read(self._wake_r, 512):
                        pass
            else:  # one wake per exit: the pidfd stays readable until it is closed
                self._selector.unregister(key.fd)
        return woke

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for pid in list(self._pidfds):
            self.remove(pid)
        self._selector.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
