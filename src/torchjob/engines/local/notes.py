"""What the supervisor says about a job: notes for the user, and records kept as the job's events.

A note is printed once: on the console when the job has one, else as a log record (``-v``, a
detached job's supervisor.log). A record is a note that is also kept, the latest 50, as the job's
events (``status``, status.json), and becomes the controller's ``told`` (a phase change it causes
does not repeat it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from torchjob import logs
from torchjob.display import level_color
from torchjob.logs import Level
from torchjob.reports import Event
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from torchjob.engines.local.output import Console, SinkConsole

KEPT_EVENTS = 50


class Notes:
    def __init__(self, console: Console | SinkConsole | None, told: Callable[[str], None]) -> None:
        self.console = console
        self.told = told  # the controller learns the last event told (Controller.told)
        self.events: list[Event] = []

    def note(self, text: str, level: Level = Level.INFO) -> None:
        if self.console is not None:
            self.console.note(text, level_color(level))
        else:
            logs.info(text)

    def record(self, text: str) -> None:
        self.events.append(Event(time.time(), text))
        self.events = self.events[-KEPT_EVENTS:]
        self.note(text, Level.WARNING)
        self.told(text)
