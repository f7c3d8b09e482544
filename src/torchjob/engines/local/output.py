"""What a person sees: prefixed log lines, a live status table, the final summary.

Every line of every container is printed as ``<task>-<index> r<RANK> | text`` (the rank only when
the pod has a ``RANK``), ``<task>-<index>/<container>`` for init containers and extra containers.
Colors and the live table only on a terminal (and never with ``NO_COLOR``); otherwise plain lines
that are easy to grep and to read in CI logs.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import sys
import time
from collections.abc import Callable, Iterable
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
MAX_BACKLOG = 1 << 20  # bytes written but not yet taken by the reader before log reading pauses
_WRITE_CHUNK = 1 << 16


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
    end: int | None = None  # read no further (see LogFollower.seal)


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

    def seal(self) -> None:
        """Every file is closed at its present size: what a process that survived the end of its
        job still writes is not waited for."""
        for item in self.files.values():
            item.closing = True
            try:
                item.end = item.path.stat().st_size
            except OSError:
                item.end = item.offset

    def read(self) -> list[tuple[_Followed, str]]:
        out: list[tuple[_Followed, str]] = []
        for path, item in list(self.files.items()):
            size = _READ_CHUNK * 16 if item.end is None else min(_READ_CHUNK * 16, item.end - item.offset)
            try:
                with open(path, "rb") as handle:
                    handle.seek(item.offset)
                    data = handle.read(size) if size > 0 else b""
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
                if not more or (item.end is not None and item.offset >= item.end):
                    if item.partial:
                        out.append((item, _text(item.partial)))
                    del self.files[path]
        return out

    def skip(self) -> int:
        """Forget every followed file; returns how many lines were left unread in them."""
        count = 0
        for path, item in list(self.files.items()):
            rest = item.partial
            try:
                with open(path, "rb") as handle:
                    handle.seek(item.offset)
                    left = item.end - item.offset if item.end is not None else None
                    while (left is None or left > 0) and (chunk := handle.read(_READ_CHUNK * 16)):
                        if left is not None:
                            chunk, left = chunk[:left], left - len(chunk)
                        count += chunk.count(b"\n")
                        rest = chunk.rpartition(b"\n")[2] if b"\n" in chunk else rest + chunk
            except OSError:
                pass
            count += 1 if rest else 0  # an unterminated last line
            del self.files[path]
        return count


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
        self.backlog = 0  # written at once (a file, a string buffer or a blocking pipe)

    def wait(self, timeout: float) -> None:
        return

    def write(self, text: str, counted: bool = False) -> None:
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


class _Outlet:
    """Writes to a pipe, terminal or socket that never block: a stalled reader (``| less`` not
    scrolled, Ctrl-S, ``| sleep 30``) must not stop the loop that runs the job. What the reader
    has not taken yet waits here; the caller stops reading log files while ``backlog`` is large
    (the files hold everything), so memory stays bounded and nothing is lost unless given up on.

    The descriptor is reopened with O_NONBLOCK where Linux allows it (a pipe or terminal through
    /proc/self/fd): setting the flag on the inherited descriptor would change it for every process
    that shares it, the shell and our own stderr included. Otherwise the original is written only
    when poll says it is writable, at most PIPE_BUF bytes at a time (a pipe then takes them whole).
    """

    def __init__(self, fd: int) -> None:
        import collections
        import select

        self._select = select
        self.pending: collections.deque[tuple[bytes, bool]] = collections.deque()  # (text, a log line)
        self.backlog = 0  # bytes in pending
        self._head = 0  # bytes of pending[0] already written
        self.broken = False
        try:
            self.fd = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
            self.own = True
        except OSError:  # not Linux, a socket, or a pipe we may not reopen
            self.fd, self.own = fd, False

    def write(self, text: str, counted: bool = False) -> None:
        """Queue ``text``; ``counted`` marks a container's line (see :meth:`discard`)."""
        # Log lines wait for room (Console.room); this bounds the rest (notes) if nothing is read.
        if not self.broken and self.backlog < 4 * MAX_BACKLOG:
            data = text.encode(errors="replace")
            self.pending.append((data, counted))
            self.backlog += len(data)

    def discard(self) -> int:
        """Drop what the reader has not started to take; returns how many log lines that was."""
        keep = [self.pending.popleft()] if self.pending and self._head else []
        dropped = sum(1 for _data, counted in self.pending if counted)
        self.pending.clear()
        self.pending.extend(keep)
        self.backlog = sum(len(data) for data, _counted in keep) - self._head
        return dropped

    def flush(self) -> None:
        """Write what the reader takes now, without waiting."""
        limit = _WRITE_CHUNK if self.own else self._select.PIPE_BUF
        while self.pending and not self.broken:
            if not self.own and not self._writable(0.0):
                return
            chunk, size = [], 0
            for i, (data, _counted) in enumerate(self.pending):
                piece = data[self._head :] if i == 0 else data
                chunk.append(piece)
                size += len(piece)
                if size >= limit:
                    break
            try:
                written = os.write(self.fd, b"".join(chunk)[:limit])
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            except OSError:  # the reader went away
                self.broken = True
                self.discard()
                return
            self.backlog -= written
            written += self._head
            while self.pending and written >= len(self.pending[0][0]):
                written -= len(self.pending.popleft()[0])
            self._head = written

    def wait(self, timeout: float) -> None:
        """Until the reader can take more or ``timeout`` seconds passed."""
        if self.pending and not self.broken:
            self._writable(timeout)

    def _writable(self, timeout: float) -> bool:
        poller = self._select.poll()
        poller.register(self.fd, self._select.POLLOUT)
        return bool(poller.poll(int(timeout * 1000)))

    def close(self) -> None:
        if self.own:
            self.own = False
            os.close(self.fd)


def _outlet(stream: TextIO) -> _Outlet | None:
    """A non-blocking writer for ``stream`` when it is a pipe, terminal or socket; None for files
    and for streams that are not plain files of this process (a notebook's output, say)."""
    if not isinstance(stream, io.TextIOWrapper):
        return None
    try:
        fd = stream.fileno()
        mode = os.fstat(fd).st_mode
    except (OSError, ValueError, AttributeError):  # a string buffer: it never blocks
        return None
    if stat.S_ISREG(mode) or stat.S_ISBLK(mode):
        return None
    with contextlib.suppress(OSError, ValueError):
        stream.flush()  # what was printed before comes first
    return _Outlet(fd)


class Console:
    """Log lines above, a live status table below (terminal only).

    With ``never_block`` (the supervisor's console) writing never waits for the reader: ``room``
    says whether more log lines may be given now, and lines that could not be shown at all are
    counted in ``unshown`` (see :meth:`drain` and :meth:`give_up`).
    """

    def __init__(
        self, stream: TextIO | None = None, *, live: bool | None = None, never_block: bool = False
    ) -> None:
        raw = stream or sys.stdout
        outlet = _outlet(raw) if never_block else None
        self.stream: _SafeStream | _Outlet = outlet or _SafeStream(raw)
        self.color = use_color(raw)
        self.live = self.color if live is None else live
        self.unshown = 0  # container lines never written, for the summary to say so
        self.gave_up = False
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

    def room(self) -> bool:
        """Whether more log lines may be given now: the reader has taken most of what was written."""
        return not self.gave_up and not self.stream.broken and self.stream.backlog < MAX_BACKLOG

    def drain(self, stall: float, stop: Callable[[], bool]) -> bool:
        """Wait until there is ``room``; give up (False) after ``stall`` s of a reader taking
        nothing, or when ``stop`` says so (a signal). Used on the way out only."""
        last, progress = self.stream.backlog, time.monotonic()
        while not self.room():
            if self.gave_up or self.stream.broken or stop():
                self.give_up()
                return False
            self.stream.wait(0.05)
            self.stream.flush()
            if self.stream.backlog < last:
                last, progress = self.stream.backlog, time.monotonic()
            elif time.monotonic() - progress > stall:
                self.give_up()
                return False
        return True

    def give_up(self) -> None:
        """No more container lines are written, only counted (those not yet taken too)."""
        self.gave_up = True
        if isinstance(self.stream, _Outlet):
            self.unshown += self.stream.discard()

    def finish(self, stall: float, stop: Callable[[], bool]) -> None:
        """Write out what is pending (the summary), waiting at most ``stall`` s for a stalled reader."""
        deadline = time.monotonic() + stall
        self.stream.flush()
        while self.stream.backlog and not self.stream.broken and not stop() and time.monotonic() < deadline:
            before = self.stream.backlog
            self.stream.wait(0.05)
            self.stream.flush()
            if self.stream.backlog < before:
                deadline = time.monotonic() + stall
        if isinstance(self.stream, _Outlet):
            self.stream.close()

    def lines(self, items: Iterable[tuple[str, str, str]]) -> None:
        """(prefix, color code, text) lines of container output."""
        batch = list(items)
        if not batch:
            return
        if self.gave_up or self.stream.broken:
            self.unshown += len(batch)
            return
        self._prefix_width = max(self._prefix_width, *(len(p) for p, _, _ in batch))
        self._erase()
        for shown, (prefix, code, text) in enumerate(batch):
            if self.stream.broken:  # the reader went away (``| head``)
                self.unshown += len(batch) - shown
                break
            label = paint(prefix.ljust(self._prefix_width), code, self.color)
            self.stream.write(f"{label} | {text}\n", True)
        self._draw()
        self.stream.flush()

    def note(self, text: str, code: str = "2") -> None:
        """torchjob's own messages (phase changes, restarts)."""
        self._erase()
        self.stream.write(paint(f"torchjob: {text}", code, self.color) + "\n")
        self._draw()
        self.stream.flush()

    def table(self, rows: list[str], *, force: bool = False) -> None:
        if not self.live or self.stream.backlog >= MAX_BACKLOG:  # redrawn once the reader catches up
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


def summary(status: dict[str, Any], color: bool = False, unshown: int = 0) -> list[str]:
    """The closing lines; ``unshown`` counts container lines that were not printed above."""
    phase = str(status.get("phase", ""))
    lines = [headline(status, color)]
    lines += ["  " + row for row in pod_rows(status, color)]
    reason = status.get("reason") or ""
    lines.append(f"{paint(phase, _PHASE_COLORS.get(phase, ''), color)}: {reason}".rstrip(": "))
    logs = f"{status.get('jobDir', '')}/logs"
    if unshown:
        text = f"{unshown} line{'s' if unshown != 1 else ''} of container output not shown above"
        lines.append(paint(f"{text} (the output was not read in time); every line is in {logs}", "33", color))
    lines.append(f"logs: {logs}  (torchjob logs {status.get('id', '')})")
    return lines


def pod_color(ordinal: int) -> str:
    return _COLORS[ordinal % len(_COLORS)]
