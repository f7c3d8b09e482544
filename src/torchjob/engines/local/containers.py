"""A container as the local engine runs it, and what it is made from.

:class:`ContainerRun` is one container ready to start (argv, env, working directory, the hook
that runs in the child before the program); :class:`PodSetup` is what the engine knows of one pod
attempt when it resolves the pod's containers (:mod:`.resolve`), and :class:`ResolveError` a
container that cannot run here, with the field at fault. The resolution's parts: the environment
(:mod:`.envvars`), the volume mounts (:mod:`.mounts`); what cannot run locally is found before
anything starts (:mod:`.localcheck`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torchjob.expand import DesiredState, PodPlan

# PYTHON: a command that runs this interpreter (sys.executable), the rule every engine shares.
from torchjob.pyrunner.pycommand import PYTHON as PYTHON
from torchjob.records import field, record


class ResolveError(Exception):
    """A container cannot run locally; ``field`` is the path inside the container."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@record
class PodSetup:
    """What the engine knows of one pod attempt, for resolving its containers."""

    plan: PodPlan
    address: str
    uid: str
    configmaps: dict[str, dict[str, str]]
    configmap_dir: Path  # ConfigMap volumes are <configmap_dir>/<name>/<key>
    pod_dir: Path  # emptyDir volumes are <pod_dir>/volumes/<name>
    base_env: dict[str, str] = field(default_factory=dict)  # the engine's own variables
    extra_env: dict[str, str] = field(default_factory=dict)
    gpu_env: dict[str, dict[str, str]] = field(default_factory=dict)  # per container name: gpus.py


@record
class ContainerRun:
    """One container, ready to start."""

    name: str
    image: str
    init: bool
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    before_exec: Callable[[], None] | None = None  # run in the child before the program
    helper: bool = False  # an init container a plugin added (wait-for-master): nudged (nudge.py)


def configmaps_of(state: DesiredState) -> dict[str, dict[str, str]]:
    return {
        str(obj["metadata"]["name"]): {str(k): str(v) for k, v in (obj.get("data") or {}).items()}
        for obj in state.objects
        if obj.get("kind") == "ConfigMap"
    }
