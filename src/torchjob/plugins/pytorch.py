"""The ``pytorch`` plugin: ports, rendezvous env and the wait-for-master init container.

Semantics follow Volcano's plugin; where Volcano silently does nothing (no master task) or does
something wrong (every master pod gets ``RANK=0``), torchjob reports an error instead.
"""

from __future__ import annotations

from torchjob.errors import Issue, warning
from torchjob.plugins.base import Issues, Plugin, PodContext
from torchjob.plugins.flags import Flag, non_negative, port_range
from torchjob.spec import names
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.addressing import Addressing
    from torchjob.spec.model import Job, Task

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
        Flag("master", str, "master", _task_name),  # the master task's name
        Flag("worker", str, "worker", _task_name),  # the worker task's name
        Flag("port", int, DEFAULT_PORT, port_range),  # the port the master listens on
        Flag("wait-master-enabled", bool, False),  # an init container on workers waits for the master
        Flag("wait-master-timeout", int, DEFAULT_WAIT_TIMEOUT, non_negative),  # its seconds
        Flag("wait-master-image", str, DEFAULT_WAIT_IMAGE, _image),  # its image
    )

    def __init__(self, args: list[str]) -> None:
        super().__init__(args)
        self._cache_for: tuple[Job, Addressing] | None = None
        self._cached: tuple[str, int, str] | None = None
        self._scripts: dict[tuple[str, int], str] = {}  # wait-for-master scripts by master address and port

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
        listed = ", ".join(task_names)
        if self.master == self.worker:
            issues.append(
                Issue("spec.plugins.pytorch", f"--master and --worker both name task {self.master!r}")
            )
        if self.master not in task_names:
            message = f"--master names task {self.master!r} but the job has no such task (tasks: {listed})"
            issues.append(Issue("spec.plugins.pytorch", message))
        else:
            index = task_names.index(self.master)
            replicas = job.spec.tasks[index].replicas
            if replicas != 1:
                message = f"the pytorch master task must have exactly 1 replica (rank 0), got {replicas}"
                issues.append(Issue(f"spec.tasks[{index}].replicas", message))
        others = [n for n in task_names if n != self.master]
        if self.worker not in task_names and others:
            message = f"--worker names task {self.worker!r} but the job has no such task (tasks: {listed})"
            issues.append(Issue("spec.plugins.pytorch", message))
        return issues + self._port_name_clashes(job)

    def _port_name_clashes(self, job: Job) -> Issues:
        """Ports the user named ``pytorchjob-port`` with another number.

        Volcano would add a second port of that name, and Kubernetes refuses a container whose
        port names repeat.
        """
        issues: Issues = []
        for i, task in enumerate(job.spec.tasks):
            for j, container in enumerate(task.template.containers):
                ports = container.ports
                if any(p.get("containerPort") == self.port for p in ports):
                    continue  # the plugin adds nothing to this container
                for k, port in enumerate(ports):
                    if port.get("name") == PORT_NAME:
                        number = port.get("containerPort")
                        message = (
                            f"port {number} is named {PORT_NAME!r}, the name the pytorch plugin gives "
                            f"port {self.port}; rename it or use --port={number}"
                        )
                        issues.append(
                            Issue(f"spec.tasks[{i}].template.spec.containers[{j}].ports[{k}].name", message)
                        )
        return issues

    def _wiring(self, ctx: PodContext) -> tuple[str, int, str] | None:
        """(master address, master port, world size) of the pod's job; the same for every pod."""
        if (
            self._cache_for is None
            or self._cache_for[0] is not ctx.job
            or self._cache_for[1] is not ctx.addressing
        ):
            self._cached = self._wiring_of(ctx.job, ctx.addressing)
            self._cache_for = (ctx.job, ctx.addressing)
        return self._cached

    def _wiring_of(self, job: Job, addressing: Addressing) -> tuple[str, int, str] | None:
        master = job.task(self.master)
        if master is None:
            return None
        addr = addressing.host(job, master, 0)
        return addr, addressing.port(job, self.port), str(self.world_size(job))

    def readdress(self, job: Job, pods: list[PodContext], was: Addressing) -> bool:
        """MASTER_ADDR and MASTER_PORT (the plugin's entries: the last of each name) and the
        wait-for-master script, where they hold what ``was`` gave."""
        if not pods:
            return True
        old = self._wiring_of(job, was)
        new = self._wiring(pods[0])
        if old is None or new is None or old == new:
            return True
        (old_addr, old_port, _), (new_addr, new_port, _) = old, new
        values = {"MASTER_ADDR": (old_addr, new_addr), "MASTER_PORT": (str(old_port), str(new_port))}
        waits = self.values["wait-master-enabled"]
        old_script = self._script(old_addr, old_port) if waits else ""
        new_script = self._script(new_addr, new_port) if waits else ""
        for ctx in pods:
            for container in ctx.spec.get("containers", []):
                _replace_last(container.get("env") or [], values)
            if waits and ctx.task.name == self.worker:
                for init in ctx.spec.get("initContainers") or []:
                    if init.get("name") == WAIT_CONTAINER and init.get("command") == ["sh", "-c", old_script]:
                        init["command"] = ["sh", "-c", new_script]
        return True

    def _script(self, master_addr: str, master_port: int) -> str:
        """The wait-for-master script; one string shared by every worker pod (strings are immutable)."""
        key = (master_addr, master_port)
        if key not in self._scripts:
            # Imported here: it (and shlex) is needed only by a job with workers to wait.
            from torchjob.plugins.waitmaster import wait_for_master_script

            timeout = int(self.values["wait-master-timeout"])
            self._scripts[key] = wait_for_master_script(master_addr, master_port, timeout)
        return self._scripts[key]

    def ports(self, job: Job) -> list[int]:
        return [self.port]

    def warnings(self, job: Job, addressing: Addressing) -> Issues:
        """A container's own MASTER_ADDR, MASTER_PORT, WORLD_SIZE or RANK: the plugin appends its
        values after it, and the last entry of a name wins, so the written one is silently lost."""
        if job.task(self.master) is None:  # no wiring at all (an error of check())
            return []
        why = {
            "MASTER_ADDR": ("the master pod's address", "remove it"),
            "MASTER_PORT": (
                f"its --port ({self.port})",
                "remove it, or set the port with --port=N in spec.plugins.pytorch",
            ),
            "WORLD_SIZE": ("the number of master and worker pods", "remove it; the tasks' replicas set it"),
            "RANK": ("each pod's rank (master 0, workers 1 to N)", "remove it"),
        }
        issues: Issues = []
        for i, task in enumerate(job.spec.tasks):
            ranked = self.rank(job, task, 0) is not None
            for j, container in enumerate(task.template.containers):
                for k, var in enumerate(container.env):
                    name = var.get("name")
                    if name in why and (name != "RANK" or ranked):
                        value, fix = why[name]
                        sets = f"the pytorch plugin sets {name} to {value}"
                        message = f"{sets} after this entry, which is ignored; {fix}"
                        issues.append(
                            warning(f"spec.tasks[{i}].template.spec.containers[{j}].env[{k}]", message)
                        )
        return issues

    def rank(self, job: Job, task: Task, index: int) -> int | None:
        if job.task(self.master) is None:  # no master task: no wiring at all (see on_pod_create)
            return None
        if task.name == self.worker:
            return index + 1
        return 0 if task.name == self.master else None

    def added_init_containers(self, job: Job, task: Task) -> int:
        """The wait-for-master init container of each worker (as on_pod_create adds it)."""
        if (
            job.task(self.master) is None
            or task.name != self.worker
            or not self.values["wait-master-enabled"]
        ):
            return 0
        return 0 if WAIT_CONTAINER in task.template.init_container_names else 1

    def on_pod_create(self, ctx: PodContext) -> None:
        wiring = self._wiring(ctx)
        if wiring is None:  # no master task: rejected by check(), and Volcano does nothing either
            return
        master_addr, master_port, world_size = wiring
        number = self.rank(ctx.job, ctx.task, ctx.index)
        rank = None if number is None else str(number)
        for container in ctx.spec.get("containers", []):
            ports = container.setdefault("ports", [])
            if not any(p.get("containerPort") == self.port for p in ports):
                ports.append({"name": PORT_NAME, "containerPort": self.port})
            env = container.setdefault("env", [])
            env.append({"name": "MASTER_ADDR", "value": master_addr})
            env.append({"name": "MASTER_PORT", "value": str(master_port)})
            env.append({"name": "WORLD_SIZE", "value": world_size})
            if rank is not None:
                env.append({"name": "RANK", "value": rank})
        if ctx.task.name == self.worker and self.values["wait-master-enabled"]:
            init = ctx.spec.setdefault("initContainers", [])
            if not any(c.get("name") == WAIT_CONTAINER for c in init):
                script = self._script(master_addr, master_port)
                init.append(
                    {
                        "name": WAIT_CONTAINER,
                        "image": self.values["wait-master-image"],
                        "command": ["sh", "-c", script],
                    }
                )


def _replace_last(env: list[dict[str, Any]], values: dict[str, tuple[str, str]]) -> None:
    """The last entry of each name (the plugin's: it appends them) from its old value to its new."""
    left = dict(values)
    for entry in reversed(env):
        name = entry.get("name")
        if name in left:
            old, new = left.pop(name)
            if entry.get("value") == old:
                entry["value"] = new
            if not left:
                return
