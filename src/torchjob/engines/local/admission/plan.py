"""A job's admission plan, decided before its directory is made: what it asks, in which queue, at
which priority, against which capacity; or why it can never run here (exit 2 before anything starts).
"""

from __future__ import annotations

import os

from torchjob.engines.local.admission.amounts import EPSILON, GPU, RESOURCES, fmt, total
from torchjob.engines.local.admission.capacity import Capacity, counted, machine_capacity
from torchjob.engines.local.admission.demand import Demand, demand_of, has_requests
from torchjob.engines.local.admission.settings import (
    BUILTIN_PRIORITIES,
    DEFAULT_QUEUE,
    Settings,
    config_path,
    load_settings,
)
from torchjob.errors import Problem, SpecError
from torchjob.records import field, record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from torchjob.spec.model import Job


@record
class Plan:
    """What admission needs of one job, decided before its directory is made."""

    demand: Demand
    queue: str
    priority: int
    settings: Settings
    capacity: Capacity
    notes: list[str] = field(default_factory=list)  # said once the job is under way


def plan_for(job: Job) -> Plan | None:
    """The job's admission plan, or None when it is not queued (it asks for nothing, or
    ``TORCHJOB_QUEUE=off``). SpecError when it can never run here: more than the capacity, an
    unknown queue or priority class."""
    if os.environ.get("TORCHJOB_QUEUE", "").lower() in ("0", "off", "false", "no"):
        return None
    if not has_requests(job):
        return None
    demand = demand_of(job)
    if demand.empty:
        return None
    settings = load_settings()
    wants_gpus = any(GPU in p for p in demand.pods.values())
    capacity = machine_capacity(settings, wants_gpus)
    demand = Demand({k: counted(v, capacity) for k, v in demand.pods.items()}, demand.gang)
    if demand.empty:
        return None
    queue = job.spec.queue or DEFAULT_QUEUE
    problems = []
    if queue != DEFAULT_QUEUE and queue not in settings.queues:
        known = ", ".join(sorted({DEFAULT_QUEUE, *settings.queues}))
        problems.append(
            Problem("spec.queue", f"no local queue {queue!r} (queues: {known}; see {config_path()})")
        )
    priority = 0
    name = job.spec.priority_class_name
    if name:
        classes = {**BUILTIN_PRIORITIES, **settings.priorities}
        if name not in classes:
            known = ", ".join(sorted(classes))
            problems.append(
                Problem(
                    "spec.priorityClassName",
                    f"no priority class {name!r} (known: {known}; see {config_path()})",
                )
            )
        priority = classes.get(name, 0)
    notes = _fit(demand, queue, settings, capacity, problems)
    if problems:
        raise SpecError(problems)
    return Plan(demand, queue, priority, settings, capacity, notes)


def _fit(
    demand: Demand, queue: str, settings: Settings, capacity: Capacity, problems: list[Problem]
) -> list[str]:
    """A gang that asks more GPUs than there are could never start (a problem); more CPUs or memory
    is scaled down to all there is (a note): those can be oversubscribed, and a cluster would leave
    the job Pending for ever, which is of no use on one machine. The job then runs alone."""
    limits = dict(capacity.amounts)
    for resource, amount in settings.queue(queue).capability.items():
        limits[resource] = min(limits.get(resource, 0.0), amount)
    notes = []
    for resource in RESOURCES:
        gang = total(demand.pods, demand.gang).get(resource, 0.0)
        largest = max((p.get(resource, 0.0) for p in demand.pods.values()), default=0.0)
        most = max(gang, largest)
        limit = limits.get(resource, 0.0)
        if most <= limit + EPSILON:
            continue
        where = (
            f"queue {queue}'s capability" if most <= capacity.amounts.get(resource, 0.0) else "this machine"
        )
        # Where the amount was found, unless found by looking at the machine (said just before).
        found = "" if capacity.source == "this machine" else f" ({capacity.source})"
        has = f"{where} has {fmt(resource, limit)}{found}"
        if resource == GPU:  # a GPU cannot be shared: such a job could never start
            pods = f"{len(demand.gang)} pod{'s' if len(demand.gang) != 1 else ''}"
            problems.append(
                Problem(
                    "spec.tasks",
                    f"the job's gang ({pods}) needs {fmt(resource, gang)} {resource}; {has}: it could never "
                    "start; lower the limits or minAvailable, or run with --no-queue",
                )
            )
            continue
        scale = limit / most
        for request in demand.pods.values():
            if resource in request:
                request[resource] *= scale
        notes.append(
            f"the job asks for {fmt(resource, most)} {resource}; {has}: it is counted as taking all of "
            f"it, so it starts once nothing else holds {resource}"
        )
    return notes
