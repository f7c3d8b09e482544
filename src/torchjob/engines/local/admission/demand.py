"""What a job asks of the queue: each pod's requests as Kubernetes counts them, and its gang.

A container asks its ``requests``, else its ``limits`` (GPUs: ``limits``); a pod, per resource, the
larger of its largest init container and the sum of its containers. The gang is every task's
``minAvailable`` first pods, topped up to the job's ``minAvailable``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from torchjob.engines.local import gpus
from torchjob.engines.local.admission.amounts import GPU, Amounts
from torchjob.records import record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.spec.model import Job


def _container_requests(container: Mapping[str, Any]) -> Amounts:
    """What one container asks: its requests, else its limits (Kubernetes defaults one to the other)."""
    from torchjob.spec.units import parse_quantity

    resources = container.get("resources") or {}
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    out: Amounts = {}
    for name in ("cpu", "memory"):
        value = requests.get(name, limits.get(name))
        if value is not None:
            with contextlib.suppress(ValueError):  # validation has refused bad quantities already
                out[name] = max(0.0, parse_quantity(value))
    with contextlib.suppress(ValueError):
        out[GPU] = float(gpus.requested(container))
    return {k: v for k, v in out.items() if v}


def pod_requests(spec: Mapping[str, Any]) -> Amounts:
    """A pod's requests as Kubernetes counts them: per resource, max(largest init, sum of containers)."""
    total: Amounts = {}
    for container in spec.get("containers") or []:
        for name, amount in _container_requests(container).items():
            total[name] = total.get(name, 0.0) + amount
    for container in spec.get("initContainers") or []:
        for name, amount in _container_requests(container).items():
            total[name] = max(total.get(name, 0.0), amount)
    return total


def has_requests(job: Job) -> bool:
    """Cheap first look: does any container of the job mention resources at all?"""
    for task in job.spec.tasks:
        spec = task.template.spec
        for kind in ("initContainers", "containers"):
            for container in spec.get(kind) or []:
                resources = container.get("resources") or {}
                if resources.get("requests") or resources.get("limits"):
                    return True
    return False


@record
class Demand:
    """What a job asks: each pod's requests (in pod order), and which pods form its gang."""

    pods: dict[str, Amounts]  # "task/index" -> requests
    gang: list[str]

    @property
    def empty(self) -> bool:
        return not any(self.pods.values())


def demand_of(job: Job) -> Demand:
    pods: dict[str, Amounts] = {}
    gang: list[str] = []
    rest: list[str] = []
    for task in job.spec.tasks:
        request = pod_requests(task.template.spec)
        minimum = task.replicas if task.min_available is None else min(task.min_available, task.replicas)
        for index in range(task.replicas):
            key = f"{task.name}/{index}"
            pods[key] = dict(request)
            (gang if index < minimum else rest).append(key)
    missing = max(0, job.spec.min_available - len(gang))  # the job's minAvailable tops the tasks' up
    gang += rest[:missing]
    return Demand(pods, gang)
