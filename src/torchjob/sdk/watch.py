"""What the caller sees while a task's pods run: rendezvous progress and the pods' own output.

The local engine runs quietly for SDK calls (no status table), so a background thread echoes
``k/N nodes joined`` lines that the rendezvous host writes, and copies every pod's log lines to
this process's stdout with a ``<task>-<index> |`` prefix, as torchrun shows every rank's output.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from torchjob.logs import get_logger

logger = get_logger()

INTERVAL = 0.2


class _Tail:
    """New complete lines of one growing file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.rest = b""

    def lines(self) -> list[str]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        self.offset += len(data)
        *complete, self.rest = (self.rest + data).split(b"\n")
        return [line.decode(errors="replace") for line in complete]


class JobWatcher:
    """Echo progress and pod logs until stopped; use as a context manager around the run."""

    def __init__(self, progress: Path, label: str, logs: Path | None = None, job_glob: str = "") -> None:
        self.progress = _Tail(progress)
        self.label = label
        self.logs = logs  # the engine's job root; the job's directory is found by job_glob
        self.job_glob = job_glob
        self.tails: dict[Path, _Tail] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(INTERVAL):
            self.tick()

    def tick(self) -> None:
        for line in self.progress.lines():
            print(f"torchjob: {self.label}: rendezvous: {line}", file=sys.stderr, flush=True)
            logger.debug("%s: rendezvous: %s", self.label, line)
        if self.logs is None:
            return
        for path in sorted(self.logs.glob(f"{self.job_glob}/logs/*/attempt-*/*.log")):
            tail = self.tails.setdefault(path, _Tail(path))
            pod = path.parent.parent.name
            short = pod[len(self.label) + 1 :] if pod.startswith(self.label + "-") else pod
            for line in tail.lines():
                sys.stdout.write(f"{short} | {line}\n")
        sys.stdout.flush()

    def __enter__(self) -> JobWatcher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.tick()
