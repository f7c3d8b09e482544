"""torchjob's own logger: decisions are logged under ``torchjob`` and shown with -v or TORCHJOB_LOG.

The ``logging`` package is imported only when something logs for real: the command line's
``torchjob run`` starts its pods before it would have finished importing it (about 4 ms).
"""

from __future__ import annotations

import os
import sys
from enum import IntEnum

from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    import logging

NAME = "torchjob"


class Level(IntEnum):
    """How much a note to the person matters (``logging``'s numbers, two of torchjob's between):
    the controller says it, a console picks a colour for it (``display.level_color``)."""

    INFO = 20  # what happens (a task waits for another, a job started)
    NOTICE = 22  # the job's phase changed
    SUCCESS = 25  # the job completed
    WARNING = 30  # worth a look (a restart, a setting that surprises)
    ERROR = 40  # something failed


_DEBUG, _INFO = 10, 20  # logging.DEBUG and logging.INFO, without importing logging for them


def get_logger() -> logging.Logger:
    import logging

    return logging.getLogger(NAME)


def debug(message: str, *args: object) -> None:
    _log(_DEBUG, message, args)


def info(message: str, *args: object) -> None:
    _log(_INFO, message, args)


def _log(level: int, message: str, args: tuple[object, ...]) -> None:
    # Until ``logging`` is imported nobody can have attached a handler, and a record below
    # WARNING that finds no handler is dropped: skipping it then changes nothing.
    if "logging" in sys.modules:
        get_logger().log(level, message, *args)


def configure(level: str | None = None) -> None:
    """Send torchjob's log records to stderr at ``level`` (default: $TORCHJOB_LOG, else warning)."""
    import logging

    logger = get_logger()
    name = (level or os.environ.get("TORCHJOB_LOG") or "warning").upper()
    logger.setLevel(getattr(logging, name, logging.WARNING))
    if not any(getattr(h, "_torchjob", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("torchjob %(levelname)s: %(message)s"))
        handler._torchjob = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
