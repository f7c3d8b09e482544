"""Settings that more than one engine declares, declared once (engines may not import each other).

Light on purpose: every command lists the engines' settings, which imports this module.
"""

from __future__ import annotations

from torchjob.engine_api.base import Setting


def max_restarts(commands: tuple[str, ...] = ("run",)) -> Setting:
    """``--max-restarts N``, which the controller enforces on every engine that runs pods itself."""
    return Setting(
        "max_restarts",
        "fail the job once a pod's containers restarted more than N times (local and slurm "
        "engines; Kubernetes restarts without limit)",
        type="int",
        metavar="N",
        minimum=0,
        invalid="expected a number of restarts of 0 or more, got {value}",
        commands=commands,
    )
