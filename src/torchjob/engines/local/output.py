"""What a person sees: prefixed log lines, a live status table, the final summary.

Every line of every container is printed as ``<task>-<index> r<RANK> | text`` (the rank only when
the pod has a ``RANK``), ``<task>-<index>/<container>`` for init containers and extra containers.
Colors and the live table only on a terminal (and never with ``NO_COLOR``); otherwise plain lines
that are easy to grep and to read in CI logs.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from torchjob.records import field, record

_COLORS = ("36", "33", "35", "32", "34", "91", "96", "93", "95", "92", "94")
_PHASE_COLORS = {
    "Stopped": "33",
    "Succeeded": "32",
    "Completed": "32",
    "Failed": "31",
    "Aborted": "31",
    "Terminated": "31",
    "Running": "36",
    "Pending": "33",
    "Restarting": "33",
}
_READ_CHUNK = 1 << 16
_MAX_LINE = 1 << 16


def use_color(stream: TextIO) -> bool:
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def paint(text: str, code: str, color: bool) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if color and code else text


def short_name(job_name: str, pod_name: str) -> str:
    prefix = f"{job_name}-"
    return pod_name[len(prefix) :] if pod_name.startswith(prefix) else pod_name


def prefix_for(short: str, rank: str | None, container: str | None) -> str:
    head = short if container is None else f"{short}/{container}"
    return f"{head} r{rank}" if rank is not None else head


@record
class _Followed:
    path: Path
    prefix: str
    color: str
    offset: int = 0
    partial: bytes = b""
    closing: bool = False


@record
class LogFollower:
    """Reads new lines from growing log files; each line comes out with its file's prefix."""

    files: dict[Path, _Followed] = field(default_factory=dict)

    def follow(self, path: Path, prefix: str, color: str = "", *, from_start: bool = True) -> None:
        if path in self.files:
            return
        offset = 0 if from_start or not path.exists() else path.stat().st_size
        self.files[path] = _Followed(path, prefix, color, offset)

    def close(self, path: Path) -> None:
        """No more output will come: the next read also returns an unterminated last line."""
        if path in self.files:
            self.files[path].closing = True

    def read(self) -> list[tuple[_Followed, str]]:
        out: list[tuple[_Followed, str]] = []
        for path, item in list(self.files.items()):
            try:
                with open(path, "rb") as handle:
                    handle.seek(item.offset)
                    data = handle.read(_READ_CHUNK * 16)
            except OSError:
                data = b""
            item.offset += len(data)
            data = item.partial + data
            *lines, item.partial = data.split(b"\n")
            if len(item.partial) > _MAX_LINE:  # no newline in sight: print what there is
                lines.append(item.partial)
                item.partial = b""
            out.extend((item, _text(line)) for line in lines)
            if item.closing:
                more = path.exists() and path.stat().st_size > item.offset
                if not more:
                    if item.partial:
                        out.append((item, _text(item.partial)))
                    del self.files[path]
        return out


def _text(line: bytes) -> str:
    """One output line; of a line redrawn with carriage returns (progress bars) only its last state."""
    parts = [p for p in line.split(b"\r") if p]
    return (parts[-1] if parts else b"").decode(errors="replace")


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
        self._width = 0
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


def _elapsed(start: Any, end: Any) -> str:
    if not isinstance(start, (int, float)):
        return "-"
    seconds = (end if isinstance(end, (int, float)) else time.time()) - start
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def ports_text(status: dict[str, Any]) -> str:
    ports = status.get("ports") or []
    return ", ".join(f"{p['declared']}->{p['host']}" for p in ports) or "none"


def pod_rows(status: dict[str, Any], color: bool = False, limit: int | None = None) -> list[str]:
    """The pod table: one row a pod (``limit`` rows at most, then a count of the rest)."""
    header = ("POD", "RANK", "ADDRESS", "PHASE", "RESTARTS", "EXIT", "ATTEMPT", "ELAPSED")
    rows: list[tuple[str, ...]] = []
    for pod in status.get("pods") or []:
        phase = str(pod.get("phase", ""))
        if pod.get("terminating"):
            phase += " (stopping)"
        rows.append(
            (
                str(pod.get("short", pod.get("name", ""))),
                "-" if pod.get("rank") is None else str(pod["rank"]),
                str(pod.get("address", "")),
                phase,
                str(pod.get("restarts", 0)),
                "-" if pod.get("exitCode") is None else str(pod["exitCode"]),
                str(pod.get("attempt", 0)),
                _elapsed(pod.get("startedAt"), pod.get("finishedAt")),
            )
        )
    hidden = 0
    if limit is not None and len(rows) > limit:
        hidden, rows = len(rows) - limit, rows[:limit]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    for row in rows:
        cells = [c.ljust(w) for c, w in zip(row, widths, strict=True)]
        base = row[3].split(" ")[0]
        cells[3] = paint(cells[3], _PHASE_COLORS.get(base, ""), color)
        out.append("  ".join(cells).rstrip())
    if hidden:
        out.append(f"... and {hidden} more pods")
    return out


def headline(status: dict[str, Any], color: bool = False) -> str:
    phase = str(status.get("phase", ""))
    text = (
        f"job {status.get('id', status.get('name', ''))}: {paint(phase, _PHASE_COLORS.get(phase, ''), color)}"
        f"  ports {ports_text(status)}  retries {status.get('retryCount', 0)}"
        f"  elapsed {_elapsed(status.get('startedAt'), status.get('finishedAt'))}"
    )
    return text


def summary(status: dict[str, Any], color: bool = False) -> list[str]:
    phase = str(status.get("phase", ""))
    lines = [headline(status, color)]
    lines += ["  " + row for row in pod_rows(status, color)]
    reason = status.get("reason") or ""
    lines.append(f"{paint(phase, _PHASE_COLORS.get(phase, ''), color)}: {reason}".rstrip(": "))
    lines.append(f"logs: {status.get('jobDir', '')}/logs  (torchjob logs {status.get('id', '')})")
    return lines


def pod_color(ordinal: int) -> str:
    return _COLORS[ordinal % len(_COLORS)]
