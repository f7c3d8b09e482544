"""The ``kubeflow`` plugin: the env the Kubeflow training operator v1 gives a PyTorchJob's pods.

Set by torchjob when it reads a ``kubeflow.org/v1`` PyTorchJob (spec/kinds/pytorchjob.py); the
flags say what the operator reads from the PyTorchJob. Every container (not the init containers)
of every pod gets, in the operator's order (``pkg/controller.v1/pytorch/envvar.go``):

- ``PYTHONUNBUFFERED=1``;
- with a master: ``MASTER_PORT``, ``PET_MASTER_PORT``, ``MASTER_ADDR``, ``PET_MASTER_ADDR`` (the
  master pod), ``WORLD_SIZE`` (pods times ``nprocPerNode`` when that is a number), ``RANK`` and
  ``PET_NODE_RANK`` (the master 0, worker ``i`` ``i + 1``);
- ``PET_NPROC_PER_NODE`` when ``nprocPerNode`` is set (the operator defaults it to ``auto``);
- elastic: ``PET_RDZV_ENDPOINT`` (worker 0, or ``rdzvHost``), ``PET_RDZV_BACKEND``, ``PET_NNODES``
  (``min:max``), ``PET_MAX_RESTARTS``, ``PET_NPROC_PER_NODE``, ``PET_RDZV_ID``, ``PET_RDZV_CONF``,
  ``PET_STANDALONE``; otherwise ``PET_NNODES`` (the pods).

The master and worker 0 are named as the operator names them, by the Service it makes for each
pod (``<job>-master-0``, ``<job>-worker-0``), where pod names resolve (the local engine's job
network); elsewhere by the addressing's address for the pod (a Slurm node's name; in objects
rendered for a cluster the pod's DNS name, the operator setting its own there). One
addition where the pods are not a cluster's: torch's c10d rendezvous is hosted by the agent whose
machine is named by ``PET_RDZV_ENDPOINT`` (on a cluster, worker 0, by its hostname); processes on
one machine all have its name, so ``PET_RDZV_CONF`` says it instead: ``is_host=1`` on worker 0,
``is_host=0`` on the others.
"""

from __future__ import annotations

from torchjob.addressing import ClusterAddressing
from torchjob.errors import Issue, warning
from torchjob.plugins import envset
from torchjob.plugins.base import Issues, Plugin, PodContext
from torchjob.plugins.flags import Flag, non_negative, port_range
from torchjob.spec import names
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.addressing import Addressing
    from torchjob.spec.model import Job, Task

DEFAULT_PORT = 23456


def _task_or_none(value: Any) -> str | None:
    return None if value == "" or names.is_dns1123_label(value) else names.label_problem(value)


def _positive(value: Any) -> str | None:
    return None if 1 <= value <= 2**31 - 1 else f"expected an integer from 1 to {2**31 - 1}, got {value}"


class KubeflowPlugin(Plugin):
    name = "kubeflow"
    flags = (
        Flag("master", str, "", _task_or_none),  # the Master replica's task ("" for none)
        Flag("worker", str, "", _task_or_none),  # the Worker replica's task ("" for none)
        Flag("port", int, DEFAULT_PORT, port_range),  # the master's pytorchjob-port
        Flag("nproc-per-node", str, ""),  # spec.nprocPerNode as written ("" unset)
        Flag("elastic", bool, False),  # an elasticPolicy is given
        Flag("min-replicas", int, None, _positive),
        Flag("max-replicas", int, None, _positive),
        Flag("rdzv-backend", str, "c10d"),
        Flag("rdzv-host", str, ""),  # "" for worker 0
        Flag("rdzv-port", int, DEFAULT_PORT, port_range),
        Flag("rdzv-id", str, ""),
        Flag("rdzv-conf", str, ""),  # key=value,key=value
        Flag("standalone", bool, False),
        Flag("max-restarts", int, None, non_negative),
        Flag("elastic-nproc-per-node", int, None, _positive),  # elasticPolicy.nProcPerNode
    )

    @property
    def master(self) -> str:
        return str(self.values["master"])

    @property
    def worker(self) -> str:
        return str(self.values["worker"])

    def check(self, job: Job) -> Issues:
        issues: Issues = []
        for role in ("master", "worker"):
            name = str(self.values[role])
            if name and job.task(name) is None:
                tasks = ", ".join(t.name for t in job.spec.tasks)
                message = f"--{role} names task {name!r} but the job has no such task (tasks: {tasks})"
                issues.append(Issue("spec.plugins.kubeflow", message))
        master = job.task(self.master) if self.master else None
        if master is not None and master.replicas != 1:
            index = job.spec.tasks.index(master)
            issues.append(
                Issue(
                    f"spec.tasks[{index}].replicas",
                    f"the master has exactly 1 replica, got {master.replicas}",
                )
            )
        if not self.master and not self.worker:
            issues.append(Issue("spec.plugins.kubeflow", "expected --master or --worker"))
        return issues

    def _pods(self, job: Job) -> int:
        return sum(t.replicas for t in job.spec.tasks if t.name and t.name in (self.master, self.worker))

    def rank(self, job: Job, task: Task, index: int) -> int | None:
        if not self.master or job.task(self.master) is None:
            return None  # the operator gives no RANK without a master
        if task.name == self.master:
            return index
        return index + 1 if task.name == self.worker else None

    def env(self, job: Job, task: Task, index: int, addressing: Addressing) -> list[tuple[str, str]]:
        """What the operator sets in each container of pod ``index`` of ``task``."""
        if task.name not in (self.master, self.worker) or not task.name:
            return []
        values = self.values
        pairs = [("PYTHONUNBUFFERED", "1")]
        total = self._pods(job)
        nproc = str(values["nproc-per-node"])
        master = job.task(self.master) if self.master else None
        if master is not None:
            port = str(addressing.port(job, int(values["port"])))
            address = addressing.service(job, master, 0)  # the operator's <job>-master-0
            rank = str(self.rank(job, task, index))
            world = total * (int(nproc) if nproc.isdigit() and nproc.isascii() else 1)
            pairs += [("MASTER_PORT", port), ("PET_MASTER_PORT", port), ("MASTER_ADDR", address)]
            pairs += [("PET_MASTER_ADDR", address), ("WORLD_SIZE", str(world))]
            pairs += [("RANK", rank), ("PET_NODE_RANK", rank)]
        if nproc:
            pairs.append(("PET_NPROC_PER_NODE", nproc))
        if values["elastic"]:
            pairs += self._elastic(job, task, index, addressing)
        else:
            pairs.append(("PET_NNODES", str(total)))
        return pairs

    def _elastic(self, job: Job, task: Task, index: int, addressing: Addressing) -> list[tuple[str, str]]:
        values = self.values
        host = str(values["rdzv-host"])
        worker = job.task(self.worker) if self.worker else None
        port = int(values["rdzv-port"])
        if not host and worker is not None:
            host, port = addressing.service(job, worker, 0), addressing.port(job, port)  # <job>-worker-0
        pairs = [("PET_RDZV_ENDPOINT", f"{host}:{port}"), ("PET_RDZV_BACKEND", str(values["rdzv-backend"]))]
        pairs.append(("PET_NNODES", f"{values['min-replicas']}:{values['max-replicas']}"))
        if values["max-restarts"] is not None:
            pairs.append(("PET_MAX_RESTARTS", str(values["max-restarts"])))
        if values["elastic-nproc-per-node"] is not None:
            pairs.append(("PET_NPROC_PER_NODE", str(values["elastic-nproc-per-node"])))
        if values["rdzv-id"]:
            pairs.append(("PET_RDZV_ID", str(values["rdzv-id"])))
        conf = [str(values["rdzv-conf"])] if values["rdzv-conf"] else []
        if not values["rdzv-host"] and not isinstance(addressing, ClusterAddressing):
            conf.append(f"is_host={int(task is worker and index == 0)}")
        if conf:
            pairs.append(("PET_RDZV_CONF", ",".join(conf)))
        if values["standalone"]:
            pairs.append(("PET_STANDALONE", ""))
        return pairs

    def on_pod_create(self, ctx: PodContext) -> None:
        pairs = self.env(ctx.job, ctx.task, ctx.index, ctx.addressing)
        if pairs:
            for container in ctx.spec.get("containers", []):
                envset.append(container, pairs)

    def readdress(self, job: Job, pods: list[PodContext], was: Addressing) -> bool:
        return envset.readdress(self.env, job, pods, was, lambda ctx: list(ctx.spec.get("containers", [])))

    def ports(self, job: Job) -> list[int]:
        ports = [int(self.values["port"])] if self.master else []
        if self.values["elastic"] and not self.values["rdzv-host"]:
            ports.append(int(self.values["rdzv-port"]))
        return list(dict.fromkeys(ports))

    def warnings(self, job: Job, addressing: Addressing) -> Issues:
        """A container's own entry of a variable the operator sets: the operator's comes after it
        and wins, so the one written is lost."""
        found: Issues = []
        for i, task in enumerate(job.spec.tasks):
            if not task.replicas:
                continue
            sets = {name for name, _ in self.env(job, task, 0, addressing)}
            for j, container in enumerate(task.template.containers):
                for k, var in enumerate(container.env):
                    if var.get("name") in sets:
                        message = (
                            f"the training operator sets {var['name']} after this entry, which is ignored"
                        )
                        found.append(
                            warning(f"spec.tasks[{i}].template.spec.containers[{j}].env[{k}]", message)
                        )
        return found
