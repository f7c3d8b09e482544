"""``wait`` on an engine whose job report is read again and again (local, Slurm): until the job
ended, or the caller's timeout passed.

A failed job whose stopped pods are still stopping is given up to SETTLE_SECONDS more: their
logs may yet name the root cause (``JobReport.settling``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from torchjob.phases import UNKNOWN
from torchjob.reports import JobReport

SETTLE_SECONDS = 15.0  # the longest a wait waits, after a job failed, for the pods it stopped (a
# pod's default grace of 5 s, then its kill, with room to spare)


def until_ended(read: Callable[[], JobReport], timeout: float | None, every: float) -> JobReport:
    """The report ``read`` gives once the job ended (or is Unknown: nobody will change it again),
    or once ``timeout`` seconds passed; read every ``every`` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    settled = None  # when the pods a failure stopped have had their time to go
    while True:
        report = read()
        if report.settling:  # the root cause may still change: a while
            settled = settled or time.monotonic() + SETTLE_SECONDS
            if time.monotonic() < settled and (deadline is None or time.monotonic() < deadline):
                time.sleep(every)
                continue
        if report.terminal or report.phase == UNKNOWN:
            return report
        if deadline is not None and time.monotonic() >= deadline:
            return report
        time.sleep(every)
