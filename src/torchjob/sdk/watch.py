"""What the caller sees while a task's pods run: rendezvous progress and the pods' own output.

The engine runs for SDK calls with this watcher as its sink (engines.base.Sink): it hands over
each pod's log lines, which a background thread copies to this process's stdout with a
``<task>-<index> |`` prefix, as torchrun shows every rank's output, together with the
``k/N nodes joined`` lines that the rendezvous host writes. The engine's notes go to the debug
log and its summary nowhere: a task returns its value or raises.
"""

from __future__ import annotations

import collections
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from torchjob.files import LogFollower
from torchjob.logs import get_logger

if TYPE_CHECKING:
    from torchjob.engine_api.base import LogLine

logger = get_logger()

INTERVAL = 0.2
BACKLOG = 10_000  # lines handed over but not yet printed before the engine holds the rest back


class JobWatcher:
    """Echo progress and the lines the engine hands over until stopped; a context manager around
    the run, and the run's sink (``StartOptions(sink=watcher)``)."""

    stream = None  # a sink of lines: no terminal for a live table

    def __init__(self, progress: Path, label: str) -> None:
        self.progress = LogFollower()
        self.progress.follow(progress, "rendezvous")
        self.label = label
        self.pending: collections.deque[str] = collections.deque()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._progress, daemon=True)

    # The engine's side (its supervisor's loop): never blocks on this process's stdout.
    def log(self, line: LogLine) -> None:
        self.pending.append(f"{line.pod or line.prefix} | {line.text}\n")

    def room(self) -> bool:
        return len(self.pending) < BACKLOG

    def notice(self, text: str) -> None:
        logger.info(text)  # as the supervisor logs a note when nobody is shown it

    def report(self, text: str) -> None:
        return

    # The printing thread's side.
    def _progress(self) -> None:
        while not self.stop.wait(INTERVAL):
            self.tick()

    def tick(self) -> None:
        for _, line in self.progress.read():
            print(f"torchjob: {self.label}: rendezvous: {line}", file=sys.stderr, flush=True)
            logger.debug("%s: rendezvous: %s", self.label, line)
        try:
            while self.pending:
                sys.stdout.write(self.pending.popleft())
            sys.stdout.flush()
        except OSError as err:  # the echo stops; the job and its logs do not
            logger.debug("%s: no more pod output: %s", self.label, err)
            self.pending.clear()

    def __enter__(self) -> JobWatcher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.tick()
