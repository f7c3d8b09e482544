"""Job plugins with Volcano's names, flags and semantics, applied in a fixed order.

Volcano applies a job's plugins in Go map order, which is random, so whether one plugin sees
what another added differs from pod to pod. torchjob always applies them in
:data:`PLUGIN_ORDER`, whatever order the job lists them in:

1. ``pytorch``: rendezvous env, the master port, and the ``wait-for-master`` init container;
2. ``svc``: hostname and subdomain, the ``VC_<TASK>_HOSTS``/``VC_<TASK>_NUM`` env and the
   ``/etc/volcano`` host files, on every container and init container present by then;
3. ``env``: ``VK_TASK_INDEX`` and ``VC_TASK_INDEX`` on every container and init container.

So the ``wait-for-master`` container also gets the host list, the mount and the task index.
"""

from __future__ import annotations

from torchjob.errors import Issue
from torchjob.plugins.base import Issues, Plugin, PodContext
from torchjob.plugins.env import EnvPlugin
from torchjob.plugins.pytorch import PyTorchPlugin
from torchjob.plugins.svc import SvcPlugin
from torchjob.spec.model import Job
from torchjob.spec.source import child

PLUGINS: dict[str, type[Plugin]] = {
    PyTorchPlugin.name: PyTorchPlugin,
    SvcPlugin.name: SvcPlugin,
    EnvPlugin.name: EnvPlugin,
}
PLUGIN_ORDER = ("pytorch", "svc", "env")

__all__ = ["PLUGINS", "PLUGIN_ORDER", "Plugin", "PodContext", "build_plugins", "check_plugins"]


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
