"""torchjob: one PyTorch job description, run locally as processes or on Kubernetes.

The SDK names (``PyTorch``, ``Elastic``, ``task`` ...) are importable from here; they are loaded
lazily so that ``import torchjob`` stays cheap and never imports torch.
"""

from __future__ import annotations

from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

_SDK_NAMES = {
    "PyTorch",
    "Master",
    "Worker",
    "Elastic",
    "RunPolicy",
    "RestartPolicy",
    "CleanPodPolicy",
    "Resources",
    "task",
    "Task",
    "RemoteError",
    "workflow",
    "Workflow",
}


def __getattr__(name: str) -> Any:
    if name in _SDK_NAMES:
        from torchjob import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'torchjob' has no attribute {name!r}")
