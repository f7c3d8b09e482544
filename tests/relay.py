"""A fifth target that exists only in the tests: a made-up ``Relay`` (``ml.example.com/v1``).

Its controller (played by the tests) runs one pod per replica of each task, labelled with
``ml.example.com/task`` and ``ml.example.com/index``, and says the job's end in ``status.state``.
Registered as the built-in ones are: its module name in ``torchjob.targets.MODULES``.
"""

from __future__ import annotations

from typing import Any

from torchjob.spec.model import Job
from torchjob.target_api.common import labelled, metadata
from torchjob.targets import Status, Target, TargetRender, TopKind

API_VERSION = "ml.example.com/v1"


def render(job: Job, runtime: str | None) -> TargetRender:
    tasks = [
        {"name": t.name, "replicas": t.replicas, "template": labelled(t.template.raw, job)}
        for t in job.spec.tasks
    ]
    relay = {"apiVersion": API_VERSION, "kind": "Relay", "metadata": metadata(job), "spec": {"tasks": tasks}}
    return TargetRender(kind="Relay", api_version=API_VERSION, objects=[relay])


def status(top: dict[str, Any]) -> Status:
    state = str((top.get("status") or {}).get("state") or "")
    return Status({"Done": "Completed", "Broken": "Failed"}.get(state), state)


TARGET = Target(
    name="relay",
    render=render,
    top=TopKind(API_VERSION, "Relay", "relays", "install the Relay operator"),
    preference=50,
    can=frozenset({"any-tasks", "no-pytorch"}),
    status=status,
    task_keys=("ml.example.com/task",),
    index_keys=("ml.example.com/index",),
)
