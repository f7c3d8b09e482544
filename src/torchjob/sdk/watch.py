"""What the caller sees while a task's pods run: rendezvous progress and the pods' own output.

The engine runs quietly for SDK calls (no status table), so a background thread echoes
``k/N nodes joined`` lines that the rendezvous host writes, and copies every pod's log lines to
this process's stdout with a ``<task>-<index> |`` prefix, as torchrun shows every rank's output.
The pods' lines come from the engine's own ``logs`` (followed), so any engine can be watched.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from torchjob.files import LogFollower
from torchjob.logs import get_logger

if TYPE_CHECKING:
    from torchjob.engines.base import Engine

logger = get_logger()

INTERVAL = 0.2


class JobWatcher:
    """Echo progress and pod logs until stopped; use as a context manager around the run.

    ``engine`` and ``job`` (a reference the engine knows the job by once it has started) give the
    pods' logs; without an engine only the progress is echoed.
    """

    def __init__(self, progress: Path, label: str, engine: Engine | None = None, job: str = "") -> None:
        self.progress = LogFollower()
        self.progress.follow(progress, "rendezvous")
        self.label = label
        self.engine = engine
        self.job = job
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._progress, daemon=True)
        self.logs = threading.Thread(target=self._logs, daemon=True)

    def _progress(self) -> None:
        while not self.stop.wait(INTERVAL):
            self.tick()

    def tick(self) -> None:
        for _, line in self.progress.read():
            print(f"torchjob: {self.label}: rendezvous: {line}", file=sys.stderr, flush=True)
            logger.debug("%s: rendezvous: %s", self.label, line)

    def _logs(self) -> None:
        """Follow the job's logs from when the engine knows it until it ends."""
        from torchjob.engines.base import EngineError, LogQuery

        assert self.engine is not None
        while True:
            done = self.stop.is_set()  # the run returned: one last look, then no more
            try:
                lines = self.engine.logs(self.job, LogQuery(follow=not done))
            except EngineError:  # not started yet
                if done:
                    return
                self.stop.wait(INTERVAL)  # a job that ended meanwhile (a warm call) gets its last look
                continue
            try:
                for line in lines:
                    sys.stdout.write(f"{line.pod or line.prefix} | {line.text}\n")
                    sys.stdout.flush()
            except (OSError, EngineError) as err:  # the echo stops; the job and its logs do not
                logger.debug("%s: no more pod output: %s", self.label, err)
            return

    def __enter__(self) -> JobWatcher:
        self.thread.start()
        if self.engine is not None:
            self.logs.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        if self.engine is not None:
            self.logs.join(timeout=10)
        self.tick()
