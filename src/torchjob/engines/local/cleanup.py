"""Leaving nothing behind: tracking every process of the job while it runs, and the shutdown.

:class:`JobProcesses` records the job's processes as they appear (container descendants, orphans
this process adopted as a subreaper) and tells the watchdog about them, so that whoever ends the
job, the supervisor or the watchdog after a SIGKILL, can find them all. :func:`shutdown` runs once
at the end, whatever happened: it stops the pods, kills and reaps what is left, and writes the
final status and summary. Every wait in it is bounded.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

from torchjob.controller import DEFAULT_GRACE, termination_grace
from torchjob.controller.kubelet import Pod
from torchjob.display import summary
from torchjob.engines.local import ports as port_registry
from torchjob.engines.local import process, procfs, runner
from torchjob.engines.local.watchdog import Watchdog
from torchjob.lifecycle import JobPhase, JobStatus
from torchjob.spec.model import Job
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.engines.local.supervisor import Supervisor

STUCK_AFTER_KILL = 5.0  # a process that outlives SIGKILL this long is given up on (D state)
TICK = 0.02  # seconds between polls while pods are being stopped (their strays cannot be waited on)
OUTPUT_STALL = 2.0  # at the end, seconds a reader may take nothing before the rest is only counted
INTERRUPTED_STALL = 0.2  # the same after a Ctrl-C or SIGTERM: the user wants the prompt back

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

    def __init__(self, job_id: str, pods: dict[Key, Pod], latest: dict[Key, Pod]) -> None:
        self.job_id = job_id
        self.pods = pods
        self.latest = latest
        self.job_pids: set[int] = set()  # descendants seen, to reap once they are adopted
        self.foreign: set[int] = set()  # this process's children from before the job: not the job's
        self.told: set[int] = set()  # job processes the watchdog knows of
        self.watchdog: Watchdog | None = None
        # The last orphan scan: when, the children known and those already ended then, the tree.
        self._scan: tuple[float, set[int], set[int], dict[int, list[int]]] | None = None
        self._scan_found = False  # whether that scan found any orphan

    def start(self) -> None:
        """Become the subreaper of the job's orphans and start the watchdog; before any pod."""
        self.foreign = set(process.children_of_self())  # a library caller's own processes
        with _LIVE_LOCK:
            _LIVE.append(self)
        process.set_child_subreaper(True)
        self.watchdog = Watchdog(self.job_id)

    def track(self) -> None:
        """Record every container's descendants and reap the ones that were adopted and ended."""
        with process.ADOPTION:
            tree = process.children_map()
            adopted = process.adopted(tree, self.known_children(), self.job_id)
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
        return {pid for pod in [*self.pods.values(), *self.latest.values()] for pid in runner.child_pids(pod)}

    def _not_containers(self) -> set[int]:
        """This process's children that are no container's: the watchdog, the caller's own."""
        own = set(self.foreign)
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
                ended = {pid for pid in known if process.exited(pid)}
                tree = process.children_map()
                self._scan = (time.monotonic(), known, ended, tree)
                self._scan_found = False
            found = process.adopted(tree, known | ended, self.job_id)
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
        killed = process.kill_now(self.job_id, [], tracked, 1.0)
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


def shutdown(sup: Supervisor) -> None:
    """Stop everything left, whatever happened; bounded in time."""
    _stop_pods(sup)
    sup.factory.net.close()  # its forwarder first: the sweep below then has one process less to wait for
    sup.processes.kill_the_rest()
    if sup.ticket is not None:  # the job's CPUs, memory and GPUs go to the next job in the queue
        sup.ticket.release()
    try:
        sup.waiter.close()
        if sup.factory.ports:  # a job without ports reserved none: the registry is not touched
            with contextlib.suppress(OSError):
                port_registry.release(sup.id)
        sup.drain_logs()
        if not sup.status.phase.final:
            sup.status = JobStatus(
                JobPhase.TERMINATED,
                sup.status.retry_count,
                sup.status.version,
                sup.status.reason or "the supervisor stopped",
            )
        sup.finished = time.time()
        sup.write_status()
        written = sup.dir.status_file.exists()
        if not written:  # no command could see the job
            sup.remove_job_dir()
        ttl = sup.job.spec.ttl_seconds_after_finished
        kept_until = ""
        if ttl is not None and sup.status.phase.final and written:
            with contextlib.suppress(OSError):  # then kept, as a job without a TTL is
                sup.dir.write_expiry(sup.finished + ttl)
                kept_until = (
                    f"ttlSecondsAfterFinished {ttl}: the first torchjob command from {ttl}s after "
                    "the end removes the job and its logs"
                )
        if sup.console is not None:
            sup.console.end_live()
            for line in summary(sup.report(), sup.console.color, sup.console.unshown, sup.remove):
                sup.console.print(line)
            if kept_until and not (sup.remove and sup.status.phase is JobPhase.COMPLETED):
                sup.console.print(kept_until)
            stall = INTERRUPTED_STALL if sup.interrupted is not None else OUTPUT_STALL
            sup.console.finish(stall, lambda: bool(sup.signals))
    finally:
        if sup.processes.watchdog is not None:  # it died while the above was done
            sup.processes.watchdog.reap()
        if sup.pid_fd >= 0:  # this process supervises the job no more (an SDK caller goes on)
            with contextlib.suppress(OSError):
                os.close(sup.pid_fd)
            sup.pid_fd = -1


def _stop_pods(sup: Supervisor) -> None:
    """Terminate the pods still there and wait, bounded, until they are gone. A job that did not
    reach a final phase (an error, a crash) gives its pods at most 2 s of grace."""
    final = sup.status.phase.final
    sup.kubelet.terminate(
        [
            (pod, grace_of(sup.job, pod) if final else min(grace_of(sup.job, pod), 2.0))
            for pod in sup.pods.values()
            if not pod.gone
        ]
    )
    deadline = time.monotonic() + DEFAULT_GRACE + STUCK_AFTER_KILL
    while any(not p.gone for p in sup.pods.values() if p.terminating) and time.monotonic() < deadline:
        sup.handle_signals()
        sup.kubelet.poll(list(sup.pods.values()))
        sup.print_logs()
        sup.waiter.wait(TICK)


def grace_of(job: Job, pod: Pod) -> float:
    """The pod's terminationGracePeriodSeconds: seconds from SIGTERM to SIGKILL."""
    return termination_grace(job, pod.task)


def _processes(pids: list[int]) -> list[Any]:
    if not pids:
        return []
    import psutil

    found = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            found.append(psutil.Process(pid))
    return found
