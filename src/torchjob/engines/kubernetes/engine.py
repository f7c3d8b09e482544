"""The ``kubernetes`` engine: submit a job as its target's objects, then read it back by its label."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torchjob.engine_api.base import (
    EngineError,
    JobReport,
    LogLine,
    LogQuery,
    Plan,
    PodReport,
    StartOptions,
    StreamSink,
)
from torchjob.engine_api.interrupts import sigterm_interrupts
from torchjob.engines.kubernetes import bounded, claims, finding, removal
from torchjob.engines.kubernetes.client import Cluster, list_labelled, namespaced_path
from torchjob.engines.kubernetes.errors import ApiError
from torchjob.engines.kubernetes.follow import Follower
from torchjob.engines.kubernetes.kinds import JOB_LABEL, Discovery, Found, Kind, top_kinds
from torchjob.engines.kubernetes.logs import add_log_tail, current_logs, wanted
from torchjob.engines.kubernetes.phase import PODGROUP_API, build_report, job_podgroup, timestamp
from torchjob.engines.kubernetes.rootcause import weigh_logs
from torchjob.engines.kubernetes.submit import create_all, refused_field
from torchjob.phases import UNKNOWN
from torchjob.records import record, replace

if TYPE_CHECKING:
    from torchjob.engine_api.base import ClockEngine, Engine, LeftoverEngine, Sink
    from torchjob.errors import Issue
    from torchjob.spec.model import Job


@record
class Sending:
    """A kubernetes plan's detail: the target chosen, the namespace, the objects to create in order."""

    target: str
    namespace: str
    objects: list[dict[str, Any]]
    warnings: list[tuple[str, str]]


class KubernetesEngine:
    name = "kubernetes"

    def __init__(
        self,
        kubeconfig: str | None = None,
        context: str | None = None,
        namespace: str | None = None,
        pending_timeout: float = 300.0,
        **_ignored: Any,
    ) -> None:
        self._settings = (kubeconfig, context, namespace)
        self.pending_timeout = pending_timeout
        self._cluster: Cluster | None = None
        self._logs_refused = False
        self._logs_refused_lock = threading.Lock()
        self._discovery: Discovery | None = None

    # ------------------------------------------------------------------ connection

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            self._cluster = Cluster(*self._settings)
        return self._cluster

    @property
    def discovery(self) -> Discovery:
        if self._discovery is None:
            self._discovery = Discovery(self.cluster)
        return self._discovery

    def _namespace(self, job: Job | None = None) -> str:
        """-n, else the job's own namespace when it names one, else the context's, else default."""
        if self._settings[2]:
            return self._settings[2]
        if job is not None and job.metadata.namespace not in ("", "default"):
            return job.metadata.namespace
        return self.cluster.namespace

    # ------------------------------------------------------------------ Engine

    def check(self, job: Job) -> list[Issue]:
        return []

    def warnings(self, job: Job) -> list[Issue]:
        return []  # the cluster does it all; the targets' own warnings come with the rendering

    def plan(self, job: Job, options: StartOptions) -> Plan:
        """The job rendered once, by the targets layer, as exactly what ``start`` sends (the same
        function ``torchjob render --target T -n NS -e K=V`` prints); its text, a kubectl-ready
        List (run --dry-run), written only when asked for."""
        from torchjob.render import dump_yaml, list_of
        from torchjob.targets import for_cluster

        namespace = self._namespace(job)
        wanted = _option(options, "target")
        if wanted is None and job.kind is not None and job.kind.target in self.discovery.available_targets():
            wanted = job.kind.target  # a PyTorchJob goes as one where the cluster runs them
        target = self.discovery.choose_target(wanted)
        rendered = for_cluster(
            job, target, namespace, _option(options, "extra_env"), runtime=_option(options, "runtime")
        )

        def text() -> str:
            return f"# target {target}, namespace {namespace}\n" + dump_yaml(list_of(rendered.objects))

        job = replace(job, metadata=replace(job.metadata, namespace=namespace))
        detail = Sending(target, namespace, rendered.objects, rendered.warnings)
        return Plan(self.name, job, options, text, detail=detail)

    def start(self, plan: Plan) -> JobReport:
        """Carry out a plan this engine made: its objects are sent as they are, not rendered again."""
        plan.detail_for(self.name)
        with sigterm_interrupts():  # SIGTERM ends it as Ctrl-C does: nothing half-made, the note
            return self._start(plan)

    def _start(self, plan: Plan) -> JobReport:
        job, options, sending = plan.job, plan.options, plan.detail
        target, namespace = sending.target, sending.namespace
        for path, message in sending.warnings:  # at the file's line and field where the CLI knows them
            told = options.source(path, f"warning: {message}") if options.source else None
            self._note(told or f"warning: {path}: {message}", options)
        objects = sending.objects
        existing = finding.find(self.cluster, self.discovery, job.name, namespace)
        if existing is not None:
            removal.clear_way(self.cluster, self.discovery, existing, _option(options, "replace"), self._note)
        found = Found(job.name, namespace, target, top_kinds().get(target))
        made: list[dict[str, Any]] = []
        follower: Follower | None = None
        try:
            try:
                create_all(self.cluster, self.discovery, objects, namespace, say=self._note, made=made)
            except ApiError as err:
                raise refused_field(err, target) or err from None
            for note in claims.give_to_job(self.cluster, made, found.kind):
                self._note(note, options)
            if options.on_start is not None and not options.detach:
                options.on_start(found.ref)
            if options.detach:
                return self._report(found, pods={}, top=_top_object(objects, found.kind))
            follower = self._follower(found, logs=options.follow and not options.quiet, options=options)
            sink = options.sink or StreamSink()
            for line in follower.run(options.timeout):
                sink.log(line)
        except KeyboardInterrupt:
            if len(made) < len(objects):
                raise  # cut short while creating: create_all deleted what it made, and said so
            # Ctrl-C stops torchjob, not the job: a cluster job may hold hours of work, and the
            # user's terminal is not its lifeline (docs/kubernetes.md). Said even when quiet.
            if follower is not None:
                what = f"stopped following; job {found.ref}"
            else:  # before the following: the job was just made, its kind said
                what = f"interrupted; job {found.ref} ({found.kind.label if found.kind else 'bare pods'})"
            self._note(
                f"{what} keeps running on the cluster (delete it with: {bounded.remove_command(found.ref)})"
            )
            raise
        report = self._finish(follower)
        if not report.terminal and options.timeout is not None:
            deleted = removal.delete_after_timeout(self.cluster, self.discovery, found, self._note)
            report.phase, report.reason = "Terminated", f"timed out after {options.timeout:g}s; {deleted}"
        return report

    def list_jobs(self) -> list[JobReport]:
        jobs = finding.every_job(self.cluster, self.discovery, self._namespace())
        reports = [self._report(found, pods, found.top) for found, pods in jobs]
        reports.sort(key=lambda r: r.started_at or 0.0, reverse=True)
        return reports

    def status(self, ref: str) -> JobReport:
        found = self._resolve(ref)
        if found.leftover:
            return self._left_report(ref, found)
        pods = {
            str(p["metadata"]["name"]): p
            for p in list_labelled(
                self.cluster, namespaced_path("v1", "pods", found.namespace), f"{JOB_LABEL}={found.name}"
            )
        }
        report = self._report(found, pods, found.top, podgroup=self._podgroup(found))
        self._add_log_tail(report, report.pods, pods)
        return report

    def logs(self, ref: str, query: LogQuery) -> Iterator[LogLine]:
        if not query.follow:
            report = self.status(ref)
            if report.leftovers:
                raise _no_logs(report)
            yield from current_logs(self.cluster, report, query)
            return
        with sigterm_interrupts():  # from the first request: the job's lookup
            found = self._resolve(ref)
            if found.leftover:  # no pod ever comes: said, not followed
                raise _no_logs(self._left_report(ref, found))
            follower = self._follower(
                found,
                logs=True,
                pod_filter=lambda pod, short: wanted(query, pod, short),
                container=query.container,
                attempt=None if query.all_attempts else query.attempt,
            )
            yield from follower.run()

    def wait(self, ref: str, timeout: float | None = None, sink: Sink | None = None) -> JobReport:
        with sigterm_interrupts():  # from the first request: the job's lookup
            found = self._resolve(ref)
            if found.leftover:  # nothing of it runs, nor ever will: said at once, not followed
                return self._left_report(ref, found)
            follower = self._follower(found, logs=False, sink=sink)
            for _ in follower.run(timeout):
                pass
            return self._finish(follower)

    def delete(self, refs: list[str]) -> list[str]:
        with sigterm_interrupts():  # stopped, it says what was deleted and what was not
            jobs = [self._resolve(ref) for ref in refs]  # every ref first: a typo deletes nothing
            deleted: list[str] = []
            with removal.telling_interrupts(self._note, deleted, [found.ref for found in jobs]):
                for found in jobs:
                    removed = removal.delete_job(self.cluster, self.discovery, found)
                    if found.leftover:  # no pod was found, only these
                        self._note(removal.left_removed(found.ref, removed))
                    deleted.append(found.ref)
            return deleted

    def now(self) -> float:
        """The API server's time (its answers' Date), which the jobs' times are (ClockEngine)."""
        return self.cluster.now()

    def prune_leftovers(self, older_than: float | None = None) -> list[str]:
        """Remove the jobs of which only what they left remains (their object and pods gone) whose
        newest object is older than ``older_than`` seconds, and than removal.SETTLE_AGE (a job
        being submitted has such objects for a moment): their ids."""
        with sigterm_interrupts():
            jobs = finding.every_job(self.cluster, self.discovery, self._namespace())
            now = self.cluster.now()  # creation times are the server's clock, not this machine's
            chosen: list[Found] = []
            for found, _ in jobs:
                if not found.leftover or found.deleting:  # being deleted: it goes by itself
                    continue
                age = removal.left_age(found, now)
                if age < removal.SETTLE_AGE:
                    self._note(removal.too_new(found, age))
                elif older_than is None or age > older_than:
                    chosen.append(found)
            pruned: list[str] = []
            with removal.telling_interrupts(self._note, pruned, [found.ref for found in chosen]):
                for found in chosen:
                    removed, kept = removal.delete_left(self.cluster, found)
                    if kept:  # made again since it was listed: a new job of that name, not pruned
                        also = f" (removed {', '.join(removed)})" if removed else ""
                        self._note(
                            f"kept {found.ref}: {', '.join(kept)} made again since it was listed{also}"
                        )
                        continue
                    self._note(removal.left_removed(found.ref, removed))
                    pruned.append(found.ref)
            return pruned

    # ------------------------------------------------------------------ helpers

    def _log_refused(
        self, err: EngineError, options: StartOptions | None = None, sink: Sink | None = None
    ) -> None:
        """No RBAC for pods/log: said once, and the job is followed and reported without logs."""
        with self._logs_refused_lock:  # log streams of many pods are refused at once
            if self._logs_refused:
                return
            self._logs_refused = True
        self._note(f"warning: {err}; going on without logs", options, sink)

    def _note(self, message: str, options: StartOptions | None = None, sink: Sink | None = None) -> None:
        """A note for the person, to the caller's sink (standard error when it gave none)."""
        if options is None or not options.quiet:
            (sink or (options.sink if options else None) or StreamSink()).notice(message)

    def _resolve(self, ref: str) -> Found:
        return finding.resolve(self.cluster, self.discovery, ref, self._namespace())

    def _left_report(self, ref: str, found: Found) -> JobReport:
        """The report of a job of which only what it left was found, every such object named."""
        found.left = finding.left_of(self.cluster, self.discovery, found.name, found.namespace)
        if not found.left:  # gone too, since it was found
            raise finding.not_found(self.cluster, ref, found.name, found.namespace)
        return self._report(found, pods={}, top=None)

    def _report(
        self,
        found: Found,
        pods: dict[str, dict[str, Any]],
        top: dict[str, Any] | None,
        podgroup: dict[str, Any] | None = None,
    ) -> JobReport:
        report = build_report(
            name=found.name,
            namespace=found.namespace,
            target=found.target,
            context=self.cluster.context,
            top=top,
            pods=pods,
            podgroup=podgroup,
        )
        if found.leftover and found.left:  # not Pending: nothing will run; Unknown, and why
            report.phase, report.reason = UNKNOWN, finding.what_remains(found)
            report.leftovers = finding.left_names(found)
            made = [timestamp(item["metadata"].get("creationTimestamp")) for _, item in found.left]
            report.started_at = min((t for t in made if t), default=None)
        return report

    def _group_path(self, found: Found) -> str | None:
        """Where the job's Volcano PodGroup is, for the targets whose PodGroup carries its label."""
        from torchjob.targets import get_target

        if not get_target(found.target).podgroup or not self.discovery.has_version(PODGROUP_API):
            return None
        return namespaced_path(PODGROUP_API, "podgroups", found.namespace)

    def _podgroup(self, found: Found) -> dict[str, Any] | None:
        path = self._group_path(found)
        if path is None:
            return None
        return job_podgroup(list_labelled(self.cluster, path, f"{JOB_LABEL}={found.name}"), found.top)

    def _follower(
        self,
        found: Found,
        *,
        logs: bool,
        options: StartOptions | None = None,
        sink: Sink | None = None,
        **kwargs: Any,
    ) -> Follower:
        kind = found.kind
        return Follower(
            self.cluster,
            name=found.name,
            namespace=found.namespace,
            target=found.target,
            top_path=None
            if kind is None
            else namespaced_path(kind.api_version, kind.plural, found.namespace),
            pod_path=namespaced_path("v1", "pods", found.namespace),
            group_path=self._group_path(found),
            label_selector=f"{JOB_LABEL}={found.name}",
            logs=logs,
            pending_timeout=self.pending_timeout,
            notify=lambda message: self._note(message, options, sink),
            log_refused=lambda err: self._log_refused(err, options, sink),
            **kwargs,
        )

    def _finish(self, follower: Follower) -> JobReport:
        report = follower.report
        assert report is not None
        self._add_log_tail(report, *follower.every_pod())
        if report.first_failure is not None and not report.first_failure.log_tail:
            report.first_failure.log_tail = follower.tail(report.first_failure.short)
        return report

    def _add_log_tail(self, report: JobReport, pods: list[PodReport], raw: dict[str, dict[str, Any]]) -> None:
        """The root cause by the failed pods' logs (rootcause.py), then its last lines; neither
        once the cluster refused this user its pods' logs (said once)."""
        if report.first_failure is None or self._logs_refused:
            return
        weighed = weigh_logs(self.cluster, report.namespace, pods, raw, self._log_refused)
        report.first_failure = weighed or report.first_failure
        if not self._logs_refused:
            add_log_tail(self.cluster, report, self._log_refused)


def _no_logs(report: JobReport) -> EngineError:
    """``logs`` of a job of which only what it left remains: one line, as for a job with no log."""
    return EngineError(f"job {report.id} has no log to show: {report.reason}")


def _top_object(objects: list[dict[str, Any]], kind: Kind | None) -> dict[str, Any] | None:
    if kind is None:
        return None
    return next((o for o in objects if o.get("kind") == kind.kind), None)


def _option(options: StartOptions, name: str) -> Any:
    """One engine setting of the run (--target, --runtime, --replace, --env): read in one place,
    so that where settings come from can change without touching the engine's logic."""
    if name == "extra_env":  # an engine-neutral field; the others are the engine's declared settings
        return options.extra_env
    return options.setting(name)


if TYPE_CHECKING:  # mypy checks here that the class implements the engine interface
    _implements: type[Engine] = KubernetesEngine
    _leftovers: type[LeftoverEngine] = KubernetesEngine
    _clock: type[ClockEngine] = KubernetesEngine
