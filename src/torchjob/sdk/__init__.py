"""torchjob's Python SDK: Flyte-style ``PyTorch`` and ``Elastic`` tasks that run as real jobs.

Importing this package never imports torch; torch is loaded only when a task is launched.
"""

from torchjob.sdk.config import (
    CleanPodPolicy,
    Elastic,
    Master,
    PyTorch,
    Resources,
    RestartPolicy,
    RunPolicy,
    Worker,
)
from torchjob.sdk.results import RemoteError, TaskFailed
from torchjob.sdk.task import Task, task

__all__ = [
    "CleanPodPolicy",
    "Elastic",
    "Master",
    "PyTorch",
    "RemoteError",
    "Resources",
    "RestartPolicy",
    "RunPolicy",
    "Task",
    "TaskFailed",
    "Worker",
    "task",
]
