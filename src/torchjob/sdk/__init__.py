"""torchjob's Python SDK: Flyte-style ``PyTorch`` and ``Elastic`` tasks and workflows that run as real jobs.

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
from torchjob.sdk.promise import Promise, WorkflowError
from torchjob.sdk.results import RemoteError, TaskFailed
from torchjob.sdk.task import Task, task
from torchjob.sdk.workflow import Workflow, workflow

__all__ = [
    "CleanPodPolicy",
    "Elastic",
    "Master",
    "Promise",
    "PyTorch",
    "RemoteError",
    "Resources",
    "RestartPolicy",
    "RunPolicy",
    "Task",
    "TaskFailed",
    "Worker",
    "Workflow",
    "WorkflowError",
    "task",
    "workflow",
]
