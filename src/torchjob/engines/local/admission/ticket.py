"""One job's place in the queue, held by its supervisor from registration to release.

No daemon: each waiting supervisor looks at the state (every 0.2 s, slowing to 1 s after the first
seconds) and decides for itself (:mod:`.decision`); a running one gives back what its ended pods
held, asks for its pods beyond the gang, and checks now and then that its entry is still there.

Bookkeeping never ends a job. When the state cannot be used (its lock held by a stopped process,
a full filesystem, a damaged file being rebuilt, a directory whose permissions changed), a waiting
job waits and says why (:attr:`Ticket.reason`), and a running job runs on with what it holds
(:attr:`Ticket.trouble`, told once it lasts: :meth:`Ticket.notice`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping

from torchjob.engines.local import gpus
from torchjob.engines.local.admission.amounts import GPU
from torchjob.engines.local.admission.decision import Verdict, decide, grow
from torchjob.engines.local.admission.lock import Busy
from torchjob.engines.local.admission.place import QueueDirError
from torchjob.engines.local.admission.plan import Plan
from torchjob.engines.local.admission.store import (
    CHECK_EVERY,
    LOOK_WAIT,
    live_jobs,
    locked_state,
    rebuilding,
)
from torchjob.errors import SpecError
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

POLL = 0.2  # seconds between a waiting supervisor's looks at the queue, at first
POLL_MAX = 1.0  # ... growing to this after a while: fifty waiting jobs cost a few % of a core
GROW_EVERY = 0.5  # seconds between tries to grant a running job's pods beyond its gang
GROW_WAIT = 0.05  # a running job's look waits no longer for the lock: it tries again later
RELEASE_WAIT = 2.0  # the last look; an entry left behind is dropped once its supervisor is gone
NOTICE_AFTER = 2.0  # a running job's trouble is told once it lasted this long (not a passing one)


def trouble_of(err: SpecError | OSError) -> str:
    """Why the queue's state could not be used, for a person."""
    if isinstance(err, Busy):
        return err.reason
    if isinstance(err, QueueDirError):
        return f"{err.where}: {err.message}"
    if isinstance(err, OSError):
        return f"{err.filename or 'the queue'}: {err.strerror or err}"
    return str(err)


class Ticket:
    """One job's place in the queue, held by its supervisor from registration to release."""

    def __init__(self, plan: Plan, job_id: str, name: str) -> None:
        self.plan = plan
        self.id = job_id
        self.name = name
        self.granted: dict[str, list[str]] = {}  # pod key -> the GPUs' identities
        self.reason = ""
        self.registered = False
        self.seq = 0
        self.at = 0.0
        self.next_check = 0.0
        self.finished: set[str] = set()  # pods that succeeded and gave their share back
        self.trouble = ""  # why the last look could not use the state ('' when it could)
        self.trouble_since = 0.0
        self.told = ""

    def _entry(self, data: dict[str, Any], jobs: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """This job's entry, added (first look) or added again (the state was rebuilt meanwhile)."""
        mine = jobs.get(self.id)
        if mine is not None:
            return mine
        from torchjob.engines.local.state import start_time

        if not self.seq:
            self.seq = int(data.get("seq", 0)) + 1
            self.at = time.time()
        data["seq"] = max(int(data.get("seq", 0)), self.seq)
        pid = os.getpid()
        mine = jobs[self.id] = {
            "job": self.id,
            "name": self.name,
            "uid": os.getuid(),
            "pid": pid,
            "created": start_time(pid),
            "at": self.at,
            "seq": self.seq,
            "queue": self.plan.queue,
            "priority": self.plan.priority,
            "pods": self.plan.demand.pods,
            "gang": self.plan.demand.gang,
            "granted": dict(self.granted),
            "passed": 0,
            "reason": "",
            "capacity": self.plan.capacity.summary(),
        }
        if self.granted:  # a running job registering again: it holds what it was given
            mine["admitted"] = time.time()
        self.registered = True
        return mine

    def _troubled(self, err: SpecError | OSError) -> None:
        why = trouble_of(err)
        if why != self.trouble:
            self.trouble_since = time.monotonic()
        self.trouble = why

    def poll(self) -> bool:
        """One look (the first registers the job): True once the job is admitted (``granted`` says
        which pods, with which GPUs); False with :attr:`reason` saying why it waits."""
        try:
            with locked_state(wait=LOOK_WAIT) as data:
                jobs = live_jobs(data)
                mine = self._entry(data, jobs)
                why = rebuilding(data)
                verdict = (
                    Verdict(None, why)
                    if why
                    else decide(jobs, self.id, self.plan.capacity, self.plan.settings)
                )
                mine["reason"] = verdict.reason
                if verdict.granted is not None:
                    mine["granted"] = verdict.granted
                    mine["admitted"] = time.time()
                    data["admitted"] = mine["order"] = int(data.get("admitted", 0)) + 1
        except (SpecError, OSError) as err:  # nothing of this look was kept (Busy, StateError, ...)
            self._troubled(err)
            self.reason = f"waiting: {self.trouble}"
            return False
        self.trouble = ""
        self.reason = verdict.reason
        if verdict.granted is None:
            return False
        self.granted = verdict.granted
        return True

    def grow(self, finished: set[str] | frozenset[str] = frozenset()) -> dict[str, list[str]]:
        """Give back what ``finished`` pods held, and grant pods beyond the gang that fit now;
        those newly granted. A job with nothing to change only checks, every few seconds, that its
        entry is still there (the state may have been rebuilt). Never raises over the state: a
        look that could not use it changes nothing (:attr:`trouble` says why)."""
        self.finished = set(finished)
        done = [k for k in self.granted if k in finished]
        wanted = [k for k in self.plan.demand.pods if k not in self.granted and k not in finished]
        if not done and not wanted:
            if time.monotonic() < self.next_check:
                return {}
            self.next_check = time.monotonic() + CHECK_EVERY
        keep = {k: v for k, v in self.granted.items() if k not in done}
        more: dict[str, list[str]] = {}
        try:
            with locked_state(wait=GROW_WAIT) as data:
                jobs = live_jobs(data)
                mine = self._entry(data, jobs)
                mine["granted"] = dict(keep)  # a pod that ended frees what it held, as on a node
                mine.setdefault("admitted", time.time())
                if wanted and not rebuilding(data):
                    more = grow(jobs, self.id, self.plan.capacity, self.plan.settings, finished)
                    mine["granted"] = {**keep, **more}
        except (SpecError, OSError) as err:  # bookkeeping: the job runs on with what it holds
            self._troubled(err)
            return {}
        self.trouble = ""
        self.granted = {**keep, **more}
        return more

    def notice(self) -> str:
        """What a running job's supervisor should say of the queue now, once: its trouble when it
        has lasted a while, and that it is over; '' when nothing is new."""
        if (
            self.trouble
            and time.monotonic() - self.trouble_since >= NOTICE_AFTER
            and self.trouble != self.told
        ):
            self.told = self.trouble
            return (
                f"the local queue's state cannot be used: {self.trouble}; the job runs on with what it holds"
                + (", its other pods wait" if len(self.granted) < len(self.plan.demand.pods) else "")
            )
        if not self.trouble and self.told:
            self.told = ""
            return "the local queue's state can be used again"
        return ""

    def release(self) -> None:
        """Give everything back; quietly nothing when the state cannot be used (entries of a dead
        supervisor are dropped by the next look anyway)."""
        if not self.registered:
            return
        with contextlib.suppress(SpecError, OSError), locked_state(wait=RELEASE_WAIT) as data:
            live_jobs(data).pop(self.id, None)
        self.registered = False

    def gpu_env(
        self, pod_specs: Mapping[tuple[str, int], Mapping[str, Any]]
    ) -> dict[tuple[str, int], gpus.PodEnv]:
        """Each granted pod's containers' CUDA_VISIBLE_DEVICES, from the GPUs this job was given
        (under the names this job's environment knows them by)."""
        capacity = self.plan.capacity
        if not capacity.devices or not any(GPU in p for p in self.plan.demand.pods.values()):
            return {}
        inventory = capacity.inventory()
        out: dict[tuple[str, int], gpus.PodEnv] = {}
        for (task, index), spec in pod_specs.items():
            ids = self.granted.get(f"{task}/{index}")
            if ids is None:
                continue
            shares = gpus.allocate({0: gpus.needs_of(spec)}, capacity.device_of(ids))[0]
            out[(task, index)] = {name: gpus.container_env(devs, inventory) for name, devs in shares.items()}
        return out

    def admits(self, task: str, index: int) -> bool:
        """Whether the pod may be created now: it is granted, and so is every gang pod that has not
        succeeded (a job is never started again below its gang)."""
        gang = self.plan.demand.gang
        if any(k not in self.granted and k not in self.finished for k in gang):
            return False
        return f"{task}/{index}" in self.granted
