"""Background load for the benchmarks' "under load" figures: ``--load N`` busy loops.

Each loop is a process in a session of its own, as another user's work or another terminal's
would be: with autogroup scheduling (most Linux kernels) CPU is shared per session first, so loops
started in the benchmark's own session would compete only with the benchmark's session mates
(torchjob's supervisor, its fork server) and not with the ranks, which run in sessions of their
own, and would load one side of a comparison only. The loops are killed when the benchmark ends;
should it be killed itself, each loop stops on its own after ``limit`` seconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

LOOP = "import time\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end:\n    pass\n"


@contextlib.contextmanager
def busy_loops(count: int, limit: float = 3600.0) -> Iterator[None]:
    """``count`` busy loops, each in its own session, for the duration of the block."""
    loops = [
        subprocess.Popen(
            [sys.executable, "-c", LOOP.format(limit=limit)],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]
    try:
        yield
    finally:
        for loop in loops:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(loop.pid, signal.SIGKILL)
            loop.wait(10)
