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

Nothing here depends on addresses: a JobSet sets no rendezvous env of its own.
"""

from __future__ import annotations

from torchjob.plugins.base import Plugin, PodContext
from torchjob.plugins.flags import Flag
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from torchjob.spec.model import Job

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
        for container in ctx.all_containers():  # unless the container sets it itself
            env = container.setdefault("env", [])
            if not any(isinstance(e, dict) and e.get("name") == "JOB_COMPLETION_INDEX" for e in env):
                env.append({"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {"fieldPath": path}}})
