"""Job plugins with Volcano's names, flags and semantics, applied in a fixed order.

Volcano applies a job's plugins in Go map order, which is random, so whether one plugin sees
what another added differs from pod to pod. torchjob always applies them in
:data:`PLUGIN_ORDER`, whatever order the job lists them in:

1. ``pytorch``: rendezvous env, the master port, and the ``wait-for-master`` init container;
2. ``svc``: hostname and subdomain, the ``VC_<TASK>_HOSTS``/``VC_<TASK>_NUM`` env and the
   ``/etc/volcano`` host files, on every container and init container present by then;
3. ``env``: ``VK_TASK_INDEX`` and ``VC_TASK_INDEX`` on every container and init container.

So the ``wait-for-master`` container also gets the host list, the mount and the task index.

A job read from another kind (spec/kinds/) has its controller's plugin instead: ``kubeflow`` (the
training operator's env for a PyTorchJob), ``trainer`` (Kubeflow Trainer's ``PET_*`` for a
TrainJob's nodes) and ``jobset`` (what JobSet and the Job controller put on each pod), applied
after ``pytorch`` and before ``svc``.
"""

from __future__ import annotations

from torchjob.errors import Issue
from torchjob.plugins.base import Issues, Plugin, PodContext
from torchjob.plugins.env import EnvPlugin
from torchjob.plugins.jobset import JobSetPlugin
from torchjob.plugins.kubeflow import KubeflowPlugin
from torchjob.plugins.pytorch import PyTorchPlugin
from torchjob.plugins.svc import SvcPlugin
from torchjob.plugins.trainer import TrainerPlugin
from torchjob.spec.model import Job
from torchjob.spec.source import child

PLUGINS: dict[str, type[Plugin]] = {
    PyTorchPlugin.name: PyTorchPlugin,
    KubeflowPlugin.name: KubeflowPlugin,
    TrainerPlugin.name: TrainerPlugin,
    JobSetPlugin.name: JobSetPlugin,
    SvcPlugin.name: SvcPlugin,
    EnvPlugin.name: EnvPlugin,
}
PLUGIN_ORDER = ("pytorch", "kubeflow", "trainer", "jobset", "svc", "env")
# The plugins of a controller other than Volcano's: a job with one was read from that kind.
CONTROLLER_PLUGINS = ("kubeflow", "trainer", "jobset")

__all__ = [
    "CONTROLLER_PLUGINS",
    "PLUGINS",
    "PLUGIN_ORDER",
    "Plugin",
    "PodContext",
    "build_plugins",
    "check_plugins",
]


def build_plugins(job: Job) -> list[Plugin]:
    """The job's known plugins, built from their flags, in PLUGIN_ORDER."""
    return [PLUGINS[name](job.spec.plugins[name]) for name in PLUGIN_ORDER if name in job.spec.plugins]


def check_plugins(job: Job, *, tasks_ok: bool = True) -> Issues:
    """Unknown plugins, bad flags and each plugin's own checks (those need tasks that parsed)."""
    issues: Issues = []
    for name in job.spec.plugins:
        if name not in PLUGINS:
            issues.append(
                Issue(
                    child("spec.plugins", name),  # quoted when not a plain key: no newline in a path
                    f"unknown plugin {name!r}; torchjob supports {', '.join(sorted(PLUGINS))}",
                )
            )
    for plugin in build_plugins(job):
        issues += [Issue(f"spec.plugins.{plugin.name}", err) for err in plugin.flag_errors]
        if not plugin.flag_errors and tasks_ok:
            issues += plugin.check(job)
    return issues
