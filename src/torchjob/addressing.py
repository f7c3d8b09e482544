"""How one pod of a job reaches another: asked by plugins, provided by an engine.

On a cluster a pod is reached by its DNS name (``<hostname>.<subdomain>``) and a port belongs to
the pod. On one machine the local engine gives each pod a loopback address and maps the job's
ports to free host ports, the way a container runtime would. Plugins never decide this themselves,
so one plugin serves every engine.
"""

from __future__ import annotations

from torchjob.spec.model import Job, Task, pod_name
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Protocol


# For the type checker only: an engine's addressing matches it by shape.
if TYPE_CHECKING:

    class Addressing(Protocol):
        def host(self, job: Job, task: Task, index: int) -> str:
            """The address other pods use to reach pod ``index`` of ``task``."""
            ...

        def port(self, job: Job, port: int) -> int:
            """The port number processes use for a port the job declares for its pods."""
            ...

        def service(self, job: Job, task: Task, index: int) -> str:
            """The address of a Service made for pod ``index`` of ``task`` alone, named as the pod
            (the Kubeflow training operator's ``<job>-<type>-<i>``), where such a name resolves;
            elsewhere the pod's own address (``host``)."""
            ...


class ClusterAddressing:
    """Volcano's addressing: ``<hostname|job-task-i>.<subdomain|job>`` and ports as declared."""

    def host(self, job: Job, task: Task, index: int) -> str:
        hostname = task.template.hostname or pod_name(job.name, task.name, index)
        subdomain = task.template.subdomain or job.name
        return f"{hostname}.{subdomain}"

    def port(self, job: Job, port: int) -> int:
        return port

    def service(self, job: Job, task: Task, index: int) -> str:
        # The objects torchjob renders make no Service per pod (the operator does, for its own
        # PyTorchJob): the pod's DNS name, which the job's headless Service makes.
        return self.host(job, task, index)
