"""Shared by the example programs: how a rank ends once its work is done."""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Exit at once, skipping Python's interpreter finalization.

    With torch 2.13 a gloo worker thread may still be releasing the last collective's tensors when
    ``main`` returns; if it needs the GIL while the interpreter finalizes, Python ends that thread
    inside a C++ destructor and the process aborts ("terminate called without an active exception",
    exit code 134) after all work succeeded. The group is destroyed and output flushed by then.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
