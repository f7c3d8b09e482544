"""What a person sees: prefixed log lines, a live status table, the final summary.

Every line of every container is printed as ``<task>-<index> r<RANK> | text`` (the rank only when
the pod has a ``RANK``), ``<task>-<index>/<container>`` for init containers and extra containers.
Colors and the live table only on a terminal (and never with ``NO_COLOR``); otherwise plain lines
that are easy to grep and to read in CI logs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from typing import TextIO

from torchjob.display import paint, use_color


def short_name(job_name: str, pod_name: str) -> str:
    prefix = f"{job_name}-"
    return pod_name[len(prefix) :] if pod_name.startswith(prefix) else pod_name


class _SafeStream:
    """Writes that never fail: when the reader goes away (``torchjob run ... | head``) the job goes
    on, only its printing stops; everything is in the log files anyway."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.broken = False

    def write(self, text: str) -> None:
        if self.broken:
            return
        try:
            self.stream.write(text)
        except (OSError, ValueError):
            self.broken = True

    def flush(self) -> None:
        if self.broken:
            return
        try:
            self.stream.flush()
        except (OSError, ValueError):
            self.broken = True


class Console:
    """Log lines above, a live status table below (terminal only)."""

    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None) -> None:
        raw = stream or sys.stdout
        self.stream = _SafeStream(raw)
        self.color = use_color(raw)
        self.live = self.color if live is None else live
        self._table: list[str] = []
        self._drawn = 0
        self._last_draw = 0.0
        self._prefix_width = 0

    def _erase(self) -> None:
        if self._drawn:
            self.stream.write(f"\r\x1b[{self._drawn}A\x1b[J")
            self._drawn = 0

    def _draw(self) -> None:
        if not self.live or not self._table:
            return
        import shutil  # only on a terminal; with its compression modules it costs 2 ms

        width, height = shutil.get_terminal_size((100, 24))
        rows = self._table[: max(1, height // 2)]
        for row in rows:
            self.stream.write(_clip(row, width - 1) + "\n")
        self._drawn = len(rows)
        self._last_draw = time.monotonic()

    def lines(self, items: Iterable[tuple[str, str, str]]) -> None:
        """(prefix, color code, text) lines of container output."""
        batch = list(items)
        if not batch:
            return
        self._prefix_width = max(self._prefix_width, *(len(p) for p, _, _ in batch))
        self._erase()
        for prefix, code, text in batch:
            label = paint(prefix.ljust(self._prefix_width), code, self.color)
            self.stream.write(f"{label} | {text}\n")
        self._draw()
        self.stream.flush()

    def note(self, text: str, code: str = "2") -> None:
        """torchjob's own messages (phase changes, restarts)."""
        self._erase()
        self.stream.write(paint(f"torchjob: {text}", code, self.color) + "\n")
        self._draw()
        self.stream.flush()

    def table(self, rows: list[str], *, force: bool = False) -> None:
        if not self.live:
            return
        changed = rows != self._table
        self._table = rows  # drawn now, or with the next log lines
        # Elapsed times change every tick; redraw a few times a second, not fifty.
        if not force and (not changed or time.monotonic() - self._last_draw < 0.25):
            return
        self._erase()
        self._draw()
        self.stream.flush()

    def print(self, line: str) -> None:
        self._erase()
        self.stream.write(line + "\n")
        self._draw()
        self.stream.flush()

    def end_live(self) -> None:
        self._erase()
        self._table = []
        self.stream.flush()


def _clip(text: str, width: int) -> str:
    # Cut by visible characters, keeping escape sequences intact.
    out, seen, i = [], 0, 0
    while i < len(text) and seen < width:
        if text[i] == "\x1b":
            end = text.find("m", i)
            out.append(text[i : end + 1])
            i = end + 1
            continue
        out.append(text[i])
        seen += 1
        i += 1
    return "".join(out) + ("\x1b[0m" if "\x1b[" in text else "")
