"""This process's C library, for the Linux calls Python has no wrapper for (prctl, unshare, mount).

None off Linux or where it cannot be had; callers then do without.
"""

from __future__ import annotations

import ctypes
import sys


def _load() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:  # the running program already has libc loaded; no library search (it forks ldconfig)
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


LIBC = _load()
