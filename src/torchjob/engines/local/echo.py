"""The job's output on the caller's console while it runs: its containers' log lines, each with
its pod's prefix and colour, progress bars, the live table, and the summary at its end.

The containers write to their log files; :class:`Echo` follows those files and prints what they
gained on each pass of the loop, as much as the reader takes: a slow reader is not fed more, the
files keep the rest. At the end every line left is printed, or, from a reader stalled too long,
only counted (the summary says how many).
"""

from __future__ import annotations

from collections.abc import Callable

from torchjob.controller.kubelet import Pod
from torchjob.display import headline, pod_color, pod_rows, prefix_for, summary
from torchjob.engines.local.output import Console, SinkConsole, short_name
from torchjob.files import LogFollower
from torchjob.reports import JobReport

LOG_EVERY = 0.05  # seconds between reads of the followed log files when they are printed
OUTPUT_STALL = 2.0  # at the end, seconds a reader may take nothing before the rest is only counted
INTERRUPTED_STALL = 0.2  # the same after a Ctrl-C or SIGTERM: the user wants the prompt back
TABLE_ROWS = 20  # pods in the live table


class Echo:
    """``console`` None: nothing is printed; ``echo_logs`` False: only notes and the summary (a
    detached job's supervisor). ``report`` gives the job's report for the live table; ``ordinal``
    a pod's place in the job, which picks its colour."""

    def __init__(
        self,
        console: Console | SinkConsole | None,
        echo_logs: bool,
        job_name: str,
        report: Callable[[], JobReport],
        ordinal: Callable[[Pod], int],
    ) -> None:
        self.console = console
        self.echo_logs = echo_logs and console is not None
        self.job_name = job_name
        self.report = report
        self.ordinal = ordinal
        self.follower = LogFollower()

    def follow(self, pod: Pod) -> None:
        """Print the pod's containers' logs from now on."""
        if not self.echo_logs:
            return
        short = short_name(self.job_name, pod.name)
        color = pod_color(self.ordinal(pod))
        for c in pod.inits:
            self.follower.follow(c.log, prefix_for(short, pod.rank, c.name), color)
        for c in pod.mains:
            name = None if len(pod.mains) == 1 else c.name
            self.follower.follow(c.log, prefix_for(short, pod.rank, name), color)

    def close(self, pod: Pod) -> None:
        """The pod has ended: its logs are read to their end, then closed."""
        for c in pod.containers:
            self.follower.close(c.log)

    def show(self) -> None:
        """One pass: the new log lines, the progress bars and the live table."""
        console = self.console
        if console is not None:
            console.tick()
        if not self.echo_logs or console is None:
            return
        # A slow reader is not fed more than it takes: the log files keep the rest until it has room.
        lines = self.follower.read() if console.room() else []
        if lines:
            console.lines((item.prefix, item.color, text) for item, text in lines)
        else:
            console.stream.flush()
        if console.live:  # progress bars (lines redrawn with \r) live, before they end
            console.progress((item.prefix, item.color, text) for item, text in self.follower.progress())
        if console.live:
            report = self.report()
            console.table([headline(report, True), *pod_rows(report, True, limit=TABLE_ROWS)])

    def drain(self, pods: list[Pod], interrupted: bool, stop: Callable[[], bool]) -> None:
        """Print every line still in the log files, or count what a stalled reader never took.
        ``interrupted``: the job was stopped by a signal, and ends promptly; ``stop``: a new
        Ctrl-C stops the printing (not the count)."""
        for pod in pods:
            self.close(pod)
        if not self.echo_logs or self.console is None:
            return
        self.follower.seal()  # every process of the job is gone: nothing is waited for beyond this
        stall = INTERRUPTED_STALL if interrupted else OUTPUT_STALL
        while self.follower.files and self.console.drain(stall, stop):
            self.show()
        self.console.unshown += self.follower.skip()

    def finish(
        self, report: JobReport, remove: bool, after: str, interrupted: bool, stop: Callable[[], bool]
    ) -> None:
        """The summary, then ``after`` (a line, or nothing); waits, bounded, for the reader to take it."""
        console = self.console
        if console is None:
            return
        console.end_live()
        for line in summary(report, console.color, console.unshown, remove):
            console.print(line)
        if after:
            console.print(after)
        console.finish(INTERRUPTED_STALL if interrupted else OUTPUT_STALL, stop)
