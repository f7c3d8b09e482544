"""Admission: Volcano's scheduler for one machine. Jobs queue for CPUs, memory and GPUs and start
as a gang. A job whose pods ask for nothing is not queued at all: it takes nothing.

| module | job |
|---|---|
| ``amounts`` | the three resources, their quantities (a GPU count is a whole number, bounded) |
| ``settings`` | the settings file: queues and their weights, priority classes, reserve, capacity |
| ``demand`` | what a job asks: each pod's requests as Kubernetes counts them, and its gang |
| ``capacity`` | what the machine offers: declared, else found; each GPU's identity |
| ``plan`` | a job's plan before it is made, or why it can never run here |
| ``place`` | where the queue lives: one per machine where users share GPUs, else one per user |
| ``lock``, ``store`` | the state file under its lock: written in place, never read as empty when damaged |
| ``decision`` | the pure decision: who starts, with which pods and GPUs |
| ``ticket`` | one job's place in the queue, held by its supervisor; bookkeeping never ends a job |
| ``listing`` | what ``torchjob queue`` shows |
"""

from __future__ import annotations

import sys

from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:  # "as": names this package exports (mypy --strict)
    from torchjob.engines.local.admission.amounts import (
        GPU as GPU,
    )
    from torchjob.engines.local.admission.amounts import (
        MAX_GPUS as MAX_GPUS,
    )
    from torchjob.engines.local.admission.amounts import (
        RESOURCES as RESOURCES,
    )
    from torchjob.engines.local.admission.amounts import (
        Amounts as Amounts,
    )
    from torchjob.engines.local.admission.amounts import (
        fmt as fmt,
    )
    from torchjob.engines.local.admission.amounts import (
        total as total,
    )
    from torchjob.engines.local.admission.capacity import (
        Capacity as Capacity,
    )
    from torchjob.engines.local.admission.capacity import (
        counted as counted,
    )
    from torchjob.engines.local.admission.capacity import (
        declared_gpus as declared_gpus,
    )
    from torchjob.engines.local.admission.capacity import (
        machine_capacity as machine_capacity,
    )
    from torchjob.engines.local.admission.capacity import (
        override as override,
    )
    from torchjob.engines.local.admission.capacity import (
        parse_capacity as parse_capacity,
    )
    from torchjob.engines.local.admission.decision import (
        Verdict as Verdict,
    )
    from torchjob.engines.local.admission.decision import (
        decide as decide,
    )
    from torchjob.engines.local.admission.decision import (
        grow as grow,
    )
    from torchjob.engines.local.admission.demand import (
        Demand as Demand,
    )
    from torchjob.engines.local.admission.demand import (
        demand_of as demand_of,
    )
    from torchjob.engines.local.admission.demand import (
        pod_requests as pod_requests,
    )
    from torchjob.engines.local.admission.listing import (
        queue_listing as queue_listing,
    )
    from torchjob.engines.local.admission.lock import (
        Busy as Busy,
    )
    from torchjob.engines.local.admission.place import (
        SHARED_DIR as SHARED_DIR,
    )
    from torchjob.engines.local.admission.place import (
        Place as Place,
    )
    from torchjob.engines.local.admission.place import (
        QueueDirError as QueueDirError,
    )
    from torchjob.engines.local.admission.place import (
        locate as locate,
    )
    from torchjob.engines.local.admission.plan import (
        Plan as Plan,
    )
    from torchjob.engines.local.admission.plan import (
        plan_for as plan_for,
    )
    from torchjob.engines.local.admission.settings import (
        DEFAULT_QUEUE as DEFAULT_QUEUE,
    )
    from torchjob.engines.local.admission.settings import (
        QueueSettings as QueueSettings,
    )
    from torchjob.engines.local.admission.settings import (
        Settings as Settings,
    )
    from torchjob.engines.local.admission.settings import (
        config_path as config_path,
    )
    from torchjob.engines.local.admission.settings import (
        load_settings as load_settings,
    )
    from torchjob.engines.local.admission.store import (
        StateError as StateError,
    )
    from torchjob.engines.local.admission.store import (
        check_place as check_place,
    )
    from torchjob.engines.local.admission.store import (
        live_jobs as live_jobs,
    )
    from torchjob.engines.local.admission.store import (
        locked_state as locked_state,
    )
    from torchjob.engines.local.admission.ticket import (
        GROW_EVERY as GROW_EVERY,
    )
    from torchjob.engines.local.admission.ticket import (
        POLL as POLL,
    )
    from torchjob.engines.local.admission.ticket import (
        POLL_MAX as POLL_MAX,
    )
    from torchjob.engines.local.admission.ticket import (
        Ticket as Ticket,
    )

# Each name from the module that defines it, on first use: a caller that needs only the plan (or
# only gpus' declared capacity) does not load the state file's code, nor the listing's.
_WHERE = {
    "amounts": ("GPU", "MAX_GPUS", "RESOURCES", "Amounts", "fmt", "total"),
    "capacity": ("Capacity", "counted", "declared_gpus", "machine_capacity", "override", "parse_capacity"),
    "decision": ("Verdict", "decide", "grow"),
    "demand": ("Demand", "demand_of", "pod_requests"),
    "listing": ("queue_listing",),
    "lock": ("Busy",),
    "place": ("SHARED_DIR", "Place", "QueueDirError", "locate"),
    "plan": ("Plan", "plan_for"),
    "settings": ("DEFAULT_QUEUE", "QueueSettings", "Settings", "config_path", "load_settings"),
    "store": ("StateError", "check_place", "live_jobs", "locked_state"),
    "ticket": ("GROW_EVERY", "POLL", "POLL_MAX", "Ticket"),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    __import__(f"{__name__}.{module}")  # not importlib: the CLI does without it
    value = getattr(sys.modules[f"{__name__}.{module}"], name)
    globals()[name] = value
    return value
