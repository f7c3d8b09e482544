"""Following a Slurm job from the login node: its logs, what Slurm says while it waits, outages.

:func:`lines` reads every pod's log files in the job directory (the compute nodes write them on
the shared filesystem) until the job ended, whatever slurmctld does meanwhile. :class:`Teller`
says, for an attached run, what a person would otherwise not see: Slurm's reason while the job is
pending and each change of it (as ``srun`` says ``queued and waiting for resources``), the
controller's events, and a slurmctld that stopped answering and came back. A pending reason that
says waiting cannot start the job (a request beyond the partition's limits) ends an attached
run only once Slurm kept saying it for :data:`LIMITS_PATIENCE` seconds: the first reason Slurm
gives a new job may be a passing one.

:class:`Interrupts` is the one handler of Ctrl-C and SIGTERM for an attached run: it holds them
while something must not be cut in half (``sbatch`` and recording its job id), raises the first
one while the run follows the job, and notes (and says) every later one while that cancels it;
in the torchjob program, it holds them on to the end once one stopped the run.
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time

from torchjob.display import prefix_for
from torchjob.engine_api.base import JobReport, LogLine, LogQuery, ThisProcess
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path
    from typing import Any

    from torchjob.engine_api.base import Sink
    from torchjob.engines.slurm.view import SlurmView

POLL = 0.3
LIMITS_PATIENCE = 5.0  # seconds Slurm must keep a beyond-limits reason before a run gives up on it
# Pending reasons by which Slurm says that the job asks for more than its partition, QOS or
# association allows: waiting does not start it. (Without EnforcePartLimits, sbatch accepts such
# a job and leaves it pending; with it, sbatch refuses it and says why.) Compiled (and cached by
# re) when a job is seen pending, not before sbatch.
BEYOND_LIMITS = r"Partition(TimeLimit|NodeLimit|Config)|BadConstraints|(QOS|Assoc)Max\w*PerJob\w*|QOSMin\w+"
WHAT_LIMIT = {
    "PartitionTimeLimit": "the time limit is above the partition's",
    "PartitionNodeLimit": "the node count is outside the partition's limits",
    "PartitionConfig": "no node of the partition has what one pod asks for",
}


class BeyondLimits(Exception):
    """Slurm keeps an attached job pending for a reason in BEYOND_LIMITS (the reason)."""


class Teller:
    """Attached: what Slurm and the controller say of the job, told once and as it changes."""

    def __init__(self, view: SlurmView, slurm_id: str, sink: Sink | None) -> None:
        self.view = view
        self.slurm_id = slurm_id
        self.sink = sink
        self.told_event = 0.0
        self.pending: str | None = None  # the pending reason told last
        self.started = False
        self.unreachable = ""
        self.limits_since: float | None = None  # since when Slurm says a beyond-limits reason

    def __call__(self, report: JobReport) -> None:
        asked = self.view.asked(self.slurm_id)
        state, reason = (asked[1], asked[2]) if asked else (None, "")
        self._outage(self.view.unreachable)
        if report.phase == "Pending" and state == "PENDING" and reason not in ("", "None"):
            if reason != self.pending:
                self.pending = reason
                self._say(f"Slurm job {self.slurm_id} is pending: {reason}")
            self._limits(reason)
        elif (
            self.pending is not None
            and not self.started
            and (report.phase != "Pending" or state == "RUNNING")
        ):
            self.started = True  # the wait that was told is over (a short job may be done already)
            self._say(f"Slurm job {self.slurm_id} is running")
        for event in report.events:
            if event.time > self.told_event:
                self.told_event = event.time
                self._say(event.message)

    def _limits(self, reason: str) -> None:
        if not re.fullmatch(BEYOND_LIMITS, reason):
            self.limits_since = None
            return
        now = time.monotonic()
        if self.limits_since is None:
            self.limits_since = now
        elif now - self.limits_since >= LIMITS_PATIENCE:
            raise BeyondLimits(reason)

    def _outage(self, said: str) -> None:
        if said and not self.unreachable:
            self._say(
                f"Slurm does not answer ({said}): the job runs on without slurmctld; following it "
                "from its directory"
            )
        elif self.unreachable and not said:
            self._say(f"Slurm answers again; following job {self.slurm_id}")
        self.unreachable = said

    def _say(self, text: str) -> None:
        if self.sink is not None and text:
            self.sink.notice(text)


def _pods(report: JobReport, query: LogQuery) -> list[str]:
    return [p.name for p in report.pods if query.pod is None or query.pod in (p.name, p.short, p.task)]


def log_files(job_dir: Path, pods: list[str], query: LogQuery) -> list[tuple[int, str, Path]]:
    """(pod ordinal, pod name, file) of the attempts asked for, in order."""
    found = []
    for ordinal, pod in enumerate(pods):
        attempts = sorted((int(d.name), d) for d in (job_dir / "logs" / pod).glob("*") if d.name.isdigit())
        if query.attempt is not None:
            attempts = [a for a in attempts if a[0] == query.attempt]
        elif not query.all_attempts and not query.follow:
            attempts = attempts[-1:]
        for _, directory in attempts:
            for log in sorted(directory.glob("*.log")):
                if query.container is None or log.stem == query.container:
                    found.append((ordinal, pod, log))
    return found


def lines(
    view: SlurmView,
    job_dir: Path,
    query: LogQuery,
    on_report: Callable[[JobReport], None] | None = None,
) -> Iterator[LogLine]:
    """The log lines the query asks for; with ``query.follow`` until the job ended."""
    from torchjob.files import LogFollower

    follower = LogFollower()  # reads a bounded chunk per file per call: any log in bounded memory
    owners: dict[Path, tuple[int, str]] = {}  # log file -> (pod ordinal, pod's short name)
    while True:
        # Read before the files: a job that ended then has every line in them already.
        report = view.report(job_dir)
        if on_report is not None:
            on_report(report)
        ended = report.terminal or report.phase == "Unknown"
        pods = _pods(report, query)  # none until the controller wrote its first status
        ranks = {p.name: p.rank for p in report.pods}
        shorts = {p.name: p.short for p in report.pods}
        # As locally: init containers and one of several main containers are named in the prefix.
        labelled = {
            (p.name, c.name)
            for p in report.pods
            for c in p.containers
            if c.init or sum(not d.init for d in p.containers) > 1
        }
        for ordinal, pod, log in log_files(job_dir, pods, query):
            container = log.stem if (pod, log.stem) in labelled else None
            prefix = prefix_for(shorts.get(pod, pod), ranks.get(pod), container)
            if query.all_attempts:  # as locally: which attempt each line is of
                prefix += f" #{log.parent.name}"
            follower.follow(log, prefix)
            owners.setdefault(log, (ordinal, shorts.get(pod, pod)))
        if ended:  # the last line of each file comes out even without its newline
            for log in list(follower.files):
                follower.close(log)
        while chunk := follower.read():
            for item, text in chunk:
                ordinal, short = owners[item.path]
                yield LogLine(item.prefix, text, pod_ordinal=ordinal, pod=short)
        if ended and follower.files:
            continue  # closing files not yet read to their end
        if not query.follow or ended:
            return
        time.sleep(POLL)


def wait(
    view: SlurmView,
    job_dir: Path,
    timeout: float | None,
    on_report: Callable[[JobReport], None] | None = None,
) -> JobReport:
    """The job's report once it ended (or ``timeout`` passed), through any outage."""
    from torchjob.engine_api.polling import until_ended

    def read() -> JobReport:
        report = view.report(job_dir)
        if on_report is not None:
            on_report(report)
        return report

    return until_ended(read, timeout, POLL)


class Interrupts:
    """Ctrl-C and SIGTERM over an attached run, from its ``sbatch`` to its last word: one handler
    for both, installed once. Handlers set and restored step by step left gaps: a second Ctrl-C
    landing while the first one's KeyboardInterrupt unwound (a client call waits up to 0.25 s for
    its child first) found Python's own handler and cut the cancel short, and a SIGTERM there found
    none, its default ending torchjob with the job left running.

    While holding (``sbatch`` and keeping its id, or a cancel of torchjob's own), a signal is noted,
    not raised. From :meth:`follow` on, the first signal raises KeyboardInterrupt (a wait is cut
    short; one noted while holding is raised then), and every later one is noted: the stop the first
    began is not cut short, and ``on_more`` says so, once. The scope's end gives the handlers back,
    except in the torchjob program once a signal came: they hold every later one, unsaid, until the
    program ends (with 130). Only the main thread can set handlers; elsewhere (an SDK call from
    another thread) the scope changes nothing.
    """

    def __init__(self) -> None:
        self.signum: int | None = None  # the first signal that came
        self.raising = False
        self.on_more: Callable[[], None] | None = None
        self.told = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.signum is not None and ThisProcess.ends_with_command:
            # The torchjob program, stopped by a signal: it ends with this command, so every
            # later signal is held, unsaid, to the end. Python's handlers back, a SIGTERM while
            # the last lines are said (a CI runner's) ended it with -15 instead of 130.
            self.raising = False
            self.on_more = None
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def follow(self, on_more: Callable[[], None] | None = None) -> None:
        """From now on the first signal raises KeyboardInterrupt; one that came while holding is
        raised here. ``on_more``: what to say once when another signal comes after it."""
        self.on_more = on_more
        if self.signum is not None:
            raise KeyboardInterrupt
        self.raising = True

    def check(self) -> None:
        """While following: raise KeyboardInterrupt again for a signal that came. The handler's
        raise is lost where Python cannot raise (a finalizer the signal landed in prints it as
        ignored); the follow, which calls this at every poll, then ends all the same."""
        if self.signum is not None:
            raise KeyboardInterrupt

    def hold(self) -> None:
        """From now on every signal is noted, none raised."""
        self.raising = False

    def _handle(self, signum: int, frame: object) -> None:
        more = self.signum is not None
        if not more:
            self.signum = signum
        if self.raising:
            self.raising = False  # once: the stop that follows is not cut short
            raise KeyboardInterrupt
        if more and not self.told and self.on_more is not None:
            self.told = True
            # Said from the handler, at once; a stream busy with a line of the main thread's
            # refuses a reentrant write (RuntimeError), which must not cut the stop short either.
            with contextlib.suppress(RuntimeError):
                self.on_more()
