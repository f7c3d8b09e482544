"""Signals to the supervisor: SIGINT, SIGTERM and SIGHUP stop the job; a second one kills it.

The handlers only note the signal and wake the loop (:class:`~.waiter.ExitWaiter`); the loop
reacts on its next pass (:meth:`Signals.handle`): the job is terminated as Volcano's
``TerminateJob`` would (the pods get their grace), and a signal that comes while it already stops
kills every process of the job at once. A Ctrl-C on a console is said in one line once the job
has stopped (``output.hush``).
"""

from __future__ import annotations

import signal
import threading

from torchjob.controller import Controller
from torchjob.controller.kubelet import ENDED, Kubelet, Pod
from torchjob.engines.local.notes import Notes
from torchjob.engines.local.output import hush
from torchjob.engines.local.waiter import ExitWaiter
from torchjob.lifecycle import Action, JobPhase
from torchjob.logs import Level
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from types import FrameType
    from typing import Any

STOPPING = (JobPhase.TERMINATING, JobPhase.TERMINATED)


class Signals:
    def __init__(self, waiter: ExitWaiter) -> None:
        self.waiter = waiter
        self.received: list[int] = []  # not handled yet
        self.interrupted: int | None = None  # the signal that stopped the job
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Take SIGINT, SIGTERM and SIGHUP (in the main thread only: elsewhere Python cannot)."""
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum: int, frame: FrameType | None) -> None:
            self.received.append(signum)
            self.waiter.wake()

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._previous[sig] = signal.signal(sig, handler)

    def restore(self) -> None:
        """The handlers from before :meth:`install`."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def pending(self) -> bool:
        return bool(self.received)

    def handle(self, ctl: Controller[Pod], kubelet: Kubelet, notes: Notes, job_id: str) -> None:
        """What the signals received since the last pass do to the job."""
        if not self.received:
            return
        received, self.received = self.received, []
        for signum in received:
            name = signal.Signals(signum).name
            if ctl.status.phase in STOPPING or ctl.status.phase.final:
                notes.note(f"{name} again: killing every process of the job now", Level.ERROR)
                kubelet.kill(list(ctl.pods.values()))
                continue
            self.interrupted = self.interrupted or signum
            if signum == signal.SIGINT and notes.console is not None:  # Ctrl-C: one line (hush)
                stopping = [p.name for p in ctl.latest.values() if not p.gone and p.phase not in ENDED]
                hush(notes.console, job_id, stopping)
            else:
                notes.note(f"{name}: stopping the job (again to kill at once)", Level.WARNING)
            ctl.act(Action.TERMINATE_JOB, None, None, f"torchjob received {name}")
