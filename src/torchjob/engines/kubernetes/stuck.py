"""What keeps a followed job from running, told once, and past the pending timeout an error that
ends the following: an image that cannot be pulled (at once), a pod no scheduler places, a
Volcano PodGroup not admitted, no pod created at all."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from torchjob.engine_api.base import EngineError, JobReport
from torchjob.engines.kubernetes.phase import (
    PODGROUP_WAITING,
    image_pull_error,
    pod_identity,
    podgroup_phase,
    podgroup_problem,
    unschedulable_message,
    waiting_for_scheduler,
)


class Stuck:
    """The job's pods and PodGroup as they wait, checked after each batch of events."""

    def __init__(self, name: str, target: str, pending_timeout: float, notify: Callable[[str], None]) -> None:
        self.name, self.target = name, target
        self.pending_timeout = pending_timeout
        self.notify = notify
        self._pending_since: dict[str, float] = {}  # pod -> since when it waits for a node
        self._noted: set[str] = set()  # what was told already
        self._empty_since: float | None = time.monotonic()  # since when the job has no pod
        self._group_since: float | None = None  # since when its PodGroup waits

    def check(
        self,
        pods: dict[str, dict[str, Any]],
        names: set[str],
        group: dict[str, Any] | None,
        report: JobReport | None,
    ) -> None:
        """Fail fast on an image that cannot be pulled; on a pod unschedulable for too long; on a
        job not started (``group`` not admitted, or no pod at all) for too long. ``names``: the
        pods changed since the last check."""
        now = time.monotonic()
        for name in names:
            pod = pods.get(name)
            if pod is None:
                self._pending_since.pop(name, None)
                continue
            pulled = image_pull_error(pod)
            if pulled:
                image, reason, message = pulled
                detail = f": {message}" if message else ""
                raise EngineError(
                    f"job {self.name}: pod {self._short(pod)} cannot pull image {image!r} "
                    f"({reason}{detail}); fix the image and submit again with --replace"
                )
            stuck = unschedulable_message(pod)
            if stuck is None and waiting_for_scheduler(pod) is None:
                self._pending_since.pop(name, None)
                continue
            self._pending_since.setdefault(name, now)
            if stuck is not None and name not in self._noted:
                self._noted.add(name)
                self.notify(f"pod {self._short(pod)} is Pending: Unschedulable: {stuck}")
        for name, since in self._pending_since.items():  # still stuck, even without new events
            if now - since >= self.pending_timeout:
                raise self._stuck_pod(pods[name], now - since)
        self._waiting(now, pods, group, report)

    def _stuck_pod(self, pod: dict[str, Any], waited: float) -> EngineError:
        """A pod no scheduler placed: the scheduler's message, or the scheduler it waits for."""
        head = f"job {self.name}: pod {self._short(pod)} is stuck Pending for {waited:.0f}s"
        scheduler = waiting_for_scheduler(pod) or str((pod.get("spec") or {}).get("schedulerName") or "")
        message = unschedulable_message(pod)
        if message is not None:
            return EngineError(f"{head} waiting for scheduler {scheduler!r}; the scheduler says: {message}")
        return EngineError(
            f"{head}: no scheduler has bound it to a node; it waits for scheduler {scheduler!r} "
            "(is that scheduler running on this cluster?)"
        )

    def _waiting(
        self, now: float, pods: dict[str, Any], group: dict[str, Any] | None, report: JobReport | None
    ) -> None:
        """A job that has not started: its PodGroup not admitted, or no pod at all, for too long."""
        if report is not None and report.terminal:
            return
        if group is not None and podgroup_phase(group) in PODGROUP_WAITING:
            problem = podgroup_problem(group)
            if self._group_since is None:
                self._group_since = now
            if problem and "\0podgroup" not in self._noted:
                self._noted.add("\0podgroup")
                self.notify(f"PodGroup {group['metadata']['name']} is Pending: {problem}")
            waited = now - self._group_since
            if waited >= self.pending_timeout:
                held = "no pod is bound" if pods else "no pod is created"
                why = (
                    f"Volcano's scheduler says: {problem}"
                    if problem
                    else "no scheduler has admitted it (is Volcano's scheduler running?)"
                )
                raise EngineError(
                    f"job {self.name}: PodGroup {group['metadata']['name']} is stuck Pending for "
                    f"{waited:.0f}s and {held} until it is admitted; {why}"
                )
            return
        self._group_since = None
        if pods:
            self._empty_since = None
            return
        self._empty_since = self._empty_since or now
        if now - self._empty_since >= self.pending_timeout:
            said = report.reason if report is not None else ""
            why = (
                f"its status says: {said}"
                if said
                else (f"is the controller of --target {self.target} running on this cluster?")
            )
            raise EngineError(f"job {self.name}: no pod was created in {now - self._empty_since:.0f}s; {why}")

    def _short(self, pod: dict[str, Any]) -> str:
        task, index = pod_identity(self.name, pod, self.target)
        return f"{task}-{index}"
