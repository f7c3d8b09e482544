"""The typed job model: a Volcano ``batch.volcano.sh/v1alpha1`` Job and torchjob's extensions.

The pod template stays a plain Kubernetes ``PodTemplateSpec`` dictionary, so everything a user
writes survives into the output untouched; the few parts torchjob reads go through the typed
accessors of :class:`PodTemplate` and :class:`Container`.
"""

from __future__ import annotations

from torchjob.records import field, record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

API_VERSION = "batch.volcano.sh/v1alpha1"
KIND = "Job"


def _dicts(value: Any) -> list[dict[str, Any]]:
    """The mappings of a list field; accessors must not fail on input that validation refuses."""
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


class Container:
    """Typed read access to one container dictionary of a pod template."""

    __slots__ = ("raw",)

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw

    @property
    def name(self) -> str:
        return str(self.raw.get("name") or "")

    @property
    def image(self) -> str:
        return str(self.raw.get("image") or "")

    @property
    def command(self) -> list[str]:
        command = self.raw.get("command")
        return [str(c) for c in command] if isinstance(command, list) else []

    @property
    def args(self) -> list[str]:
        args = self.raw.get("args")
        return [str(a) for a in args] if isinstance(args, list) else []

    @property
    def working_dir(self) -> str | None:
        value = self.raw.get("workingDir")
        return str(value) if value else None

    @property
    def env(self) -> list[dict[str, Any]]:
        return _dicts(self.raw.get("env"))

    @property
    def ports(self) -> list[dict[str, Any]]:
        return _dicts(self.raw.get("ports"))


class PodTemplate:
    """Typed read access to a task's ``template`` (a Kubernetes PodTemplateSpec)."""

    __slots__ = ("raw",)

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw

    @property
    def spec(self) -> dict[str, Any]:
        spec = self.raw.get("spec")
        return spec if isinstance(spec, dict) else {}

    @property
    def metadata(self) -> dict[str, Any]:
        meta = self.raw.get("metadata")
        return meta if isinstance(meta, dict) else {}

    @property
    def containers(self) -> list[Container]:
        return [Container(c) for c in _dicts(self.spec.get("containers"))]

    @property
    def init_containers(self) -> list[Container]:
        return [Container(c) for c in _dicts(self.spec.get("initContainers"))]

    @property
    def init_container_names(self) -> set[str]:
        """The job's own init containers: any other in a pod was added by a plugin (wait-for-master)."""
        return {c.name for c in self.init_containers}

    @property
    def hostname(self) -> str:
        return str(self.spec.get("hostname") or "")

    @property
    def subdomain(self) -> str:
        return str(self.spec.get("subdomain") or "")

    @property
    def restart_policy(self) -> str:
        """The pod's restartPolicy; Kubernetes defaults it to ``Always``."""
        return str(self.spec.get("restartPolicy") or "Always")


@record
class Policy:
    """A lifecycle policy: on ``events`` (or a container ``exit_code``) take ``action``."""

    action: str
    events: list[str] = field(default_factory=list)
    exit_code: int | None = None
    timeout: str | None = None
    # Where each event was written, parallel to ``events`` ("event", "events[0]"), for messages.
    event_keys: list[str] = field(default_factory=list)


@record
class DependsOn:
    names: list[str] = field(default_factory=list)
    iteration: str = "any"
    # Those of ``names`` that must have completed (every pod succeeded), not only run: JobSet's
    # ``status: Complete``. Volcano's Job has no such field: only a kind's reader sets it
    # (``Translation.finish``), and only the targets that can say it keep it.
    complete: list[str] = field(default_factory=list)


@record
class Task:
    name: str
    replicas: int
    template: PodTemplate
    min_available: int | None = None
    max_retry: int = 0
    policies: list[Policy] = field(default_factory=list)
    depends_on: DependsOn | None = None
    # CRD fields torchjob passes through without reading (topologyPolicy, partitionPolicy).
    extra: dict[str, Any] = field(default_factory=dict)


@record
class Metadata:
    name: str
    namespace: str = "default"
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


@record
class ElasticPolicy:
    """torch elastic launch settings (set by the SDK's ``Elastic``); mapped by cluster targets."""

    min_nodes: int
    max_nodes: int
    nproc_per_node: int = 1
    rdzv_backend: str = "c10d"
    rdzv_timeout: int = 900
    rdzv_join_timeout: int = 900
    max_restarts: int = 0
    start_method: str = "spawn"
    monitor_interval: float = 5.0
    rdzv_configs: dict[str, Any] = field(default_factory=dict)


@record
class JobRunPolicy:
    """Kubeflow-style run policy (set by the SDK); mapped by cluster targets."""

    clean_pod_policy: str | None = None
    ttl_seconds_after_finished: int | None = None
    active_deadline_seconds: int | None = None
    backoff_limit: int | None = None


@record
class JobSpec:
    tasks: list[Task]
    min_available: int = 0
    min_success: int | None = None
    max_retry: int = 0
    queue: str = ""
    scheduler_name: str = ""
    # True when scheduler_name is the webhook's default, not a scheduler the job itself names.
    scheduler_defaulted: bool = False
    priority_class_name: str = ""
    ttl_seconds_after_finished: int | None = None
    policies: list[Policy] = field(default_factory=list)
    # Plugin name -> its argument list, in the order the user wrote them.
    plugins: dict[str, list[str]] = field(default_factory=dict)
    # CRD fields passed through untouched (volumes, networkTopology, runningEstimate).
    extra: dict[str, Any] = field(default_factory=dict)


@record
class KindInfo:
    """What a job read from another kind than Volcano's Job keeps of it (``spec/kinds/``)."""

    kind: str  # "PyTorchJob", "TrainJob", "JobSet"
    api_version: str
    target: str  # the target that renders this kind ("kubeflow", "trainjob", "jobset")
    # The object as read, sent as it is when rendered for its own target; None once the job was
    # changed from the command line (--set, --workdir, arguments): then it is converted as others.
    source: dict[str, Any] | None = None
    # What runs differently here (the local and Slurm engines) than under the kind's controller:
    # issues at the kind's own field paths; warnings, and errors where a run here would end
    # otherwise than on a cluster (``validate --local`` lists them, ``run`` refuses the errors).
    here: list[Any] = field(default_factory=list)

    def here_issues(self, errors: bool) -> list[Any]:
        """The errors (or the warnings) of a run here; see ``here``."""
        return [issue for issue in self.here if (issue.severity == "error") is errors]

    # The Volcano Job document the job was checked from (a spec.source.Document whose problems are
    # told in the kind's terms): what commands change with --set and print problems through.
    document: Any = None


def here_issues(job: Job, errors: bool) -> list[Any]:
    """What the kind a job was read from does that a run here does not: the errors that stop it
    (or the warnings), at the kind's paths (the job's document tells them there)."""
    return job.kind.here_issues(errors) if job.kind is not None else []


def completions(job: Job) -> dict[str, list[str]]:
    """Per task, the tasks it waits for to complete (``DependsOn.complete``), which the job's
    Volcano manifest cannot carry: what :func:`wait_for_completions` gives back to a job."""
    return {t.name: t.depends_on.complete for t in job.spec.tasks if t.depends_on and t.depends_on.complete}


def wait_for_completions(job: Job, completes: dict[str, list[str]]) -> None:
    """Give ``job``'s tasks the dependencies they wait for to complete (``completes``, per task),
    each among those its dependsOn names."""
    for task in job.spec.tasks:
        waits = completes.get(task.name)
        if waits and task.depends_on is not None:
            task.depends_on.complete = [n for n in waits if n in task.depends_on.names]


def own_path(job: Job, path: str) -> str:
    """A field path of the job's Volcano Job as its user wrote it: for a job read from a
    PyTorchJob, TrainJob or JobSet, the kind's own path (``spec.tasks[0].template.spec.nodeSelector``
    is ``spec.pytorchReplicaSpecs.Master.template.spec.nodeSelector``); others as they are. For
    what an engine says itself, outside the CLI's ``FILE:LINE: path: message`` lines."""
    document = job.kind.document if job.kind is not None else None
    return str(document.problem(path, "").path) if document is not None else path


# Where a job made by torchjob came from: "script" (``run -j NxM script.py``) or "task" (an SDK
# task). Such a job's user wrote no Volcano policy: engines speak of it in the user's terms.
ORIGIN = "torchjob.io/origin"


@record
class Job:
    metadata: Metadata
    spec: JobSpec
    elastic: ElasticPolicy | None = None
    run_policy: JobRunPolicy | None = None
    kind: KindInfo | None = None  # read from a PyTorchJob, TrainJob or JobSet

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def origin(self) -> str:
        """ "script" or "task" for a job torchjob made from one; "" for a job file."""
        return self.metadata.annotations.get(ORIGIN, "")

    def task(self, name: str) -> Task | None:
        """The first task with this name (Volcano's lookup), or None."""
        for task in self.spec.tasks:
            if task.name == name:
                return task
        return None

    @property
    def total_replicas(self) -> int:
        return sum(t.replicas for t in self.spec.tasks)


def pod_name(job_name: str, task_name: str, index: int) -> str:
    """Volcano's pod name: ``<job>-<task>-<index>``."""
    return f"{job_name}-{task_name}-{index}"
