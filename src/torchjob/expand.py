"""Expansion: a validated Job becomes the desired state a cluster would create.

``expand(job, addressing)`` builds every pod from its task's template, lets each plugin change it
in :data:`~torchjob.plugins.PLUGIN_ORDER`, and collects the plugins' job-level objects. It does no
I/O: ``render`` prints its result, the local engine runs it, and the tests snapshot it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from torchjob.addressing import ClusterAddressing
from torchjob.errors import Issue
from torchjob.plugins import PodContext, build_plugins
from torchjob.records import field, record
from torchjob.spec.model import Job, Task, pod_name
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.addressing import Addressing

TASK_INDEX = "volcano.sh/task-index"
TASK_SPEC = "volcano.sh/task-spec"
JOB_NAME = "volcano.sh/job-name"
JOB_NAMESPACE = "volcano.sh/job-namespace"
QUEUE_NAME = "volcano.sh/queue-name"
JOB_VERSION = "volcano.sh/job-version"
TEMPLATE_UID = "volcano.sh/template-uid"
RETRY_COUNT = "volcano.sh/job-retry-count"
GROUP_NAME = "scheduling.k8s.io/group-name"
NUMA_POLICY = "volcano.sh/numa-topology-policy"
PARTITION_ID = "volcano.sh/partition-id"
PREEMPTABLE = "volcano.sh/preemptable"
COOLDOWN_TIME = "volcano.sh/cooldown-time"
REVOCABLE_ZONE = "volcano.sh/revocable-zone"
JDB_MIN_AVAILABLE = "volcano.sh/jdb-min-available"
JDB_MAX_UNAVAILABLE = "volcano.sh/jdb-max-unavailable"
# Job annotations and labels Volcano copies onto every pod of the job.
_COPIED_ANNOTATIONS = (PREEMPTABLE, COOLDOWN_TIME, REVOCABLE_ZONE)
_COPIED_LABELS = (PREEMPTABLE, COOLDOWN_TIME)


@record
class PodPlan:
    """One pod to create: which task and index it is, and its full manifest."""

    task: Task
    index: int
    manifest: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])


@record
class DesiredState:
    job: Job
    pods: list[PodPlan]
    objects: list[dict[str, Any]] = field(default_factory=list)
    # Notes the user should see (severity ``warning``); not errors.
    warnings: list[Issue] = field(default_factory=list)
    addressing: Any = None  # what the pods were addressed with (an Addressing; None: the cluster's)


def _copy(value: Any) -> Any:
    """A deep copy of plain YAML data; much faster than copy.deepcopy for many pods."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cycle collector while building acyclic data.

    Rendered objects hold no cycles, but creating hundreds of thousands of them makes the
    collector scan the growing heap again and again (this alone tripled the time to expand a
    10,000-pod job).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@record(frozen=True)
class JobVolume:
    """One ``spec.volumes`` entry of the job: a claim mounted into every pod."""

    claim_name: str
    volume_name: str
    mount_path: str
    # The PersistentVolumeClaim spec to create, when the job gives one.
    claim_spec: dict[str, Any] | None


def _stable_suffix(text: str) -> str:
    # Volcano picks 12 random [0-9a-z] characters; a hash keeps the output reproducible.
    import hashlib  # here: loading OpenSSL costs 2 ms and most jobs have no volumes

    return hashlib.sha256(text.encode()).hexdigest()[:12]


def job_volumes(job: Job) -> list[JobVolume]:
    """The job's claims as Volcano's controller mounts them; the first entry of a claim wins."""
    raw = job.spec.extra.get("volumes")
    volumes: list[JobVolume] = []
    if not isinstance(raw, list):
        return volumes
    seen: set[str] = set()
    for index, entry in enumerate(raw):
        if not isinstance(entry, dict) or not isinstance(entry.get("mountPath"), str):
            continue
        claim_spec = entry.get("volumeClaim")
        claim = entry.get("volumeClaimName")
        if not isinstance(claim, str) or not claim:
            claim = f"{job.name}-volume-{_stable_suffix(f'{job.metadata.namespace}/{job.name}/{index}')}"
        if claim in seen:  # Volcano skips a repeated claim entirely, mount included
            continue
        seen.add(claim)
        volumes.append(
            JobVolume(
                claim_name=claim,
                volume_name=f"{job.name}-{_stable_suffix(f'{job.metadata.namespace}/{job.name}/{claim}')}",
                mount_path=entry["mountPath"],
                claim_spec=_copy(claim_spec) if isinstance(claim_spec, dict) else None,
            )
        )
    return volumes


def claim_objects(job: Job) -> list[dict[str, Any]]:
    """The PersistentVolumeClaims the controller creates for volumes that carry a claim spec."""
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": v.claim_name, "namespace": job.metadata.namespace},
            "spec": v.claim_spec,
        }
        for v in job_volumes(job)
        if v.claim_spec is not None
    ]


def _copy_job_metadata(
    job: Job, task: Task, index: int, labels: dict[str, str], annotations: dict[str, str]
) -> None:
    """The labels and annotations ``createJobPod`` derives from the job and the task."""
    topology = task.extra.get("topologyPolicy")
    if topology:
        annotations[NUMA_POLICY] = str(topology)
    job_annotations = job.metadata.annotations
    for key in _COPIED_ANNOTATIONS:
        if key in job_annotations:
            annotations[key] = job_annotations[key]
    # A disruption budget is either a minimum available or a maximum unavailable, never both.
    if JDB_MIN_AVAILABLE in job_annotations:
        annotations[JDB_MIN_AVAILABLE] = job_annotations[JDB_MIN_AVAILABLE]
    elif JDB_MAX_UNAVAILABLE in job_annotations:
        annotations[JDB_MAX_UNAVAILABLE] = job_annotations[JDB_MAX_UNAVAILABLE]
    for key in _COPIED_LABELS:
        if key in job.metadata.labels:
            labels[key] = job.metadata.labels[key]
    partition = task.extra.get("partitionPolicy")
    size = partition.get("partitionSize") if isinstance(partition, dict) else None
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        labels[PARTITION_ID] = str(index // size)


def new_pod(
    job: Job,
    task: Task,
    index: int,
    *,
    version: int = 0,
    retry_count: int = 0,
    volumes: list[JobVolume] | None = None,
) -> dict[str, Any]:
    """The pod Volcano's controller creates before plugins run (``createJobPod``)."""
    template = task.template
    name = pod_name(job.name, task.name, index)
    labels = {str(k): str(v) for k, v in (template.metadata.get("labels") or {}).items()}
    labels.update(
        {
            TASK_INDEX: str(index),
            JOB_NAME: job.name,
            TASK_SPEC: task.name,
            JOB_NAMESPACE: job.metadata.namespace,
            QUEUE_NAME: job.spec.queue,
        }
    )
    annotations = {str(k): str(v) for k, v in (template.metadata.get("annotations") or {}).items()}
    annotations.update(
        {
            TASK_INDEX: str(index),
            TASK_SPEC: task.name,
            # Volcano appends the Job's UID, which only exists once the Job is created on a cluster.
            GROUP_NAME: job.name,
            JOB_NAME: job.name,
            QUEUE_NAME: job.spec.queue,
            JOB_VERSION: str(version),
            TEMPLATE_UID: f"{job.name}-{task.name}",
            RETRY_COUNT: str(retry_count),
        }
    )
    _copy_job_metadata(job, task, index, labels, annotations)
    spec = _copy(template.spec)
    if not spec.get("schedulerName"):
        spec["schedulerName"] = job.spec.scheduler_name
    if not spec.get("priorityClassName") and job.spec.priority_class_name:
        spec["priorityClassName"] = job.spec.priority_class_name
    if spec.get("hostNetwork") is True and not spec.get("dnsPolicy"):
        # Volcano's mutating webhook sets this on the task template so host-network pods keep
        # cluster DNS (and so can still resolve the svc plugin's host names).
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    for volume in job_volumes(job) if volumes is None else volumes:
        spec.setdefault("volumes", []).append(
            {"name": volume.volume_name, "persistentVolumeClaim": {"claimName": volume.claim_name}}
        )
        for container in spec.get("containers", []):  # not init containers, like Volcano
            container.setdefault("volumeMounts", []).append(
                {"name": volume.volume_name, "mountPath": volume.mount_path}
            )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": job.metadata.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    }


class Expansion:
    """One job's expansion, piece by piece: ``expand`` collects it all, ``render`` streams it.

    The plugins are built once, so per-job values (host lists, the master address) are computed
    once however many pods follow.
    """

    def __init__(
        self, job: Job, addressing: Addressing | None = None, *, version: int = 0, retry_count: int = 0
    ) -> None:
        self.job = job
        self.addressing = addressing or ClusterAddressing()
        self.version = version
        self.retry_count = retry_count
        self.plugins = build_plugins(job)
        self.volumes = job_volumes(job)

    def pods(self) -> Iterator[PodPlan]:
        """Each pod in creation order (tasks in order, then index), built when asked for."""
        job, addressing = self.job, self.addressing
        for task in job.spec.tasks:
            for index in range(task.replicas):
                manifest = new_pod(
                    job,
                    task,
                    index,
                    version=self.version,
                    retry_count=self.retry_count,
                    volumes=self.volumes,
                )
                ctx = PodContext(job=job, task=task, index=index, pod=manifest, addressing=addressing)
                for plugin in self.plugins:
                    plugin.on_pod_create(ctx)
                yield PodPlan(task=task, index=index, manifest=manifest)

    def objects(self) -> list[dict[str, Any]]:
        """Job-level objects: claims, then each plugin's (Service, ConfigMap, NetworkPolicy)."""
        objects = claim_objects(self.job)
        objects += [obj for plugin in self.plugins for obj in plugin.job_objects(self.job, self.addressing)]
        return objects

    def warnings(self) -> list[Issue]:
        """Notes for the user (issues of severity ``warning``); needs no pods."""
        return [w for plugin in self.plugins for w in plugin.warnings(self.job, self.addressing)]


def expand(
    job: Job, addressing: Addressing | None = None, *, version: int = 0, retry_count: int = 0
) -> DesiredState:
    """Every pod and job-level object of a validated, defaulted job."""
    expansion = Expansion(job, addressing, version=version, retry_count=retry_count)
    with paused_gc():
        pods = list(expansion.pods())
        objects = expansion.objects()
    return DesiredState(job, pods, objects, expansion.warnings(), addressing)


def readdress(state: DesiredState, addressing: Addressing) -> bool:
    """Give ``state``'s pods and objects, in place, what expanding its job with ``addressing``
    would give (a local job's host ports and names are known only once its turn comes), without
    building the pods again: each plugin rewrites the values it took from the old addressing, the
    job-level objects are made anew. False when a plugin cannot (``state`` is then unusable: expand
    again)."""
    job = state.job
    expansion = Expansion(job, addressing)
    was = state.addressing or ClusterAddressing()
    with paused_gc():
        pods = [PodContext(job, p.task, p.index, p.manifest, addressing) for p in state.pods]
        for plugin in expansion.plugins:
            if not plugin.readdress(job, pods, was):
                return False
        state.objects = expansion.objects()
    state.warnings = expansion.warnings()
    state.addressing = addressing
    return True


def restamp(state: DesiredState, version: int, retry_count: int) -> DesiredState:
    """The pods of another attempt of the job (after a restart): ``state``'s with the job's version
    and retry count in their annotations, the only fields these change. Pod specs are shared, not
    copied: nothing changes a planned pod's spec."""
    pods = []
    for plan in state.pods:
        meta = dict(plan.manifest["metadata"])
        meta["annotations"] = {
            **meta["annotations"],
            JOB_VERSION: str(version),
            RETRY_COUNT: str(retry_count),
        }
        pods.append(PodPlan(plan.task, plan.index, {**plan.manifest, "metadata": meta}))
    return DesiredState(state.job, pods, state.objects, state.warnings, state.addressing)


class Attempts:
    """The desired pods of each attempt of a job from its one expansion: the first as it is,
    another restamped for its restart's version and retry count. An engine's controller asks on
    every pass that may create pods; only the first and the newest restamp are kept."""

    def __init__(self, first: DesiredState) -> None:
        self.first = first
        self._newest: tuple[tuple[int, int], DesiredState] = ((0, 0), first)

    def __call__(self, version: int, retry_count: int) -> DesiredState:
        key = (version, retry_count)
        if key == (0, 0):
            return self.first
        if self._newest[0] != key:
            self._newest = (key, restamp(self.first, version, retry_count))
        return self._newest[1]
