"""Following a job: one watch per resource type (the job's own object, its pods), never a poll per pod.

Each watch lists once, then watches from the list's resourceVersion in its own thread
(``watch.ResourceWatch``: resumed when the server ends it, listed again with back-off on 410 Gone,
a stall or an error). Events, log lines and the end of log streams all arrive on one bounded
queue, so one loop reads them in order and a slow reader slows the streams, not memory. The
requests this makes do not grow with the number of pods, except one log stream per container
when logs are followed.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

from torchjob.engine_api.base import EngineError, FailureReport, JobReport, LogLine, PodReport
from torchjob.engines.kubernetes.client import Cluster
from torchjob.engines.kubernetes.joblogs import ChosenLogs
from torchjob.engines.kubernetes.phase import build_report, job_podgroup, pod_identity, pod_report
from torchjob.engines.kubernetes.podlogs import LogStreams
from torchjob.engines.kubernetes.rootcause import first_failure
from torchjob.engines.kubernetes.stuck import Stuck
from torchjob.engines.kubernetes.watch import ResourceWatch

QUEUE_ITEMS = 256  # events and log lines read ahead of the reader
LOG_GRACE_SECONDS = 10.0
# A failed job whose failed pod is not known yet: how long its pods' watch gets to tell of it (the
# job's watch and the pods' are separate streams, so the job's end may come first).
POD_GRACE_SECONDS = 5.0
REPORT_EVERY = 0.5  # seconds between full reports while only pods change
ALL_PODS = "\0all"  # after the job ends, how long its log streams get to drain


class _Loop:
    """What one run of the follow loop carries from batch to batch."""

    __slots__ = ("built", "deadline", "dirty", "drain_until", "pods_until")

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.drain_until: float | None = None  # ended: logs read until then
        self.pods_until: float | None = None  # failed: pods' events awaited until then
        self.dirty = False  # pods changed since the last report
        self.built = 0.0  # when the last report was built


class Follower:
    """A job's live state from its watches; optionally streams every pod's logs."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        name: str,
        namespace: str,
        target: str,
        top_path: str | None,
        pod_path: str,
        label_selector: str,
        logs: bool = False,
        pending_timeout: float = 300.0,
        notify: Callable[[str], None] | None = None,
        pod_filter: Callable[[str, str], bool] | None = None,
        container: str | None = None,
        log_refused: Callable[[EngineError], None] | None = None,
        group_path: str | None = None,
        attempt: int | None = None,
    ) -> None:
        self.cluster, self.name, self.namespace, self.target = cluster, name, namespace, target
        self.queue: queue.Queue[Any] = queue.Queue(QUEUE_ITEMS)
        self.top: dict[str, Any] | None = None
        self.pods: dict[str, dict[str, Any]] = {}
        self.notify = notify or (lambda _message: None)
        self.stuck = Stuck(name, target, pending_timeout, self.notify)
        self._synced: set[str] = set()
        self._has_master: bool | None = None
        self.pod_path, self.label_selector = pod_path, label_selector
        self.watches = [
            ResourceWatch(cluster, "pods", pod_path, {"labelSelector": label_selector}, self.queue)
        ]
        self._bare = top_path is None  # a target without an object of its own (bare pods)
        if top_path is not None:
            selector = {"fieldSelector": f"metadata.name={name}"}
            self.watches.append(ResourceWatch(cluster, "job", top_path, selector, self.queue))
        if group_path is not None:  # Volcano's PodGroups carry the job's labels
            selector = {"labelSelector": label_selector}
            self.watches.append(ResourceWatch(cluster, "podgroups", group_path, selector, self.queue))
        self.podgroups: dict[str, dict[str, Any]] = {}
        self.streams = LogStreams(cluster, namespace, self.queue, log_refused) if logs else None
        self.chosen = (  # which containers' logs are followed
            None
            if self.streams is None
            else ChosenLogs(self.streams, name, target, pod_filter, container, attempt)
        )
        self.report: JobReport | None = None
        # What is read besides the watches' mechanics: see _settle, _apply_lifecycle.
        self._final: JobReport | None = None  # the first terminal report: final
        self._deleted = False  # the job's object (or, for `pods`, every pod) went before it ended
        self._gone: dict[str, dict[str, Any]] = {}  # pods deleted while it ran, as last seen
        self._gone_after: set[str] = set()  # pods deleted after it ended (kept in self.pods)

    def run(self, timeout: float | None = None) -> Iterator[LogLine]:
        """Log lines while the job runs (none without ``logs``); ``self.report`` is the last report."""
        loop = _Loop(None if timeout is None else time.monotonic() + timeout)
        for watch in self.watches:
            watch.start()
        try:
            while True:
                changed, job_changed = yield from self._drain(self._next(loop))
                if len(self._synced) < len(self.watches):  # no report before every watch has listed
                    if loop.deadline is not None and time.monotonic() >= loop.deadline:
                        break
                    continue
                if self._step(changed, job_changed, loop):
                    break
        finally:
            self._stop_watching()
        self._last_report(loop.dirty)

    def _next(self, loop: _Loop) -> Any:
        """The next item of any watch or stream, or None when the deadline, drain or a report is due."""
        now = time.monotonic()  # a limit already past (a grace over) must not make this spin
        limits = [t for t in (loop.deadline, loop.drain_until, loop.pods_until) if t is not None and t > now]
        wait = min(limits) - now if limits else 1.0
        try:
            return self.queue.get(timeout=min(wait, REPORT_EVERY))
        except queue.Empty:
            return None

    def _drain(self, item: Any) -> Generator[LogLine, None, tuple[set[str], bool]]:
        """Every item queued now: log lines passed on, changes applied; (pods changed, job changed)."""
        changed: set[str] = set()
        job_changed = False
        while item is not None:
            if isinstance(item, LogLine):
                if self.chosen is not None:
                    self.chosen.keep(item)
                yield item
            else:
                what = self._apply(item)
                if what == "job":
                    job_changed = True
                elif what is not None:
                    changed.add(what)
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                item = None
        return changed, job_changed

    def _step(self, changed: set[str], job_changed: bool, loop: _Loop) -> bool:
        """After a batch: diagnose the changed pods, report, open streams; True when following ends."""
        if ALL_PODS in changed or self.report is None:  # the first report: every pod
            # (pods listed in an earlier batch than the job's object were not looked at)
            changed = set(self.pods)
            job_changed = True
        if self._final is None:  # after the end, pods only go: nothing to fail fast on
            group = job_podgroup(list(self.podgroups.values()), self.top)
            self.stuck.check(self.pods, changed, group, self.report)
        loop.dirty |= bool(changed)
        now = time.monotonic()
        # A report walks every pod: rebuilt when the job's object changes, and at most
        # every REPORT_EVERY seconds for pod changes (a 1,000-pod job sends thousands).
        if self.report is None or job_changed or (loop.dirty and now - loop.built >= REPORT_EVERY):
            ended = self._final is not None
            self.report = self._report()
            loop.built, loop.dirty = now, False
            if self.report.terminal and not ended and self._refresh_pods():
                self.report = self._report()
            self._start_streams(set(self.pods))
        else:
            self._start_streams(changed)
        return self._done(self.report, loop, now)

    def _done(self, report: JobReport, loop: _Loop, now: float) -> bool:
        """Ended: the job's logs drained (for LOG_GRACE_SECONDS at most), or the deadline passed."""
        if report.terminal:
            if self._awaiting_pods(report):
                loop.pods_until = loop.pods_until or now + POD_GRACE_SECONDS
                if now < loop.pods_until:
                    return False
            if self.streams is None or not self.streams.open:
                return True
            loop.drain_until = loop.drain_until or now + LOG_GRACE_SECONDS
            return now >= loop.drain_until
        return loop.deadline is not None and now >= loop.deadline

    def _awaiting_pods(self, report: JobReport) -> bool:
        """Failed, its failed pod unknown, and some pod neither ended nor gone: the pods' watch may
        still tell which failed (the job's watch told of the end first)."""
        if report.phase != "Failed" or self._first_failure() is not None:
            return False
        ended = ("Succeeded", "Failed")
        return any(
            name not in self._gone_after and (pod.get("status") or {}).get("phase") not in ended
            for name, pod in self.pods.items()
        )

    def _refresh_pods(self) -> bool:
        """The job just ended: its pods listed afresh. The job's watch and the pods' are separate
        streams, and pods the end finds not started (a watch that stalled, an event still on its
        way) would have their logs, and how they ended, missed."""
        try:
            listing = self.cluster.json(
                "GET", self.pod_path, query={"labelSelector": self.label_selector}, doing="list pods"
            )
        except EngineError:
            return False  # the pods' own watch may still tell
        self.pods = self._as_ended(listing.get("items") or [])
        self._has_master = None
        return True

    def _stop_watching(self) -> None:
        for watch in self.watches:
            watch.stop()
        if self.streams is not None:
            self.streams.stop()

    def _last_report(self, dirty: bool) -> None:
        if self.report is not None and self.report.terminal:
            # The job's watch may have told of its end before the pods' watch told of theirs:
            # one more list gives the pods as they ended (if it fails, the pods as last watched).
            try:
                pods = self.cluster.json(
                    "GET", self.pod_path, query={"labelSelector": self.label_selector}, doing="list pods"
                )
            except EngineError:
                pass
            else:
                self.pods = self._as_ended(pods.get("items") or [])
            dirty = True
        if self.report is None or dirty:
            self.report = self._report()

    def _apply(self, item: tuple[Any, ...]) -> str | None:
        """Take one event in: "job", a pod's name, ALL_PODS, or None when nothing changed."""
        key, kind, obj = item
        if key == "log-end":
            if self.streams is not None:
                self.streams.ended(kind)
            return None
        if kind == "FAILED":
            raise self._lost(obj)
        self._synced.add(key)
        if key == "podgroups":
            return self._apply_podgroup(kind, obj)
        if self._apply_lifecycle(key, kind, obj):
            return "job"
        if key == "job":
            if kind == "SYNC":
                self.top = obj[0] if obj else None
            else:
                self.top = None if kind == "DELETED" else obj
            return "job"
        if kind == "SYNC":
            self.pods = {str(p["metadata"]["name"]): p for p in obj}
            self._has_master = None
            return ALL_PODS
        pod_name = str((obj.get("metadata") or {}).get("name"))
        if kind == "DELETED":
            if self._final is None:
                self._gone[pod_name] = self.pods.pop(pod_name, obj)
            else:  # after the end, a pod's last state is how it ended: kept in the report
                self.pods[pod_name] = obj
                self._gone_after.add(pod_name)
        else:
            if pod_name not in self.pods:
                self._has_master = None
            self.pods[pod_name] = obj
        return pod_name

    def _lost(self, err: EngineError) -> EngineError:
        """Following ended (contact lost, or an answer it cannot go on with); the job was not
        stopped by it: say so, and how to follow it again."""
        seen = f"was {self.report.phase} then" if self.report is not None else "had not been seen yet"
        ref = f"{self.namespace}/{self.name}"
        err.args = (
            f"{err}; job {ref} {seen} and is not stopped by this: "
            f"follow it again with: torchjob logs {ref} -f --engine kubernetes",
            *err.args[1:],
        )
        return err

    def _report(self) -> JobReport:
        report = build_report(
            name=self.name,
            namespace=self.namespace,
            target=self.target,
            context=self.cluster.context,
            top=self.top,
            pods=self.pods,
            podgroup=job_podgroup(list(self.podgroups.values()), self.top),
        )
        return self._settle(report)

    # ------------------------------------------------------------------ the job's lifecycle

    def _apply_lifecycle(self, key: str, kind: str, obj: Any) -> bool:
        """The job's object deleted (a TTL, a user): kept as it was last seen. True when handled."""
        # A job is followed once it is known to exist: not listed any more means deleted.
        if key == "job":
            if kind == "DELETED" or (kind == "SYNC" and not obj):
                self._deleted = True
                if kind == "DELETED":
                    self.top = obj  # its last state: a TTL deletes a job in its final phase
                return True
            return False
        if self._bare:  # no object of its own: the job is gone once all its pods are
            last = kind == "DELETED" and set(self.pods) <= {obj["metadata"]["name"]}
            self._deleted = self._deleted or last or (kind == "SYNC" and not obj)
        return False

    def _settle(self, report: JobReport) -> JobReport:
        """A terminal phase once seen is final; a job deleted before one ends as deleted, at once."""
        if self._final is not None:
            report.phase, report.reason = self._final.phase, self._final.reason
            report.finished_at = self._final.finished_at
            if not report.ok:  # pods' events after the end may name a failure the end did not
                report.first_failure = self._first_failure() or self._final.first_failure
            return report
        if not report.terminal and self._deleted:
            report.phase = "Terminated"
            what = "its pods were" if self._bare else "its object was"
            report.reason = f"{what} deleted before it ended"
            report.finished_at = time.time()
        if report.terminal:
            if report.first_failure is None and not report.ok:
                report.first_failure = self._first_failure()
            self._final = report
        return report

    def _first_failure(self) -> FailureReport | None:
        """The first failure among every pod seen, those deleted before the end too (a Job past
        its backoffLimit, a cleanPodPolicy, a TTL take its failed pods with them)."""
        return first_failure(*self.every_pod())

    def every_pod(self) -> tuple[list[PodReport], dict[str, dict[str, Any]]]:
        """Every pod seen, those deleted before the end too, as reports and as last seen."""
        pods = {**self._gone, **self.pods}
        has_master = any(pod_identity(self.name, p, self.target)[0] == "master" for p in pods.values())
        return [pod_report(self.name, p, has_master, self.target) for p in pods.values()], pods

    def _as_ended(self, items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """The pods listed after the end, and those deleted since (a TTL, cleanPodPolicy) as last seen."""
        listed = {str(p["metadata"]["name"]): p for p in items}
        return {**self.pods, **listed} if self._final is not None else listed

    def _apply_podgroup(self, kind: str, obj: Any) -> str:
        if kind == "SYNC":
            self.podgroups = {str(g["metadata"]["name"]): g for g in obj}
        elif kind == "DELETED":
            self.podgroups.pop(str(obj["metadata"]["name"]), None)
        else:
            self.podgroups[str(obj["metadata"]["name"])] = obj
        return "job"

    def tail(self, short: str) -> list[str]:
        """The last lines streamed from a pod: its log once the pod is deleted (a TTL, a clean-up)."""
        return self.chosen.tail(short) if self.chosen is not None else []

    def _master(self) -> bool:
        if self._has_master is None:
            self._has_master = any(
                pod_identity(self.name, p, self.target)[0] == "master" for p in self.pods.values()
            )
        return self._has_master

    def _start_streams(self, names: set[str]) -> None:
        if self.chosen is not None:
            self.chosen.start(self.pods, names, self._master)
