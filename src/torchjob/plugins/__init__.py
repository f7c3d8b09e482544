"""Job plugins with Volcano's names, flags and semantics, applied in a fixed order.

Volcano applies plugins in Go map order, which is random; torchjob always applies them as listed
in :data:`PLUGIN_ORDER`: framework plugins first (they may add init containers), then ``svc`` and
``env``, so that the containers those add also get the host list, the ``/etc/volcano`` mount and
the task index.
"""

from __future__ import annotations

from torchjob.plugins.base import Issues, Plugin, PodContext
from torchjob.plugins.env import EnvPlugin
from torchjob.plugins.pytorch import PyTorchPlugin
from torchjob.plugins.svc import SvcPlugin
from torchjob.spec.model import Job

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


def check_plugins(job: Job) -> Issues:
    """Unknown plugins, bad flags and each plugin's own checks."""
    issues: Issues = []
    for name in job.spec.plugins:
        if name not in PLUGINS:
            issues.append((
                f"spec.plugins.{name}",
                f"unknown plugin {name!r}; torchjob supports {', '.join(sorted(PLUGINS))}",
            ))
    for plugin in build_plugins(job):
        issues += [(f"spec.plugins.{plugin.name}", err) for err in plugin.flag_errors]
        if not plugin.flag_errors:
            issues += plugin.check(job)
    return issues
