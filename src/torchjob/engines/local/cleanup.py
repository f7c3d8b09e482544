"""Leaving nothing behind: every process of the job, tracked while it runs and killed at its end.

:class:`JobProcesses` records the job's processes as they appear (container descendants, orphans
this process adopted as a subreaper) and tells the watchdog about them, so that whoever ends the
job, the supervisor or the watchdog after a SIGKILL, can find them all; at the end
(:meth:`JobProcesses.kill_the_rest`) it kills and reaps whatever of them is left. Every wait in it
is bounded.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable

from torchjob.controller.kubelet import Pod
from torchjob.engines.local import process, proctree, runner
from torchjob.engines.local.watchdog import Watchdog
from torchjob.host import procfs
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

STUCK_AFTER_KILL = 5.0  # a process that outlives SIGKILL this long is given up on (D state)
TICK = 0.02  # seconds between polls while pods are being stopped (their strays cannot be waited on)

Key = tuple[str, int]

# The jobs this process supervises now: several when SDK calls run in several threads. Each
# one's container main processes are children of this process too, and a forked one (warm pool)
# shows no job's marker: the other jobs must not take them for their own orphans.
_LIVE: list[JobProcesses] = []
_LIVE_LOCK = threading.Lock()


class JobProcesses:
    """Every process of the job this process knows of, beyond the containers' main processes.

    ``pods`` and ``latest`` are the supervisor's own dicts (pods that exist now, the newest attempt
    of every pod), read each time: a container's main process is known, not an adopted orphan.
    """

    def __init__(self, job_id: str, pods: dict[Key, Pod], latest: dict[Key, Pod], uids: str = "") -> None:
        self.job_id = job_id
        self.pods = pods
        self.latest = latest
        self.job_pids: set[int] = set()  # descendants seen, to reap once they are adopted
        self.foreign: set[int] = set()  # this process's children from before the job: not the job's
        self.told: set[int] = set()  # job processes the watchdog knows of
        self.watchdog: Watchdog | None = None
        # Whose processes carrying the job's marker are the job's (``uids``: creation.job_uids'):
        # this user's, as root also those its containers run as (runAsUser); never another user's.
        self.uids = process.job_owners(uids)
        # The engine's own helpers in sessions of their own (the fork server): never the job's orphans.
        self.helpers: Callable[[], Iterable[int]] = lambda: ()
        # Pods being created: the controller adds a pod to ``pods`` only once its first step is
        # over, in which an init container can already have ended, its orphans been looked for,
        # and a main container's warm interpreter (a child of this process) been running.
        self.creating: list[Pod] = []
        # The last orphan scan: when, the children known and those already ended then, the tree.
        self._scan: tuple[float, set[int], set[int], dict[int, list[int]]] | None = None
        self._scan_found = False  # whether that scan found any orphan

    def start(self) -> None:
        """Become the subreaper of the job's orphans and start the watchdog; before any pod."""
        self.foreign = set(proctree.children_of_self())  # a library caller's own processes
        with _LIVE_LOCK:
            _LIVE.append(self)
        process.set_child_subreaper(True)
        self.watchdog = Watchdog(self.job_id, self.uids)

    def track(self) -> None:
        """Record every container's descendants and reap the ones that were adopted and ended."""
        with process.ADOPTION:
            tree = proctree.children_map()
            adopted = proctree.adopted(tree, self.known_children(), self.job_id)
        for pod in self.pods.values():
            runner.track(pod, tree)
        self.job_pids.update(p.pid for pod in self.pods.values() for p in runner.tracked(pod))
        self.job_pids.update(adopted)
        self.tell_watchdog()
        process.reap_adopted(self.job_pids)
        self.job_pids = {pid for pid in self.job_pids if process.pid_exists(pid)}

    def known_children(self) -> set[int]:
        """This process's children that are not adopted orphans: container main processes not yet
        reaped, the watchdog, the caller's own."""
        known = self._not_containers()
        known.update(self._container_pids())
        with _LIVE_LOCK:
            others = [job for job in _LIVE if job is not self]
        for job in others:  # another thread's job
            with contextlib.suppress(RuntimeError, AttributeError):  # changed meanwhile: seen next time
                known.update(job._container_pids())
        return known

    def _container_pids(self) -> set[int]:
        pods = [*self.pods.values(), *self.latest.values(), *self.creating]
        return {pid for pod in pods for pid in runner.child_pids(pod)}

    def created(self, pod: Pod) -> None:
        """A pod's processes are the job's from its creation on, before the controller lists it."""
        listed = {id(p) for p in self.latest.values()}
        self.creating = [p for p in self.creating if id(p) not in listed]
        self.creating.append(pod)

    def _not_containers(self) -> set[int]:
        """This process's children that are no container's: the watchdog, the fork server, the
        caller's own."""
        own = set(self.foreign)
        own.update(self.helpers())
        if self.watchdog is not None:
            own.add(self.watchdog.pid)
        return own

    def adopt(self, fresh: bool = False) -> list[int]:
        """Job processes this process adopted (orphans of container main processes that ended).

        Called as each main process is reaped. When several end together, one scan of the
        process table serves them all (``_shared_tree``); ``fresh`` always scans anew.
        """
        with process.ADOPTION:
            known = self.known_children()
            tree = None if fresh else self._shared_tree(known)
            ended: set[int] = self._scan[2] if tree is not None and self._scan is not None else set()
            if tree is None:
                # Which main processes have ended is asked before the scan: their orphans were
                # handed to this process as they ended, so the scan sees every one of them.
                ended = {pid for pid in known if proctree.exited(pid)}
                tree = proctree.children_map()
                self._scan = (time.monotonic(), known, ended, tree)
                self._scan_found = False
            found = proctree.adopted(tree, known | ended, self.job_id)
        self._scan_found = self._scan_found or bool(found)
        self.job_pids.update(found)
        return found

    def last_orphans(self) -> list[int]:
        """For the final sweep: the job's orphans, from a scan of their own, unless the last scan
        shows that none can exist: it found none, every container had ended when it was taken,
        and none started since (nothing of the job was left to start another process)."""
        if self._scan is not None and not self._scan_found:
            _, known_then, ended_then, _ = self._scan
            if known_then - ended_then <= self._not_containers():
                return []
        return self.adopt(fresh=True)

    def _shared_tree(self, known: set[int]) -> dict[int, list[int]] | None:
        """The last scan's process tree, if it holds every orphan there can be now: it is at most
        one tick old, no container started since, and every main process reaped since had
        already ended when it was taken. Otherwise None (scan again)."""
        if self._scan is None:
            return None
        taken, known_then, ended_then, tree = self._scan
        if time.monotonic() - taken > TICK or not known <= known_then:
            return None
        return tree if known_then - known <= ended_then else None

    def tell_watchdog(self) -> None:
        """The watchdog learns every job process seen, to stop also those without the job's marker."""
        if self.watchdog is None:
            return
        for pid in self.job_pids - self.told:
            with contextlib.suppress(OSError, ValueError, IndexError):
                self.watchdog.watch_pid(pid, procfs.start_ticks(pid))
        self.told = set(self.job_pids)

    def on_group(self, pgid: int, started: bool) -> None:
        """A container's process group started or ended: the watchdog watches the live ones."""
        if started:
            self._scan = None  # the last scan knows nothing of this main process's orphans
        if self.watchdog is None:
            return
        if started:
            self.watchdog.watch(pgid)
        else:
            self.watchdog.forget(pgid)

    def kill_the_rest(self) -> None:
        """Kill every process of the job still alive (marked, tracked or adopted) and reap them."""
        tracked = [p for pod in self.latest.values() for p in runner.tracked(pod)]
        # Orphans without the job's marker, adopted as subreaper.
        tracked += _processes(self.last_orphans())
        killed = process.kill_now(self.job_id, [], tracked, 1.0, self.uids)
        # Reap what was adopted (subreaper); waiting on our own children reaps them.
        process.wait_gone(process.alive(killed), timeout=1.0)
        process.reap_adopted({p.pid for p in tracked} | {p.pid for p in killed} | self.job_pids)
        with _LIVE_LOCK:
            if self in _LIVE:
                _LIVE.remove(self)
            last = not _LIVE
        if last:  # another thread's job still needs its orphans handed to this process
            process.set_child_subreaper(False)
        if self.watchdog is not None:  # nothing of the job is left to watch; reaped at the end
            self.watchdog.stop()

    def reap_watchdog(self) -> None:
        """The watchdog's process, reaped (it ended once told to stop, or died)."""
        if self.watchdog is not None:
            self.watchdog.reap()


def _processes(pids: list[int]) -> list[Any]:
    if not pids:
        return []
    import psutil

    found = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            found.append(psutil.Process(pid))
    return found
