"""How a rank's process ends once its value or error is written: at once, without finalization.

With torch 2.13, a gloo thread of a process group that is still busy (or was never destroyed)
can be running while the interpreter finalizes; Python then ends that thread inside a C++
destructor and the process aborts ("terminate called without an active exception", exit code
134) after all work succeeded. A rank has nothing left to do once its result is written, so it
flushes its output and leaves with ``os._exit``. Handlers a task registered with ``atexit`` do
not run in a rank for the same reason.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Flush stdout and stderr, then end the process with ``code``, skipping finalization."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream must not change the code
            stream.flush()
    os._exit(code)
