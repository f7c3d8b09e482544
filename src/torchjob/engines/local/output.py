"""What a person sees: prefixed log lines, a live status table, the final summary.

Every line of every container is printed as ``<task>-<index> r<RANK> | text`` (the rank only when
the pod has a ``RANK``), ``<task>-<index>/<container>`` for init containers and extra containers.
Colors and the live table only on a terminal (and never with ``NO_COLOR``); otherwise plain lines
that are easy to grep and to read in CI logs. Writing never waits for the reader (:mod:`.outlet`).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterable, Sized

from torchjob.display import paint, use_color
from torchjob.engines.local.outlet import MAX_BACKLOG, Outlet, SafeStream, outlet
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, TextIO


def short_name(job_name: str, pod_name: str) -> str:
    prefix = f"{job_name}-"
    return pod_name[len(prefix) :] if pod_name.startswith(prefix) else pod_name


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
        writer = outlet(raw) if never_block else None
        self.stream: SafeStream | Outlet = writer or SafeStream(raw)
        self.color = use_color(raw)
        self.live = self.color if live is None else live
        self.unshown = 0  # container lines never written, for the summary to say so
        self.gave_up = False
        self._table: list[str] = []
        self._progress: dict[str, tuple[str, str]] = {}  # prefix -> (color, unfinished line's state)
        self._drawn = 0
        self._last_draw = 0.0
        self._prefix_width = 0
        self.hushed = False  # after a Ctrl-C: see hush()
        self._slow: tuple[float, str] | None = None  # (when, what): said if the stop takes that long
        self._final: Callable[[], str] | None = None

    def _erase(self) -> None:
        if self._drawn:
            self.stream.write(f"\r\x1b[{self._drawn}A\x1b[J")
            self._drawn = 0

    def _draw(self) -> None:
        if not self.live or not (self._table or self._progress):
            return
        import shutil  # only on a terminal; with its compression modules it costs 2 ms

        width, height = shutil.get_terminal_size((100, 24))
        progress = [
            f"{paint(prefix.ljust(self._prefix_width), code, self.color)} | {text}"
            for prefix, (code, text) in self._progress.items()
        ]
        rows = (progress + self._table)[: max(1, height // 2)]
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
        if isinstance(self.stream, Outlet):
            self.unshown += self.stream.discard()

    def finish(self, stall: float, stop: Callable[[], bool]) -> None:
        """Write out what is pending (the summary), waiting at most ``stall`` s for a stalled reader."""
        if self._final is not None:
            final, self._final, self._slow = self._final, None, None
            self.stream.write(paint(f"torchjob: {final()}", "33", self.color) + "\n")
        deadline = time.monotonic() + stall
        self.stream.flush()
        while self.stream.backlog and not self.stream.broken and not stop() and time.monotonic() < deadline:
            before = self.stream.backlog
            self.stream.wait(0.05)
            self.stream.flush()
            if self.stream.backlog < before:
                deadline = time.monotonic() + stall
        if isinstance(self.stream, Outlet):
            self.stream.close()

    def lines(self, items: Iterable[tuple[str, str, str]]) -> None:
        """(prefix, color code, text) lines of container output."""
        batch = list(items)
        if not batch or self.hushed:  # the log files keep them
            return
        if self.gave_up or self.stream.broken:
            self.unshown += len(batch)
            return
        self._prefix_width = max(self._prefix_width, *(len(p) for p, _, _ in batch))
        for prefix, _, _ in batch:  # its line ended: printed as a log line from now on
            self._progress.pop(prefix, None)
        self._erase()
        for shown, (prefix, code, text) in enumerate(batch):
            if self.stream.broken:  # the reader went away (``| head``)
                self.unshown += len(batch) - shown
                break
            label = paint(prefix.ljust(self._prefix_width), code, self.color)
            self.stream.write(f"{label} | {text}\n", True)
        self._draw()
        self.stream.flush()

    def progress(self, items: Iterable[tuple[str, str, str]]) -> None:
        """(prefix, color code, text): the present state of unfinished progress lines, shown live
        below the log lines (terminal only) until their line ends."""
        if not self.live or self.gave_up or self.stream.broken or self.hushed:
            return
        changed = False
        for prefix, code, raw in items:
            text = re.sub(_CONTROL, "", raw)  # a bar's own cursor moves would break the redrawn region
            self._prefix_width = max(self._prefix_width, len(prefix))
            changed |= self._progress.get(prefix) != (code, text)
            self._progress[prefix] = (code, text)
        if changed and self.stream.backlog < MAX_BACKLOG:
            self._erase()
            self._draw()
            self.stream.flush()

    def note(self, text: str, code: str = "2") -> None:
        """torchjob's own messages (phase changes, restarts)."""
        if self.hushed:
            return
        self._erase()
        self.stream.write(paint(f"torchjob: {text}", code, self.color) + "\n")
        self._draw()
        self.stream.flush()

    def table(self, rows: list[str], *, force: bool = False) -> None:
        if (
            not self.live or self.stream.backlog >= MAX_BACKLOG or self.hushed
        ):  # redrawn once the reader catches up
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
        if self.hushed:
            return
        self._erase()
        self.stream.write(line + "\n")
        self._draw()
        self.stream.flush()

    def end_live(self) -> None:
        self._erase()
        self._table = []
        self._progress = {}
        self.stream.flush()

    def hush(self, final: Callable[[], str], slow: str, after: float) -> None:
        """Ctrl-C: what the job prints while it stops (torchrun's tracebacks of the signal, notes,
        the summary) stays in its logs and status; the console says one line, ``final()``'s, as
        :meth:`finish` ends it, and first ``slow`` when the stop takes more than ``after`` s."""
        self.end_live()
        self.hushed = True
        self._final = final
        self._slow = (time.monotonic() + after, slow)

    def tick(self) -> None:
        """Called on every pass of the supervisor's loop: says ``slow`` once it is due."""
        if self._slow is not None and time.monotonic() >= self._slow[0]:
            self.stream.write(paint(f"torchjob: {self._slow[1]}", "33", self.color) + "\n")
            self._slow = None
            self.stream.flush()


SLOW_STOP = 2.0  # seconds after a Ctrl-C before the console says the job is still stopping


def hush(console: Console | SinkConsole, job_id: str, stopping: Sized, waiting: str = "") -> None:
    """Ctrl-C: the console says one line, once the job has stopped (``Console.hush``).

    ``stopping``: the pods that were running; ``waiting``: what the job did instead (in a queue).
    """
    what = f"job {job_id}"
    if stopping:
        what += f" and its {len(stopping)} running pod{'s' if len(stopping) != 1 else ''}"
    elif waiting:
        what += f" ({waiting})"
    logs = f"torchjob logs {job_id}"
    console.hush(
        final=lambda: f"Ctrl-C: stopped {what}; exit code 130 (its logs: {logs})",
        slow=f"Ctrl-C: stopping {what} (Ctrl-C again kills it at once)",
        after=SLOW_STOP,
    )


class SinkConsole:
    """The console for a caller whose sink takes lines (``stream`` None, the SDK's): container lines
    as :class:`LogLine`, notes and the summary as they are; nothing live (no table, no bars).

    A sink may say it has no ``room`` for more lines (its reader is slow): the log files keep them
    until it has, as for a stalled terminal."""

    live = False
    color = False
    backlog = 0  # what Console.stream has: the supervisor flushes and reads these
    broken = False

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.stream = self
        self.unshown = 0
        self.gave_up = False
        self.hushed = False

    def flush(self) -> None:
        return

    def room(self) -> bool:
        has_room = getattr(self.sink, "room", None)
        return not self.gave_up and (has_room is None or bool(has_room()))

    def drain(self, stall: float, stop: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + stall
        while not self.room():
            if self.gave_up or stop() or time.monotonic() > deadline:
                self.gave_up = True
                return False
            time.sleep(0.05)
        return True

    def give_up(self) -> None:
        self.gave_up = True

    def finish(self, stall: float, stop: Callable[[], bool]) -> None:
        return

    def lines(self, items: Iterable[tuple[str, str, str]]) -> None:
        from torchjob.engine_api.base import LogLine

        if self.hushed:  # after a Ctrl-C: the log files keep them
            return
        for prefix, _, text in items:
            if self.gave_up:
                self.unshown += 1
                continue
            # the prefix is display.prefix_for's: <task>-<index>[/<container>][ r<RANK>]
            self.sink.log(LogLine(prefix, text, 0, prefix.split(" ", 1)[0].split("/", 1)[0]))

    def progress(self, items: Iterable[tuple[str, str, str]]) -> None:
        return

    def note(self, text: str, code: str = "2") -> None:
        self.sink.notice(text)

    def table(self, rows: list[str], *, force: bool = False) -> None:
        return

    def print(self, line: str) -> None:
        self.sink.report(line)

    def end_live(self) -> None:
        return

    def hush(self, final: Callable[[], str], slow: str, after: float) -> None:
        """Ctrl-C: the pods' lines stop here (the caller gets KeyboardInterrupt once they stopped)."""
        self.hushed = True
        self.sink.notice(slow)

    def tick(self) -> None:
        return


_CONTROL = r"\x1b\[[0-9;?]*[ -/]*[@-~]|[\x00-\x1f\x7f]"  # compiled only once a progress bar is drawn


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
