"""The job's status.json, as its supervisor writes it: the controller's report of the job.

It is written before any pod starts (a job whose status cannot be written never starts), again
whenever the controller says something changed, and a last time with the final phase. A write
that fails later (a full disk) is said once and tried again on the next pass; the last one, when
the report no longer fits the room status.json holds, is written without its events, so that the
final phase is what is kept. A job none of whose status could be kept has its directory removed
(and checked gone), since no command could see it. A job that ended with a
``ttlSecondsAfterFinished`` gets its expiry written beside it.
"""

from __future__ import annotations

import contextlib
import time

from torchjob.controller import Controller
from torchjob.controller.kubelet import Pod
from torchjob.controller.report import job_report
from torchjob.engines.local.creation import PodFactory
from torchjob.engines.local.notes import Notes
from torchjob.engines.local.state import JobDir
from torchjob.logs import Level
from torchjob.reports import JobReport
from torchjob.spec.model import Job


class StatusFile:
    def __init__(
        self, job: Job, job_dir: JobDir, ctl: Controller[Pod], factory: PodFactory, notes: Notes
    ) -> None:
        self.job = job
        self.dir = job_dir
        self.ctl = ctl
        self.factory = factory
        self.notes = notes
        self.started = time.time()
        self.finished: float | None = None
        self.error = ""  # why status.json could not be written, once said
        self.removed = False  # a full disk: nothing of the job could be kept
        self.gone = False  # the job directory was removed under the job: nothing is written

    def report(self) -> JobReport:
        factory = self.factory
        report = job_report(
            self.job,
            engine="local",
            id=self.dir.id,
            location="" if self.removed else str(self.dir.path),  # no logs to point at
            status=self.ctl.status,
            latest=self.ctl.latest,
            current=self.ctl.pods,
            ports=factory.ports,
            started=self.started,
            finished=self.finished,
            events=self.notes.events,
            # Not decided before the pods are prepared (a job waiting in the queue): not said.
            name_resolution=factory.hosts.resolution if factory.addressing is not None else "",
        )
        report.network = factory.net.text  # the job's own namespace, or why the machine's
        return report

    def write(self, must: bool = False, brief: bool = False) -> None:
        """Write status.json; a failure (a full disk) is said once and retried on the next pass,
        or raised with ``must``. ``brief``: without the events (see write_final)."""
        if self.gone:
            return
        try:
            report = self.report()
            if brief:
                report.events = []
            self.dir.write_status(report)
        except OSError as err:
            if must:
                raise
            if str(err) != self.error:
                self.error = str(err)
                self.notes.note(f"cannot write {self.dir.status_file}: {err.strerror or err}", Level.ERROR)
            return
        self.ctl.dirty = False
        self.error = ""

    def write_final(self) -> str:
        """The last write, the job's end time in it; its expiry for a TTL. Returns the line that
        tells how long the job is kept ("" without a TTL)."""
        self.finished = time.time()
        if self.gone:
            self.removed = True
            return ""
        self.write()
        if self.error and self.dir.status_file.exists():
            # A full disk, and a report grown past the room status.json holds (its events): the
            # final phase and reason without them, in that room, rather than the last one kept.
            self.write(brief=True)
        if not self.dir.status_file.exists():  # no command could see the job
            self.removed = True
            left = self.dir.remove()
            if left is None:
                self.notes.note(f"job {self.dir.id} removed: its directory could not be written")
            else:
                self.notes.note(
                    f"job {self.dir.id}: its directory could not be written, nor removed: remove {left}",
                    Level.ERROR,
                )
            return ""
        ttl = self.job.spec.ttl_seconds_after_finished
        if ttl is None or not self.ctl.status.phase.final:
            return ""
        with contextlib.suppress(OSError):  # then kept, as a job without a TTL is
            self.dir.write_expiry(self.finished + ttl)
            return (
                f"ttlSecondsAfterFinished {ttl}: the first torchjob command from {ttl}s after "
                "the end removes the job and its logs"
            )
        return ""
