"""SIGTERM taken as Ctrl-C while the engine talks to a cluster, so both end the same way.

Either one stops torchjob, never the job on the cluster: the objects half-created are deleted
again, and a job being followed keeps running, with a note saying so (docs/kubernetes.md).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block SIGTERM raises KeyboardInterrupt, unless the program handles SIGTERM itself."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:  # the program (an SDK caller) has its own handler
        yield
        return
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
