"""The silence notice: one line once every pod of a running job has written nothing for a while.

A hang (a rank waiting for a peer that never comes) is otherwise silent until a timeout. The pods'
log files are looked at once a second, by their modification times; output from any pod re-arms
the notice (``run --hang-notice SECONDS``, 0 never).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable

from torchjob.controller.kubelet import RUNNING, Pod
from torchjob.display import elapsed
from torchjob.lifecycle import JobPhase

LOOK_EVERY = 1.0  # seconds between looks at the pods' logs


def last_output(pod: Pod) -> float:
    """When the pod last wrote to any of its logs (its start, if it never did)."""
    times = [pod.started_at or 0.0]
    for c in pod.containers:
        with contextlib.suppress(OSError):
            times.append(c.log.stat().st_mtime)
    return max(times)


class Silence:
    def __init__(self, seconds: float, job_id: str, record: Callable[[str], None]) -> None:
        self.seconds = seconds  # of silence from every pod before the notice; 0: never
        self.job_id = job_id
        self.record = record
        self.checked = 0.0  # monotonic time of the last look
        self.told = False  # said for this silence

    def check(self, now: float, phase: JobPhase, pods: Iterable[Pod]) -> None:
        if not self.seconds or phase is not JobPhase.RUNNING or now < self.checked + LOOK_EVERY:
            return
        self.checked = now
        live = [p for p in pods if not p.gone and not p.terminating]
        if not live or any(p.phase != RUNNING for p in live):
            return
        last = max(last_output(p) for p in live)
        if time.time() - last < self.seconds:
            self.told = False
        elif not self.told:
            self.told = True
            self.record(
                f"no pod has written any output for {elapsed(last, None)}; if the job hangs, "
                f"torchjob status {self.job_id} shows each pod's last output (run --hang-notice SECONDS "
                "sets when this is said, 0 never)"
            )
