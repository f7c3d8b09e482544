"""The ``trainer`` plugin: the ``PET_*`` env Kubeflow Trainer's torch plugin gives a TrainJob's nodes.

Set by torchjob when it reads a ``trainer.kubeflow.org/v1alpha1`` TrainJob (spec/kinds/trainjob.py),
with the ``jobset`` plugin for the JobSet the TrainJob becomes. The trainer's ``node`` container
(and the containers the runtime's ``envInjection`` names) get, each replacing an entry of its
name (``pkg/runtime/framework/plugins/torch``): ``PET_NNODES``, ``PET_NPROC_PER_NODE``,
``PET_NODE_RANK`` (the pod's completion index), ``PET_MASTER_ADDR`` (node 0, the addressing's
name for ``<job>-node-0-0.<job>``) and ``PET_MASTER_PORT`` (29500). Nothing else: no ``RANK``,
``WORLD_SIZE`` or ``MASTER_ADDR`` (torchrun sets those for each process it starts).
"""

from __future__ import annotations

from torchjob.errors import Issue
from torchjob.plugins import envset
from torchjob.plugins.base import Issues, Plugin, PodContext
from torchjob.plugins.flags import Flag, port_range
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.addressing import Addressing
    from torchjob.spec.model import Job, Task

PORT = 29500
INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


class TrainerPlugin(Plugin):
    name = "trainer"
    flags = (
        Flag("node", str, "node-0"),  # the task of the trainer's nodes
        Flag("container", str, "node"),  # the trainer's container
        Flag("inject", str, ""),  # envInjection: TASK/CONTAINER,... (the runtime's other containers)
        Flag("nproc-per-node", str, "1"),
        Flag("port", int, PORT, port_range),
    )

    def check(self, job: Job) -> Issues:
        if job.task(str(self.values["node"])) is None:
            return [
                Issue(
                    "spec.plugins.trainer",
                    f"--node names task {self.values['node']!r}, which the job does not have",
                )
            ]
        return []

    def targets(self, task: Task) -> set[str]:
        """The containers of the task's pods that get the env."""
        names = {str(self.values["container"])} if task.name == self.values["node"] else set()
        for pair in filter(None, str(self.values["inject"]).split(",")):
            target, _, container = pair.partition("/")
            if target == task.name:
                names.add(container)
        return names

    def env(self, job: Job, task: Task, index: int, addressing: Addressing) -> list[tuple[str, str]]:
        """The literal values (``PET_NODE_RANK`` is read from the pod, see ``entries``)."""
        node = job.task(str(self.values["node"]))
        if node is None or not self.targets(task):
            return []
        port = str(addressing.port(job, int(self.values["port"])))
        return [
            ("PET_NNODES", str(node.replicas)),  # the trainer's Job: parallelism = numNodes
            ("PET_NPROC_PER_NODE", str(self.values["nproc-per-node"])),
            ("PET_MASTER_ADDR", addressing.host(job, node, 0)),
            ("PET_MASTER_PORT", port),
        ]

    def entries(self, ctx: PodContext) -> list[dict[str, Any]]:
        pairs = dict(self.env(ctx.job, ctx.task, ctx.index, ctx.addressing))
        if not pairs:
            return []
        rank = {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": INDEX_FIELD}}}
        first = [{"name": n, "value": pairs[n]} for n in ("PET_NNODES", "PET_NPROC_PER_NODE")]
        last = [{"name": n, "value": pairs[n]} for n in ("PET_MASTER_ADDR", "PET_MASTER_PORT")]
        return [*first, rank, *last]

    def _containers(self, ctx: PodContext) -> list[dict[str, Any]]:
        names = self.targets(ctx.task)
        return [c for c in ctx.all_containers() if c.get("name") in names]

    def on_pod_create(self, ctx: PodContext) -> None:
        for container in self._containers(ctx):
            envset.upsert(container, self.entries(ctx))

    def readdress(self, job: Job, pods: list[PodContext], was: Addressing) -> bool:
        return envset.readdress(self.env, job, pods, was, self._containers)

    def rank(self, job: Job, task: Task, index: int) -> int | None:
        return index if task.name == self.values["node"] else None

    def ports(self, job: Job) -> list[int]:
        return [int(self.values["port"])]
