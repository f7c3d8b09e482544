"""The ``kubernetes`` engine: submit a job as its target's objects, then read it back by its label."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torchjob.engine_api.base import (
    EngineError,
    Interrupted,
    JobNotFound,
    JobReport,
    LogLine,
    LogQuery,
    Plan,
    StartOptions,
    StreamSink,
)
from torchjob.engine_api.interrupts import sigterm_interrupts
from torchjob.engines.kubernetes import bounded, claims, removal
from torchjob.engines.kubernetes.client import Cluster, list_labelled, namespaced_path
from torchjob.engines.kubernetes.errors import ApiError
from torchjob.engines.kubernetes.follow import Follower
from torchjob.engines.kubernetes.kinds import JOB_LABEL, Discovery, Found, Kind, top_kinds
from torchjob.engines.kubernetes.logs import current_logs, wanted
from torchjob.engines.kubernetes.phase import PODGROUP_API, build_report, job_podgroup
from torchjob.engines.kubernetes.podlogs import read_log, refused
from torchjob.engines.kubernetes.submit import create_all, refused_field
from torchjob.records import record, replace

if TYPE_CHECKING:
    from torchjob.engine_api.base import Engine, Sink
    from torchjob.errors import Issue
    from torchjob.spec.model import Job

LOG_TAIL_LINES = 20
GONE_TIMEOUT = 120.0  # how long --replace deletes the old job and waits for it to go, as a whole


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
        existing = self._find(job.name, namespace)
        if existing is not None:
            self._clear_way(existing, _option(options, "replace"))
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
            deleted = self._delete_after_timeout(found)
            report.phase, report.reason = "Terminated", f"timed out after {options.timeout:g}s; {deleted}"
        return report

    def list_jobs(self) -> list[JobReport]:
        namespace = self._namespace()
        pods = list_labelled(self.cluster, namespaced_path("v1", "pods", namespace), JOB_LABEL)
        by_job: dict[str, dict[str, dict[str, Any]]] = {}
        for pod in pods:
            label = str(pod["metadata"]["labels"][JOB_LABEL])
            by_job.setdefault(label, {})[str(pod["metadata"]["name"])] = pod
        reports: list[JobReport] = []
        seen: set[str] = set()
        kinds = top_kinds()
        for target in self.discovery.available_targets():
            kind = kinds[target]
            for top in list_labelled(
                self.cluster, namespaced_path(kind.api_version, kind.plural, namespace), JOB_LABEL
            ):
                if _owned(top):
                    continue
                name = str(top["metadata"]["name"])
                seen.add(name)
                reports.append(
                    self._report(Found(name, namespace, target, kind, top), by_job.get(name, {}), top)
                )
        for name, job_pods in by_job.items():
            if name not in seen and not any(_owned(p) for p in job_pods.values()):
                reports.append(self._report(Found(name, namespace, "pods"), job_pods, None))
        reports.sort(key=lambda r: r.started_at or 0.0, reverse=True)
        return reports

    def status(self, ref: str) -> JobReport:
        found = self._resolve(ref)
        pods = {
            str(p["metadata"]["name"]): p
            for p in list_labelled(
                self.cluster, namespaced_path("v1", "pods", found.namespace), f"{JOB_LABEL}={found.name}"
            )
        }
        report = self._report(found, pods, found.top, podgroup=self._podgroup(found))
        self._add_log_tail(report)
        return report

    def logs(self, ref: str, query: LogQuery) -> Iterator[LogLine]:
        if not query.follow:
            yield from current_logs(self.cluster, self.status(ref), query)
            return
        with sigterm_interrupts():  # from the first request: the job's lookup
            found = self._resolve(ref)
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
            follower = self._follower(self._resolve(ref), logs=False, sink=sink)
            for _ in follower.run(timeout):
                pass
            return self._finish(follower)

    def delete(self, refs: list[str]) -> list[str]:
        with sigterm_interrupts():  # stopped, it says what was deleted and what was not
            jobs = [self._resolve(ref) for ref in refs]  # every ref first: a typo deletes nothing
            deleted: list[str] = []
            try:
                for found in jobs:
                    removed = removal.delete_job(self.cluster, self.discovery, found)
                    if found.leftover:  # no pod was found, only these: said, as they were not the job
                        self._note(f"job {found.ref} had no pods left; removed {', '.join(removed)}")
                    deleted.append(found.ref)
            except KeyboardInterrupt:
                self._note(_interrupted_delete(deleted, [found.ref for found in jobs]))
                raise Interrupted from None
            return deleted

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

    def _find(self, name: str, namespace: str) -> Found | None:
        """The job called ``name``: its top-level object of any target, else its bare pods."""
        candidates: list[Found] = []
        kinds = top_kinds()
        for target in self.discovery.available_targets():
            kind = kinds[target]
            path = namespaced_path(kind.api_version, kind.plural, namespace, name)
            try:
                top = self.cluster.json("GET", path, doing=f"get {kind.label} {name}")
            except ApiError as err:
                if err.status == 404:
                    continue
                raise
            if JOB_LABEL in ((top.get("metadata") or {}).get("labels") or {}):
                candidates.append(Found(name, namespace, target, kind, top))
        if candidates:  # a TrainJob's JobSet may carry the label too: its owner is the job
            found = next((c for c in candidates if not _owned(c.top or {})), candidates[0])
            found.deleting = claims.deleting(found.top or {})
            return found
        # Bare pods; what is left of a job whose pods are gone (a `pods` job's creation or delete
        # cut short, an object a controller left behind); a job's claims still being deleted
        # (they wait for its pods): found, so that `delete` and `--replace` remove what is left,
        # and a new submission waits for it to go.
        for api_version, plural in removal.leftover_kinds():
            if not self.discovery.has_version(api_version):
                continue
            # every claim: one may be in use by a deleted job's pod, another not
            one = plural != claims.PLURAL
            items = removal.labelled(self.cluster, api_version, plural, namespace, name, one=one)
            if items:
                return Found(
                    name,
                    namespace,
                    "pods",
                    deleting=all(claims.deleting(i) for i in items),
                    leftover=plural != "pods",
                )
        return None

    def _resolve(self, ref: str) -> Found:
        namespace, _, name = ref.rpartition("/")
        namespace = namespace or self._namespace()
        found = self._find(name, namespace)
        if found is None:
            where = f"namespace {namespace}" + (
                f" of context {self.cluster.context}" if self.cluster.context else ""
            )
            raise JobNotFound(f"no job {name!r} in {where}", ref)
        return found

    def _report(
        self,
        found: Found,
        pods: dict[str, dict[str, Any]],
        top: dict[str, Any] | None,
        podgroup: dict[str, Any] | None = None,
    ) -> JobReport:
        return build_report(
            name=found.name,
            namespace=found.namespace,
            target=found.target,
            context=self.cluster.context,
            top=top,
            pods=pods,
            podgroup=podgroup,
        )

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
        self._add_log_tail(report)
        if report.first_failure is not None and not report.first_failure.log_tail:
            report.first_failure.log_tail = follower.tail(report.first_failure.short)
        return report

    def _add_log_tail(self, report: JobReport) -> None:
        failure = report.first_failure
        if failure is None or failure.log_tail:
            return
        pod = next((p for p in report.pods if p.name == failure.pod), None)
        container = next((c for c in pod.containers if not c.init), None) if pod else None
        if pod is None or container is None:
            return
        previous = container.state != "terminated" and container.restarts > 0
        try:
            failure.log_tail = read_log(
                self.cluster,
                report.namespace,
                pod.name,
                container.name,
                tail=LOG_TAIL_LINES,
                previous=previous,
            )
        except EngineError as err:
            if not refused(err):
                raise
            self._log_refused(err)  # the job's outcome matters more than its log

    def _clear_way(self, existing: Found, replacing: bool) -> None:
        """A job of the same name is there: wait for one being deleted to go, or delete it
        (--replace) and wait, within GONE_TIMEOUT as a whole; else refuse."""
        job, namespace = existing.name, existing.namespace
        if existing.deleting:  # a job deleted a moment ago: its claims wait for its pods to go
            self._note(f"job {job} is still being deleted in namespace {namespace}; waiting for it to go")
        elif not replacing:
            raise EngineError(
                f"job {job} already exists in namespace {namespace} (target {existing.target}); "
                "use --replace to delete it and submit again"
            )
        deadline = time.monotonic() + GONE_TIMEOUT
        try:
            if not existing.deleting and not removal.delete_within(
                self.cluster, self.discovery, existing, GONE_TIMEOUT
            ):
                raise self._still_there(existing, "its delete had no answer")
            while time.monotonic() < deadline:
                lookup = bounded.Background(lambda: self._find(job, namespace), name="torchjob-find")
                if not lookup.wait(bounded.left_of(deadline)):
                    break
                if lookup.outcome() is None:
                    return
                time.sleep(min(0.5, bounded.left_of(deadline)))
        except KeyboardInterrupt:
            if existing.deleting:
                raise  # someone else's delete: it goes on by itself
            self._note(
                f"interrupted while replacing job {existing.ref}; nothing new was created; "
                f"{removal.what_is_left(existing)} may remain, deleted in part: remove them with "
                f"{bounded.remove_command(existing.ref)}"
            )
            raise Interrupted from None
        raise self._still_there(existing, "it was deleted but is still there")

    def _still_there(self, existing: Found, why: str) -> EngineError:
        return EngineError(
            f"job {existing.name} is in the way of the new one: {why} after {GONE_TIMEOUT:g}s; nothing "
            f"new was created; {removal.what_is_left(existing)} may remain: remove them with "
            f"{bounded.remove_command(existing.ref)}, then submit again"
        )

    def _delete_after_timeout(self, found: Found) -> str:
        """The job that outlived --timeout deleted, within CLEANUP_TIMEOUT: how that went, said."""
        seconds = bounded.CLEANUP_TIMEOUT
        left = f"{removal.what_is_left(found)} may remain: remove them with "
        left += bounded.remove_command(found.ref)
        try:
            if removal.delete_within(self.cluster, self.discovery, found, seconds):
                return "deleted"
        except KeyboardInterrupt:
            self._note(f"interrupted while deleting job {found.ref} after its timeout; {left}")
            raise Interrupted from None
        return f"its delete had no answer within {seconds:g}s; {left}"


def _interrupted_delete(deleted: list[str], refs: list[str]) -> str:
    """What an interrupted ``delete`` did: the jobs deleted, and those not (the one under way may
    be deleted in part), with the command that deletes the rest."""
    rest = [ref for ref in refs if ref not in deleted]
    done = f"deleted {', '.join(deleted)}; " if deleted else ""
    return (
        f"interrupted; {done}not deleted (or only in part): {', '.join(rest)}; delete "
        f"{'it' if len(rest) == 1 else 'them'} with: {bounded.remove_command(*rest)}"
    )


def _owned(obj: dict[str, Any]) -> bool:
    return any(ref.get("controller") for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


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
