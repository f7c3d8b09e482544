"""Defaults as Volcano's mutating webhook applies them on job creation.

Order matters and follows the webhook: queue, scheduler, maxRetry, tasks, job minAvailable
(computed from the defaulted task values), plugins.
"""

from __future__ import annotations

from torchjob.spec.model import Job

DEFAULT_QUEUE = "default"
DEFAULT_SCHEDULER = "volcano"
DEFAULT_MAX_RETRY = 3
DEFAULT_TASK_PREFIX = "default"
# Plugins that need the svc plugin's Service and host files; the webhook turns svc on for them.
PLUGINS_NEEDING_SVC = ("tensorflow", "mpi", "pytorch", "ray")


def apply_defaults(job: Job) -> Job:
    """Fill in the webhook's defaults, in place; returns the same job for chaining."""
    spec = job.spec
    if not spec.queue:
        spec.queue = DEFAULT_QUEUE
    if not spec.scheduler_name:
        spec.scheduler_name = DEFAULT_SCHEDULER
        spec.scheduler_defaulted = True
    if spec.max_retry == 0:  # like the webhook, an explicit 0 also becomes 3
        spec.max_retry = DEFAULT_MAX_RETRY
    for index, task in enumerate(spec.tasks):
        if not task.name:
            task.name = f"{DEFAULT_TASK_PREFIX}{index}"
        if task.min_available is None:
            partition = task.extra.get("partitionPolicy")
            if isinstance(partition, dict) and isinstance(partition.get("minPartitions"), int):
                size = partition.get("partitionSize")
                if partition["minPartitions"] > 0 and isinstance(size, int):
                    task.min_available = partition["minPartitions"] * size
            if task.min_available is None:
                task.min_available = task.replicas
        if task.max_retry == 0:
            task.max_retry = DEFAULT_MAX_RETRY
    if spec.min_available == 0:
        spec.min_available = sum(t.min_available or 0 for t in spec.tasks)
    if spec.plugins and any(p in spec.plugins for p in PLUGINS_NEEDING_SVC):
        spec.plugins.setdefault("svc", [])
    return job
