"""The probes a pod declares, which the process engines' kubelet does not run: said as warnings.

On a cluster a container is ready once its readiness probe passes, and what waits for readiness
(``dependsOn``, ``minAvailable``, JobSet's in-order start) waits for that; a failing liveness probe
restarts the container. The local and Slurm engines run no probe: a started container counts as
ready at once, and nothing restarts a container for being unhealthy. A job ported from a cluster
that counts on either behaves differently here, so each probe is named once, at its field.
"""

from __future__ import annotations

from torchjob.errors import Issue, warning
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from torchjob.spec.model import Job

_READY_AT_START = "not run here: a pod counts as ready once its containers have started"
UNPROBED = {
    "startupProbe": _READY_AT_START,
    "readinessProbe": _READY_AT_START + " (what waits for it starts earlier than on a cluster)",
    "livenessProbe": "not run here: a container is not restarted for failing it",
}


def probe_warnings(job: Job) -> list[Issue]:
    """A warning for each probe of each container of ``job``, at its field path."""
    found: list[Issue] = []
    for t, task in enumerate(job.spec.tasks):
        for kind in ("initContainers", "containers"):
            for i, container in enumerate(task.template.spec.get(kind) or []):
                if not isinstance(container, dict):
                    continue
                for probe, message in UNPROBED.items():
                    if container.get(probe) is not None:
                        found.append(warning(f"spec.tasks[{t}].template.spec.{kind}[{i}].{probe}", message))
    return found
