"""Env a controller's plugin gives each pod, computed from the addressing, and rewritten when the
addressing changes (``readdress``): what the ``kubeflow`` and ``trainer`` plugins share."""

from __future__ import annotations

from collections.abc import Callable

from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.addressing import Addressing
    from torchjob.plugins.base import PodContext
    from torchjob.spec.model import Job, Task

    # (job, task, index, addressing) -> the (name, value) pairs, in the order they are set
    EnvOf = Callable[[Job, Task, int, Addressing], list[tuple[str, str]]]


def append(container: dict[str, Any], pairs: list[tuple[str, str]]) -> None:
    """Append the pairs after the container's own entries (the later entry of a name wins)."""
    env = container.setdefault("env", [])
    env.extend({"name": name, "value": value} for name, value in pairs)


def upsert(container: dict[str, Any], entries: list[dict[str, Any]]) -> None:
    """Replace the entry of each name in place, or append it (Trainer's ``apply.UpsertEnvVar``)."""
    env = container.setdefault("env", [])
    for entry in entries:
        for i, old in enumerate(env):
            if isinstance(old, dict) and old.get("name") == entry["name"]:
                env[i] = entry
                break
        else:
            env.append(entry)


def readdress(
    env_of: EnvOf,
    job: Job,
    pods: list[PodContext],
    was: Addressing,
    containers: Callable[[PodContext], list[dict[str, Any]]],
) -> bool:
    """Rewrite, in each pod's ``containers``, the plugin's entries whose value came from ``was``."""
    for ctx in pods:
        old = dict(env_of(job, ctx.task, ctx.index, was))
        new = dict(env_of(job, ctx.task, ctx.index, ctx.addressing))
        changes = {name: (old[name], new[name]) for name in new if name in old and old[name] != new[name]}
        if not changes:
            continue
        for container in containers(ctx):
            left = dict(changes)
            for entry in reversed(container.get("env") or []):
                name = entry.get("name")
                if name in left:
                    before, after = left.pop(name)
                    if entry.get("value") == before:
                        entry["value"] = after
    return True
