"""Work against the cluster that torchjob waits for within one bound, and can stop waiting for.

Each request is bounded by the client's timeouts (client.py: 10 s to connect, 60 s to read, one
retry), but a clean-up of several objects against a server that takes requests and does not
answer would then take minutes. Such work runs here in a thread of its own while the caller waits
up to a deadline for the whole of it; Ctrl-C (or SIGTERM) stops the wait, not the request, so the
caller can still learn later how a request ended. A thread given up on is a daemon: it does not
keep torchjob from exiting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

CLEANUP_TIMEOUT = 30.0  # seconds for the whole clean-up after an interrupted or refused creation
# Of those, the most an unanswered create may take: what was made is still deleted in the rest.
SETTLE_TIMEOUT = 15.0
POLL = 0.1  # how often a wait looks for Ctrl-C (a wait on an Event does not see it on every Python)

T = TypeVar("T")


class Background(Generic[T]):
    """``call`` in a daemon thread: wait for it with a bound, and learn how it ended."""

    def __init__(self, call: Callable[[], T], name: str = "torchjob-request") -> None:
        self.result: T | None = None
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(call,), name=name, daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], T]) -> None:
        try:
            self.result = call()
        except BaseException as err:  # handed to the waiting thread
            self.error = err
        finally:
            self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the end, at most ``timeout`` seconds (a Ctrl-C interrupts the wait, not the
        work); whether it ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = POLL if deadline is None else min(POLL, deadline - time.monotonic())
            if self._done.wait(max(left, 0.0)):
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def outcome(self) -> T:
        """The call's result (after :meth:`wait` said it ended); its exception raised."""
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]  # set: the call returned


def left_of(deadline: float) -> float:
    """Seconds from now to ``deadline`` (a ``time.monotonic`` value), never below zero."""
    return max(0.0, deadline - time.monotonic())


def remove_command(*refs: str) -> str:
    """The command that removes jobs' objects (``NAMESPACE/NAME`` each), whatever state they were left in."""
    return f"torchjob delete {' '.join(refs)} --engine kubernetes"
