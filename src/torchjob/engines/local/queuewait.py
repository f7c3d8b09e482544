"""A job's turn in the local queue, as its supervisor waits for it and then holds it.

Before any pod the job waits, holding no port, until the queue (``admission``) admits its gang:
status.json and the console say why it waits, once per change; a signal or the job's deadline
ends the wait (phase Terminated). While the job runs, pods beyond the gang start as the queue
grants them (:meth:`QueueWait.grow`); at the end the job's CPUs, memory and GPUs go back.
Loaded only for a job that asks for resources (the others never wait).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from torchjob.controller import Controller
from torchjob.controller.kubelet import SUCCEEDED, Pod
from torchjob.engines.local.admission import GROW_EVERY, POLL, POLL_MAX, Ticket
from torchjob.engines.local.creation import PodFactory
from torchjob.engines.local.notes import Notes
from torchjob.engines.local.output import hush
from torchjob.engines.local.signals import Signals
from torchjob.engines.local.statusfile import StatusFile
from torchjob.engines.local.waiter import ExitWaiter
from torchjob.lifecycle import JobPhase, JobStatus, initial_status
from torchjob.logs import Level
from torchjob.spec.model import Job


class QueueWait:
    def __init__(
        self,
        ticket: Ticket,
        job: Job,
        job_id: str,
        *,
        ctl: Controller[Pod],
        factory: PodFactory,
        notes: Notes,
        status: StatusFile,
        signals: Signals,
        waiter: ExitWaiter,
        check_dir: Callable[[], None],
    ) -> None:
        self.ticket = ticket  # the job's place in the queue, made with the controller it gates
        self.job = job
        self.job_id = job_id
        self.ctl = ctl
        self.factory = factory
        self.notes = notes
        self.status = status
        self.signals = signals
        self.waiter = waiter
        self.check_dir = check_dir  # raises once the job's directory is gone: the wait ends with it
        self.told_waiting = False  # a detached job's caller was let go while the job waits its turn
        self.next_grow = 0.0  # when to try again to grant pods beyond the gang

    def admit(self, on_waiting: Callable[[], None] | None) -> bool:
        """Wait for the job's turn; False when it ended while waiting (a signal, its deadline).
        ``on_waiting`` is told once if it has to wait."""
        ticket, ctl = self.ticket, self.ctl
        for note in ticket.plan.notes:
            self.notes.record(note)
        shown = ""
        started = self.status.started
        while not ticket.poll():
            self.check_dir()  # a removed job would otherwise hold its place in the queue unseen
            if ticket.reason != shown:  # in status.json and on the console, once per change
                shown = ticket.reason
                ctl.status = JobStatus(JobPhase.PENDING, 0, 0, shown)
                self.notes.note(f"job {self.job_id} is {shown}", Level.WARNING)
                self.status.write()
                if on_waiting is not None and not self.told_waiting:
                    on_waiting()
                    self.told_waiting = True
            received = self.signals.received
            if received:
                name = signal.Signals(received[-1]).name
                self.signals.interrupted = received[-1]
                console = self.notes.console
                if self.signals.interrupted == signal.SIGINT and console is not None:
                    hush(console, self.job_id, [], f"waiting in queue {ticket.plan.queue}")
                queue = ticket.plan.queue
                return self._end(f"torchjob received {name} while the job waited in queue {queue}")
            elapsed = time.time() - started
            if ctl.timeout is not None and elapsed >= ctl.timeout:
                deadline = f"the job's deadline of {ctl.timeout:g}s"
                return self._end(f"{deadline} passed while it waited in the queue")
            every = min(POLL_MAX, POLL + elapsed / 20)  # 0.2 s at first, 1 s after 16 s of waiting
            wait = every if ctl.timeout is None else min(every, ctl.timeout - elapsed)
            self.waiter.wait(wait)
        if shown:
            self.notes.record(f"admitted to queue {ticket.plan.queue} after {time.time() - started:.1f}s")
        ctl.status = initial_status()  # the deadline counts on from the submission, waiting included
        return True

    def _end(self, reason: str) -> bool:
        self.ctl.status = JobStatus(JobPhase.TERMINATED, 0, 0, reason)
        self.ctl.dirty = True
        return False

    def grow(self, now: float) -> None:
        """Pods beyond the gang start once the queue grants them."""
        ctl = self.ctl
        if now < self.next_grow or ctl.status.phase.final:
            return
        self.next_grow = now + GROW_EVERY
        # A pod that succeeded holds nothing any more (a failed one keeps its share: the job may
        # well be restarted by a policy, and must not then start below its gang).
        finished = {
            f"{t}/{i}" for (t, i), p in ctl.pods.items() if p.phase == SUCCEEDED and not p.terminating
        }
        more = self.ticket.grow(finished)  # never raises over the queue's state: see notice
        said = self.ticket.notice()
        if said:  # in the job's events (status) and on its console
            self.notes.record(said)
            ctl.dirty = True
        if more:
            self.factory.regrant(list(more))
        # As Volcano's sync creates the pods that do not exist: those the queue lets start now.
        running = ctl.status.phase in (JobPhase.PENDING, JobPhase.RUNNING)
        if running and len(ctl.pods) < self.job.total_replicas:
            ctl.create_missing()

    def release(self) -> None:
        """The job's CPUs, memory and GPUs go to the next job in the queue."""
        self.ticket.release()
