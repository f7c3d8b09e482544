"""The ``svc`` plugin: a headless Service, pod hostnames, host files and host-list env.

Like Volcano it writes, per task, ``<task>.host`` (one host a line), ``VC_<TASK>_HOSTS``
(comma-separated) and ``VC_<TASK>_NUM`` into the ``<job>-svc`` ConfigMap, mounted at
``/etc/volcano``, and points every container's env at those keys.

One difference: Linux refuses a single environment string over 128 KiB in ``execve``, so a
``VC_<TASK>_HOSTS`` that would be larger (around a few thousand pods) is left out of the env and a
warning says so; the host file still holds the full list.
"""

from __future__ import annotations

from torchjob.errors import warning
from torchjob.plugins.base import Issues, Plugin, PodContext
from torchjob.plugins.flags import Flag
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.addressing import Addressing
    from torchjob.spec.model import Job, Task

CONFIG_MOUNT_PATH = "/etc/volcano"
# Linux's MAX_ARG_STRLEN: one "NAME=value\0" string passed to execve may be at most 32 pages.
MAX_ENV_STRING = 128 * 1024
MAX_CONFIGMAP_BYTES = 1024 * 1024
JOB_NAME_LABEL = "volcano.sh/job-name"
JOB_NAMESPACE_LABEL = "volcano.sh/job-namespace"


def env_key(task_name: str) -> str:
    """``my-worker`` -> ``MY_WORKER`` (Volcano's munging for env names)."""
    return task_name.replace("-", "_").upper()


def host_file(task_name: str) -> str:
    return f"{task_name.replace('-', '_')}.host"


def task_hosts(job: Job, task: Task, addressing: Addressing) -> list[str]:
    """The addresses of a task's pods; a template ``hostname`` collapses the task to one host."""
    if task.template.hostname:
        return [addressing.host(job, task, 0)] if task.replicas > 0 else []
    return [addressing.host(job, task, i) for i in range(task.replicas)]


def configmap_name(job: Job) -> str:
    return f"{job.name}-svc"


def hosts_env_too_large(task_name: str, hosts_value: str) -> bool:
    name = f"VC_{env_key(task_name)}_HOSTS"
    return len(name) + 1 + len(hosts_value.encode()) + 1 > MAX_ENV_STRING


class SvcPlugin(Plugin):
    name = "svc"
    flags = (
        Flag("publish-not-ready-addresses", bool, False),  # pod addresses are published before ready
        Flag("disable-network-policy", bool, False),  # no NetworkPolicy for the job
        Flag("inject-hosts-env", bool, True),  # VC_<TASK>_HOSTS and VC_<TASK>_NUM in every container
    )

    def __init__(self, args: list[str]) -> None:
        super().__init__(args)
        self._for: tuple[Job, Addressing] | None = None
        self._data: dict[str, str] = {}
        self._omitted: set[str] = set()
        self._env: list[str] = []

    def _prepare(self, job: Job, addressing: Addressing) -> None:
        """Compute the host lists once per job (and addressing), not once per pod."""
        if self._for is not None and self._for[0] is job and self._for[1] is addressing:
            return
        data: dict[str, str] = {}
        omitted: set[str] = set()
        env: list[str] = []
        for task in job.spec.tasks:
            hosts = task_hosts(job, task, addressing)
            key = env_key(task.name)
            data[host_file(task.name)] = "\n".join(hosts)
            data[f"VC_{key}_HOSTS"] = ",".join(hosts)
            data[f"VC_{key}_NUM"] = str(len(hosts))
            if hosts_env_too_large(task.name, data[f"VC_{key}_HOSTS"]):
                omitted.add(task.name)
            else:
                env.append(f"VC_{key}_HOSTS")
            env.append(f"VC_{key}_NUM")
        self._data, self._omitted = data, omitted
        self._env = env if self.values["inject-hosts-env"] else []
        self._for = (job, addressing)

    def host_data(self, job: Job, addressing: Addressing) -> dict[str, str]:
        """The ConfigMap data: per task, the host file, ``VC_<TASK>_HOSTS`` and ``VC_<TASK>_NUM``."""
        self._prepare(job, addressing)
        return self._data

    def warnings(self, job: Job, addressing: Addressing) -> Issues:
        data = self.host_data(job, addressing)
        issues: Issues = []
        if self.values["inject-hosts-env"]:
            for i, task in enumerate(job.spec.tasks):
                if task.name in self._omitted:
                    size = len(data[f"VC_{env_key(task.name)}_HOSTS"])
                    message = (
                        f"VC_{env_key(task.name)}_HOSTS would be {size} bytes, over Linux's 128 KiB "
                        "limit for one environment string, so it is left out of the env; read "
                        f"{CONFIG_MOUNT_PATH}/{host_file(task.name)} instead"
                    )
                    issues.append(warning(f"spec.tasks[{i}].replicas", message))
        total = sum(len(k) + len(v.encode()) for k, v in data.items())
        if total > MAX_CONFIGMAP_BYTES:
            message = (
                f"the {configmap_name(job)} ConfigMap would be {total} bytes; Kubernetes refuses "
                "ConfigMaps over 1 MiB, so this job cannot run on a cluster with the svc plugin"
            )
            issues.append(warning("spec.tasks", message))
        return issues

    def on_pod_create(self, ctx: PodContext) -> None:
        job, spec = ctx.job, ctx.spec
        if not spec.get("hostname"):
            spec["hostname"] = ctx.pod["metadata"]["name"]
        if not spec.get("subdomain"):
            spec["subdomain"] = job.name
        cm = configmap_name(job)
        self._prepare(job, ctx.addressing)
        names = self._env
        for container in ctx.all_containers():
            if names:
                container.setdefault("env", []).extend(
                    [{"name": n, "valueFrom": {"configMapKeyRef": {"name": cm, "key": n}}} for n in names]
                )
            container.setdefault("volumeMounts", []).append({"name": cm, "mountPath": CONFIG_MOUNT_PATH})
        spec.setdefault("volumes", []).append({"name": cm, "configMap": {"name": cm}})

    def readdress(self, job: Job, pods: list[PodContext], was: Addressing) -> bool:
        """The host lists live in the ConfigMap (``job_objects`` makes it anew); only which
        ``VC_<TASK>_HOSTS`` fit in the env can change with the addresses' lengths: then each
        container's block of the plugin's entries is replaced."""
        if not pods:
            return True
        self._prepare(job, was)
        old = [self._env_entry(job, n) for n in self._env]
        self._prepare(job, pods[0].addressing)
        new = [self._env_entry(job, n) for n in self._env]
        if old == new:
            return True
        if not old:
            return False  # nothing to find the block by
        for ctx in pods:
            for container in ctx.all_containers():
                env = container.get("env") or []
                at = _block_at(env, old)
                if at is None:
                    return False
                env[at : at + len(old)] = [_copy_entry(e) for e in new]
        return True

    @staticmethod
    def _env_entry(job: Job, name: str) -> dict[str, Any]:
        return {"name": name, "valueFrom": {"configMapKeyRef": {"name": configmap_name(job), "key": name}}}

    def config_mounts(self, job: Job) -> dict[str, str]:
        return {CONFIG_MOUNT_PATH: configmap_name(job)}

    def job_objects(self, job: Job, addressing: Addressing) -> list[dict[str, Any]]:
        selector = {JOB_NAME_LABEL: job.name, JOB_NAMESPACE_LABEL: job.metadata.namespace}
        objects: list[dict[str, Any]] = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": configmap_name(job), "namespace": job.metadata.namespace},
                "data": dict(self.host_data(job, addressing)),
            },
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": job.name, "namespace": job.metadata.namespace},
                "spec": {
                    "clusterIP": "None",
                    "selector": dict(selector),
                    "publishNotReadyAddresses": bool(self.values["publish-not-ready-addresses"]),
                },
            },
        ]
        if not self.values["disable-network-policy"]:
            objects.append(
                {
                    "apiVersion": "networking.k8s.io/v1",
                    "kind": "NetworkPolicy",
                    "metadata": {"name": job.name, "namespace": job.metadata.namespace},
                    "spec": {
                        "podSelector": {"matchLabels": dict(selector)},
                        "ingress": [{"from": [{"podSelector": {"matchLabels": dict(selector)}}]}],
                        "policyTypes": ["Ingress"],
                    },
                }
            )
        return objects


def _block_at(env: list[dict[str, Any]], block: list[dict[str, Any]]) -> int | None:
    """Where ``block`` last occurs in ``env`` as a run of entries; None when it does not."""
    for at in range(len(env) - len(block), -1, -1):
        if env[at] == block[0] and env[at : at + len(block)] == block:
            return at
    return None


def _copy_entry(entry: dict[str, Any]) -> dict[str, Any]:
    ref = entry["valueFrom"]["configMapKeyRef"]
    return {"name": entry["name"], "valueFrom": {"configMapKeyRef": dict(ref)}}
