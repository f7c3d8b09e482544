"""The ``pytorch`` plugin: ports, rendezvous env and the wait-for-master init container.

Semantics follow Volcano's plugin; where Volcano silently does nothing (no master task) or does
something wrong (every master pod gets ``RANK=0``), torchjob reports an error instead.
"""

from __future__ import annotations

from typing import Any

from torchjob.plugins.base import Issues, Plugin, PodContext
from torchjob.plugins.flags import Flag, non_negative, port_range
from torchjob.plugins.waitmaster import wait_for_master_script
from torchjob.spec import names
from torchjob.spec.model import Job

DEFAULT_PORT = 23456
DEFAULT_WAIT_TIMEOUT = 300
DEFAULT_WAIT_IMAGE = "busybox:1.36.1"
PORT_NAME = "pytorchjob-port"
WAIT_CONTAINER = "wait-for-master"


def _image(value: Any) -> str | None:
    return None if names.is_image_reference(value) else f"{value!r} is not a valid image reference"


def _task_name(value: Any) -> str | None:
    return None if names.is_dns1123_label(value) else names.label_problem(value)


class PyTorchPlugin(Plugin):
    name = "pytorch"
    flags = (
        Flag("master", str, "master", "name of the master task", _task_name),
        Flag("worker", str, "worker", "name of the worker task", _task_name),
        Flag("port", int, DEFAULT_PORT, "port the master listens on", port_range),
        Flag("wait-master-enabled", bool, False, "add an init container that waits for the master"),
        Flag(
            "wait-master-timeout", int, DEFAULT_WAIT_TIMEOUT, "seconds to wait for the master", non_negative
        ),
        Flag("wait-master-image", str, DEFAULT_WAIT_IMAGE, "image of the wait-for-master container", _image),
    )

    @property
    def master(self) -> str:
        return str(self.values["master"])

    @property
    def worker(self) -> str:
        return str(self.values["worker"])

    @property
    def port(self) -> int:
        return int(self.values["port"])

    def world_size(self, job: Job) -> int:
        return sum(t.replicas for t in job.spec.tasks if t.name in (self.master, self.worker))

    def check(self, job: Job) -> Issues:
        issues: Issues = []
        task_names = [t.name for t in job.spec.tasks]
        if self.master == self.worker:
            issues.append(("spec.plugins.pytorch", f"--master and --worker both name task {self.master!r}"))
        if self.master not in task_names:
            issues.append(
                (
                    "spec.plugins.pytorch",
                    f"--master names task {self.master!r} but the job has no such task (tasks: {', '.join(task_names)})",
                )
            )
        else:
            index = task_names.index(self.master)
            replicas = job.spec.tasks[index].replicas
            if replicas != 1:
                issues.append(
                    (
                        f"spec.tasks[{index}].replicas",
                        f"the pytorch master task must have exactly 1 replica (rank 0), got {replicas}",
                    )
                )
        others = [n for n in task_names if n != self.master]
        if self.worker not in task_names and others:
            issues.append(
                (
                    "spec.plugins.pytorch",
                    f"--worker names task {self.worker!r} but the job has no such task (tasks: {', '.join(task_names)})",
                )
            )
        return issues + self._port_name_clashes(job)

    def _port_name_clashes(self, job: Job) -> Issues:
        """Containers that name another port ``pytorchjob-port``: Volcano would add a second
        port of that name, and Kubernetes refuses a pod whose port names repeat."""
        issues: Issues = []
        for i, task in enumerate(job.spec.tasks):
            for j, container in enumerate(task.template.containers):
                ports = container.ports
                if any(p.get("containerPort") == self.port for p in ports):
                    continue  # the plugin adds nothing to this container
                for k, port in enumerate(ports):
                    if port.get("name") == PORT_NAME:
                        issues.append(
                            (
                                f"spec.tasks[{i}].template.spec.containers[{j}].ports[{k}].name",
                                f"port {port.get('containerPort')} is named {PORT_NAME!r}, the name the pytorch "
                                f"plugin gives port {self.port}; rename it or use --port={port.get('containerPort')}",
                            )
                        )
        return issues

    def on_pod_create(self, ctx: PodContext) -> None:
        job = ctx.job
        master = job.task(self.master)
        if master is None:  # rejected by check(); nothing to wire
            return
        master_addr = ctx.addressing.host(job, master, 0)
        master_port = ctx.addressing.port(job, self.port)
        env: list[dict[str, Any]] = [
            {"name": "MASTER_ADDR", "value": master_addr},
            {"name": "MASTER_PORT", "value": str(master_port)},
            {"name": "WORLD_SIZE", "value": str(self.world_size(job))},
        ]
        if ctx.task.name == self.worker:
            env.append({"name": "RANK", "value": str(ctx.index + 1)})
        elif ctx.task.name == self.master:
            env.append({"name": "RANK", "value": "0"})
        for container in ctx.spec.get("containers", []):
            ports = container.setdefault("ports", [])
            if not any(p.get("containerPort") == self.port for p in ports):
                ports.append({"name": PORT_NAME, "containerPort": self.port})
            container.setdefault("env", []).extend(dict(e) for e in env)
        if ctx.task.name == self.worker and self.values["wait-master-enabled"]:
            init = ctx.spec.setdefault("initContainers", [])
            if not any(c.get("name") == WAIT_CONTAINER for c in init):
                script = wait_for_master_script(
                    master_addr, master_port, int(self.values["wait-master-timeout"])
                )
                init.append(
                    {
                        "name": WAIT_CONTAINER,
                        "image": self.values["wait-master-image"],
                        "command": ["sh", "-c", script],
                    }
                )
