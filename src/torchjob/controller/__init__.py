"""Volcano's job lifecycle, driven over any engine's pods: the controller layer.

:mod:`torchjob.lifecycle` decides (pure: no clock, no I/O); this layer drives it: it keeps one
record per pod slot (task, index), feeds each observed change of a pod to the lifecycle, carries
out the decisions through a :class:`~torchjob.controller.runtime.PodRuntime` (create an attempt,
terminate it with a grace period, kill it, forget it) and keeps the timers (delayed policy
actions, the active deadline) on a clock it is given. An engine provides the runtime: the local
engine's is its process supervisor; a Slurm engine's starts each attempt as a job step.

Modules: :mod:`.runtime` (the interface an engine implements), :mod:`.driver` (the controller).
It imports no engine; engines import it.
"""

from __future__ import annotations

from torchjob.controller.driver import (
    CRASH_LOOP_AFTER,
    DEFAULT_GRACE,
    Backoff,
    Controller,
    termination_grace,
    waiting_backoff,
)

__all__ = [
    "CRASH_LOOP_AFTER",
    "DEFAULT_GRACE",
    "Backoff",
    "Controller",
    "termination_grace",
    "waiting_backoff",
]
