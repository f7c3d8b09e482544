"""The ``jobset`` plugin: what JobSet's controller and Kubernetes' Job controller put on a pod.

Set by torchjob when it reads a ``jobset.x-k8s.io/v1alpha2`` JobSet (or the JobSet a TrainJob
becomes; spec/kinds/jobset.py). Each child Job ``<jobset>-<replicated job>-<j>`` is a task of
that name without the set's prefix (``<replicated job>-<j>``), one pod per completion index, so
pod ``p`` is ``<jobset>-<replicated job>-<j>-<p>``, the hostname JobSet gives it. Every pod gets:

- JobSet's labels and annotations (``jobset.sigs.k8s.io/``: ``jobset-name``, ``replicatedjob-name``,
  ``replicatedjob-replicas``, ``job-index``, ``job-global-index``, ``global-replicas``,
  ``restart-attempt``, and ``coordinator`` when the set names one);
- the Job controller's ``batch.kubernetes.io/job-completion-index`` (label and annotation) and
  ``batch.kubernetes.io/job-name``, and in every container and init container
  ``JOB_COMPLETION_INDEX`` (read from that annotation), as for any Indexed Job.

A JobSet sets no rendezvous env of its own: its users write it, naming a pod of the set
(``MASTER_ADDR: <set>-workers-0-0.<set>``) and one of its container ports (``MASTER_PORT:
"3389"``). On a cluster that name is the pod's DNS name and the port the pod's own. Where the pods
are processes sharing a machine or Slurm's nodes, an env value that names a pod of the set
(``NAME``, ``NAME.<subdomain>``, either with ``:PORT``) becomes that pod's address here, and a
``*PORT`` variable holding one of the set's container ports becomes the port the engine gives it
(the pod so named ranks 0 for the engines: the Slurm engine places it first).
"""

from __future__ import annotations

from torchjob.addressing import ClusterAddressing
from torchjob.plugins.base import Plugin, PodContext
from torchjob.plugins.flags import Flag
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from torchjob.addressing import Addressing
    from torchjob.spec.model import Job, Task

KEY = "jobset.sigs.k8s.io"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOB_NAME = "batch.kubernetes.io/job-name"


def replicated_job(task_name: str) -> tuple[str, int]:
    """``workers-2`` -> (``workers``, 2): a task is a child Job, ``<replicated job>-<index>``."""
    name, _, index = task_name.rpartition("-")
    return (name, int(index)) if index.isdigit() and index.isascii() else (task_name, 0)


class JobSetPlugin(Plugin):
    name = "jobset"
    flags = (
        Flag("subdomain", str, ""),  # network.subdomain ("" for the set's name)
        Flag("coordinator", str, ""),  # <replicated job>-<job index>-<pod index>, when given
    )

    def __init__(self, args: list[str]) -> None:
        super().__init__(args)
        self._layout: tuple[Job, dict[str, tuple[str, int, int, int]], int] | None = None
        self._names: tuple[Job, dict[str, tuple[Task, int]], set[int]] | None = None

    def names(self, job: Job) -> tuple[dict[str, tuple[Task, int]], set[int]]:
        """The set's pods by each name a value may give them, and its containers' ports."""
        if self._names is None or self._names[0] is not job:
            subdomain = str(self.values["subdomain"]) or job.name
            pods: dict[str, tuple[Task, int]] = {}
            ports: set[int] = set()
            for task in job.spec.tasks:
                for index in range(task.replicas):
                    name = f"{job.name}-{task.name}-{index}"
                    pods[name] = pods[f"{name}.{subdomain}"] = (task, index)
                for container in [*task.template.init_containers, *task.template.containers]:
                    ports.update(
                        p["containerPort"] for p in container.ports if isinstance(p.get("containerPort"), int)
                    )
            self._names = (job, pods, ports)
        return self._names[1], self._names[2]

    def wired(self, job: Job, name: str, value: str, addressing: Addressing) -> str | None:
        """``value`` as this addressing reaches what it names; None when it names nothing of the set."""
        if isinstance(addressing, ClusterAddressing):
            return None  # the cluster's own names and ports
        pods, ports = self.names(job)
        if value in pods:
            return addressing.host(job, *pods[value])
        host, colon, port = value.rpartition(":")
        if colon and host in pods and port.isdigit() and port.isascii():
            return f"{addressing.host(job, *pods[host])}:{addressing.port(job, int(port))}"
        if name.endswith("PORT") and value.isdigit() and value.isascii() and int(value) in ports:
            return str(addressing.port(job, int(value)))
        return None

    def _rewrite(self, ctx: PodContext, was: Addressing | None) -> None:
        """Each env value of the pod's containers that names a pod or port of the set, as the
        addressing reaches it (``was``: what the pods were made with, readdressed now)."""
        spec = ctx.task.template.spec
        for kind in ("initContainers", "containers"):
            written = [c for c in spec.get(kind) or [] if isinstance(c, dict)]
            for source, container in zip(written, ctx.spec.get(kind) or [], strict=False):
                for own, entry in zip(source.get("env") or [], container.get("env") or [], strict=False):
                    value, name = own.get("value") if isinstance(own, dict) else None, entry.get("name")
                    if not isinstance(value, str) or not isinstance(name, str):
                        continue
                    before = (self.wired(ctx.job, name, value, was) if was is not None else None) or value
                    after = self.wired(ctx.job, name, value, ctx.addressing) or value
                    if entry.get("value") == before:
                        entry["value"] = after

    def readdress(self, job: Job, pods: list[PodContext], was: Addressing) -> bool:
        for ctx in pods:
            self._rewrite(ctx, was)
        return True

    def master(self, job: Job) -> tuple[str, int] | None:
        """The pod an env value names as the rendezvous (``MASTER_ADDR``), if any."""
        pods, _ = self.names(job)
        for task in job.spec.tasks:
            for container in task.template.containers:
                for var in container.env:
                    if var.get("name") == "MASTER_ADDR" and str(var.get("value")) in pods:
                        found, index = pods[str(var["value"])]
                        return found.name, index
        return None

    def rank(self, job: Job, task: Task, index: int) -> int | None:
        return 0 if self.master(job) == (task.name, index) else None

    def ports(self, job: Job) -> list[int]:
        """The set's container ports its env hands out as ``*PORT`` (a rendezvous port)."""
        _, ports = self.names(job)
        found = [
            int(var["value"])
            for task in job.spec.tasks
            for container in task.template.containers
            for var in container.env
            if str(var.get("name", "")).endswith("PORT")
            and str(var.get("value", "")).isdigit()
            and int(var["value"]) in ports
        ]
        return sorted(set(found))

    def layout(self, job: Job) -> tuple[dict[str, tuple[str, int, int, int]], int]:
        """Per task: (replicated job, job index, global index, replicas of its replicated job); and
        the set's number of Jobs."""
        if self._layout is None or self._layout[0] is not job:
            counts: dict[str, int] = {}
            for task in job.spec.tasks:
                name, _ = replicated_job(task.name)
                counts[name] = counts.get(name, 0) + 1
            layout = {}
            for number, task in enumerate(job.spec.tasks):
                name, index = replicated_job(task.name)
                layout[task.name] = (name, index, number, counts[name])
            self._layout = (job, layout, len(job.spec.tasks))
        return self._layout[1], self._layout[2]

    def on_pod_create(self, ctx: PodContext) -> None:
        job = ctx.job
        layout, total = self.layout(job)
        rjob, index, number, replicas = layout[ctx.task.name]
        ids = {
            f"{KEY}/jobset-name": job.name,
            f"{KEY}/replicatedjob-name": rjob,
            f"{KEY}/replicatedjob-replicas": str(replicas),
            f"{KEY}/job-index": str(index),
            f"{KEY}/job-global-index": str(number),
            f"{KEY}/global-replicas": str(total),
            f"{KEY}/restart-attempt": "0",
        }
        coordinator = str(self.values["coordinator"])
        if coordinator:
            subdomain = str(self.values["subdomain"]) or job.name
            ids[f"{KEY}/coordinator"] = f"{job.name}-{coordinator}.{subdomain}"
        batch = {COMPLETION_INDEX: str(ctx.index), JOB_NAME: f"{job.name}-{ctx.task.name}"}
        meta = ctx.pod["metadata"]
        meta["labels"] = {**meta.get("labels", {}), **ids, **batch}
        meta["annotations"] = {**meta.get("annotations", {}), **ids, COMPLETION_INDEX: str(ctx.index)}
        path = f"metadata.annotations['{COMPLETION_INDEX}']"
        self._rewrite(ctx, None)
        for container in ctx.all_containers():  # unless the container sets it itself
            env = container.setdefault("env", [])
            if not any(isinstance(e, dict) and e.get("name") == "JOB_COMPLETION_INDEX" for e in env):
                env.append({"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {"fieldPath": path}}})
