"""The decision, pure, on one look at the live state: whether a waiting job may start now and with
which pods and GPUs (:func:`decide`), and which more pods of a running job fit (:func:`grow`).

* **Gang**: a job is admitted when its gang fits in what is free; it then gets the whole job if
  that fits too, else the gang; its other pods are granted one by one as they fit.
* **Order**: higher priority first; among equals, jobs of queues that use less than their weight's
  share first; then submission order. A job that does not fit blocks the jobs behind it that want
  what it is short of, but only after it was passed ``backfill`` times: small jobs may fill the
  gaps, yet a large job's turn comes after a bounded number of them.
* **GPUs** are handed out by identity (:attr:`.capacity.Capacity.gpu_ids`): a GPU another job holds,
  under whatever name, is not free.
"""

from __future__ import annotations

from collections.abc import Mapping

from torchjob.engines.local.admission.amounts import (
    GPU,
    RESOURCES,
    Amounts,
    fmt,
    minus,
    over,
    plus,
    short,
    total,
)
from torchjob.engines.local.admission.capacity import Capacity
from torchjob.engines.local.admission.settings import Settings
from torchjob.records import record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any


@record
class Verdict:
    granted: dict[str, list[str]] | None  # pod key -> GPU ids; None: not admitted yet
    reason: str = ""


def held(entry: Mapping[str, Any]) -> Amounts:
    pods = entry.get("pods") or {}
    return total(pods, [k for k in entry.get("granted") or {} if k in pods])


class Scene:
    """One look at the state, from one job's side: who holds what, who waits in which order."""

    def __init__(self, jobs: dict[str, dict[str, Any]], capacity: Capacity, settings: Settings) -> None:
        self.jobs = jobs
        self.capacity = capacity
        self.settings = settings
        self.used: Amounts = {}
        self.queue_used: dict[str, Amounts] = {}
        for e in jobs.values():
            if e.get("admitted"):
                self.used = plus(self.used, held(e))
                q = str(e.get("queue"))
                self.queue_used[q] = plus(self.queue_used.get(q, {}), held(e))
        self.free = minus(capacity.amounts, self.used)
        taken = {d for e in jobs.values() for ids in (e.get("granted") or {}).values() for d in ids}
        self.devices = [d for d in capacity.gpu_ids if d not in taken]

    def queue_free(self, queue: str) -> Amounts:
        cap = self.settings.queue(queue).capability
        used = self.queue_used.get(queue, {})
        return {k: cap[k] - used.get(k, 0.0) for k in cap}

    def overused(self, queue: str) -> bool:
        """Whether the queue holds more than its weight's share of something (Volcano's proportion)."""
        active = {str(e.get("queue")) for e in self.jobs.values()}
        weights = sum(self.settings.queue(q).weight for q in active) or 1.0
        share = self.settings.queue(queue).weight / weights
        used = self.queue_used.get(queue, {})
        return any(used.get(k, 0.0) > self.capacity.amounts.get(k, 0.0) * share + 1e-9 for k in RESOURCES)

    def waiting(self) -> list[dict[str, Any]]:
        over_share = {q: self.overused(q) for q in {str(e.get("queue")) for e in self.jobs.values()}}
        found = [e for e in self.jobs.values() if not e.get("admitted")]
        return sorted(
            found,
            key=lambda e: (-int(e.get("priority", 0)), over_share[str(e.get("queue"))], int(e.get("seq", 0))),
        )

    def blocked_by(
        self, entry: Mapping[str, Any], free: Amounts, queue_free: Amounts
    ) -> tuple[list[str], list[str]]:
        """Resources the job's gang is short of: on the machine, and under its queue's capability."""
        need = total(entry["pods"], list(entry["gang"]))
        return short(need, free), over(need, queue_free)


def decide(jobs: dict[str, dict[str, Any]], me: str, capacity: Capacity, settings: Settings) -> Verdict:
    """Whether job ``me`` may start now, and with which pods and GPUs; pure, on a live state.

    The waiting jobs ahead of it are taken in order: one that fits would be admitted first (its
    supervisor will on its next look), so what it needs is set aside; one that does not fit
    blocks ``me`` if ``me`` wants what it is short of and it was passed ``backfill`` times already.
    """
    scene = Scene(jobs, capacity, settings)
    mine = jobs[me]
    free = dict(scene.free)
    queue_free = {q: scene.queue_free(q) for q in {str(e.get("queue")) for e in jobs.values()}}
    blockers: list[tuple[dict[str, Any], list[str], list[str]]] = []
    ahead_in_queue = 0
    for entry in scene.waiting():
        if entry is mine:
            break
        if entry.get("queue") == mine.get("queue"):
            ahead_in_queue += 1
        lacks, capped = scene.blocked_by(entry, free, queue_free[str(entry.get("queue"))])
        if lacks or capped:
            blockers.append((entry, lacks, capped))
            continue
        need = total(entry["pods"], list(entry["gang"]))
        free = minus(free, need)
        q = str(entry.get("queue"))
        queue_free[q] = minus(queue_free[q], {k: need.get(k, 0.0) for k in queue_free[q]})
    queue = str(mine.get("queue"))
    need = total(mine["pods"], list(mine["gang"]))
    lacks, capped = scene.blocked_by(mine, free, queue_free[queue])
    ahead = f"; {ahead_in_queue} job{'s' if ahead_in_queue != 1 else ''} ahead in queue {queue}"
    if lacks or capped:
        parts = [f"{fmt(k, need[k])} {k}, {fmt(k, max(0.0, scene.free.get(k, 0.0)))} free" for k in lacks] + [
            f"{fmt(k, need[k])} {k} under queue {queue}'s capability, "
            f"{fmt(k, max(0.0, queue_free[queue][k]))} left"
            for k in capped
            if k not in lacks
        ]
        return Verdict(None, f"waiting for {'; '.join(parts)}{ahead}")
    conflicts = []
    for entry, bshort, bcapped in blockers:
        wants = [k for k in bshort if need.get(k)]
        if entry.get("queue") == queue:
            wants += [k for k in bcapped if need.get(k)]
        if wants:
            conflicts.append(entry)
            if int(entry.get("passed", 0)) >= settings.backfill:
                return Verdict(
                    None,
                    f"waiting for job {entry.get('job')} to start first (it was passed "
                    f"{settings.backfill} times){ahead}",
                )
    for entry in conflicts:
        entry["passed"] = int(entry.get("passed", 0)) + 1
    # The whole job when it fits, else its gang (the rest is granted as it fits: grow).
    everything = total(mine["pods"])
    whole = not short(everything, free) and not over(everything, queue_free[queue])
    keys = list(mine["pods"]) if whole else list(mine["gang"])
    return Verdict(_give(mine, keys, scene.devices), "")


def _give(entry: Mapping[str, Any], keys: list[str], devices: list[str]) -> dict[str, list[str]]:
    granted: dict[str, list[str]] = {}
    cursor = 0
    for key in entry["pods"]:  # pod order: the first pods get the first free GPUs
        if key in keys:
            n = int(entry["pods"][key].get(GPU, 0))
            granted[key] = devices[cursor : cursor + n]
            cursor += n
    return granted


def grow(
    jobs: dict[str, dict[str, Any]],
    me: str,
    capacity: Capacity,
    settings: Settings,
    finished: set[str] | frozenset[str] = frozenset(),
) -> dict[str, list[str]]:
    """Pods of a running job beyond what it holds that fit now (``finished`` pods need nothing):
    after every waiting gang, which comes first (a gang waits whole, an extra pod may start alone)."""
    scene = Scene(jobs, capacity, settings)
    mine = jobs[me]
    free = dict(scene.free)
    for entry in scene.waiting():
        free = minus(free, total(entry["pods"], list(entry["gang"])))
    cap_left = scene.queue_free(str(mine.get("queue")))
    out: dict[str, list[str]] = {}
    devices = list(scene.devices)
    granted = mine.get("granted") or {}
    # A gang pod that gave its share back (it had ended) and is wanted again (the job restarts):
    # the gang's missing pods come back together or not at all, before any pod beyond the gang.
    missing = [k for k in mine["gang"] if k not in granted and k not in finished]
    if missing:
        need = total(mine["pods"], missing)
        if short(need, free) or over(need, cap_left):
            return {}
    for key, request in mine["pods"].items():
        if key in granted or key in finished:
            continue
        if short(request, free) or over(request, cap_left):
            break  # in pod order: index 3 does not start before index 2
        n = int(request.get(GPU, 0))
        out[key], devices = devices[:n], devices[n:]
        free = minus(free, request)
        cap_left = minus(cap_left, {k: request.get(k, 0.0) for k in cap_left})
    return out
