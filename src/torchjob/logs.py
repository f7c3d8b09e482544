"""torchjob's own logger: decisions are logged under ``torchjob`` and shown with -v or TORCHJOB_LOG."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("torchjob")


def enable_debug() -> None:
    configure("debug")


def configure(level: str | None = None) -> None:
    """Send torchjob's log records to stderr at ``level`` (default: $TORCHJOB_LOG, else warning)."""
    name = (level or os.environ.get("TORCHJOB_LOG") or "warning").upper()
    logger.setLevel(getattr(logging, name, logging.WARNING))
    if not any(getattr(h, "_torchjob", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("torchjob %(levelname)s: %(message)s"))
        handler._torchjob = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
