"""The ``env`` plugin: each pod's index in its task as ``VK_TASK_INDEX`` and ``VC_TASK_INDEX``."""

from __future__ import annotations

from torchjob.plugins.base import Plugin, PodContext


class EnvPlugin(Plugin):
    name = "env"

    def on_pod_create(self, ctx: PodContext) -> None:
        index = str(ctx.index)
        for container in ctx.all_containers():
            env = container.setdefault("env", [])
            env.append({"name": "VK_TASK_INDEX", "value": index})
            env.append({"name": "VC_TASK_INDEX", "value": index})
