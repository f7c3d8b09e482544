"""Real flytekit tasks and workflows run through torchjob, their code unchanged.

A flytekit task with a kfpytorch ``PyTorch`` or ``Elastic`` config becomes a torchjob
:class:`~torchjob.sdk.task.Task` built from what flytekit serializes for it (``convert``); a
flytekit workflow or ``@dynamic`` task runs in this process under flytekit, with its kfpytorch
tasks run distributed by torchjob (``local``); ``commands`` serves ``torchjob run|render|validate
FILE.py:NAME`` for them. Nothing here imports flytekit: the modules below do, and only once a
flytekit object has been seen (its module is then imported already).
"""

from __future__ import annotations

import sys
from typing import Any

_FLYTE_PACKAGES = ("flytekit", "flytekitplugins")


def is_flyte(obj: Any) -> bool:
    """Whether ``obj`` is a flytekit entity (a task, workflow, or one of torchjob's own for them)."""
    if "flytekit" not in sys.modules:  # no flytekit object can exist yet
        return False
    return any(cls.__module__.split(".")[0] in _FLYTE_PACKAGES for cls in type(obj).__mro__)


def run(entity: Any, /, **inputs: Any) -> Any:
    """Run a flytekit task, workflow or ``@dynamic`` task here, its kfpytorch tasks distributed
    by torchjob; the value comes back as flytekit gives it (typed as declared)."""
    from torchjob.sdk.flyte.local import run_entity

    return run_entity(entity, inputs)


__all__ = ["is_flyte", "run"]
