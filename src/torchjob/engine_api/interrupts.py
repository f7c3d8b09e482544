"""SIGTERM taken as Ctrl-C, so that both end a command the same way.

A CI runner or a supervisor stops a command with SIGTERM; its default kills torchjob at once
(exit -15, no word). Within :func:`sigterm_interrupts` it raises KeyboardInterrupt instead, and the
command says what it leaves behind as after Ctrl-C: the kubernetes engine deletes what it half
created and notes a job that keeps running (docs/kubernetes.md); ``submit --wait`` holds it from
its first request to its last, so no step between the submit and the wait has the default,
``logs -f`` to the job's status read after the logs, and ``wait`` and ``status --watch`` on
every engine.
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
    """Within the block SIGTERM raises KeyboardInterrupt, unless the program handles SIGTERM itself
    (an SDK caller's handler, or an outer block of this: nested blocks change nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
