"""What ``torchjob queue`` shows: capacity, what is free, the queues, every job that holds or waits.

The capacity is the one the jobs are admitted against, which each recorded in its entry (the
latest registered job's, and a note when jobs were given different ones), not what this command's
own environment would find; with no job queued, the capacity this command would give a job. When
another process holds the queue's lock, the state as last written is shown, with who holds it.
"""

from __future__ import annotations

from collections.abc import Mapping

from torchjob.engines.local.admission.amounts import GPU, RESOURCES, Amounts, fmt, total
from torchjob.engines.local.admission.capacity import Capacity, machine_capacity
from torchjob.engines.local.admission.decision import Scene
from torchjob.engines.local.admission.lock import Busy
from torchjob.engines.local.admission.place import locate
from torchjob.engines.local.admission.settings import DEFAULT_QUEUE, Settings, load_settings
from torchjob.engines.local.admission.store import live_jobs, locked_state, peek, rebuilding
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.engine_api.base import QueuedJob, QueueInfo, QueueListing

LISTING_WAIT = 1.0  # then the state as last written is shown, read without the lock


def queue_listing(settings: Settings | None = None) -> QueueListing:
    from torchjob.engine_api.base import QueueListing

    settings = settings or load_settings()
    where = locate()
    notes = []
    try:
        with locked_state(wait=LISTING_WAIT) as data:  # written: dead entries are dropped for good
            jobs = live_jobs(data)
    except Busy as err:
        data = peek()
        jobs = live_jobs(data)
        notes.append(f"{err.reason}: shown as last written")
    why = rebuilding(data)
    if why:
        notes.append(why)
    capacity, disagree = _capacity(jobs, settings)
    if disagree:
        notes.append(f"the jobs were admitted against different capacities: {disagree}")
    scene = Scene(jobs, capacity, settings)
    rows = _rows(jobs, scene, shared=where.shared)
    return QueueListing(
        capacity={k: fmt(k, capacity.amounts.get(k, 0.0)) for k in RESOURCES},
        free={k: fmt(k, max(0.0, scene.free.get(k, 0.0))) for k in RESOURCES},
        source=capacity.source + (f"; settings {settings.source}" if settings.source else ""),
        queues=_queues(rows, settings),
        jobs=rows,
        where=f"{where.path} ({f'shared by group {_group(where.gid)}' if where.shared else 'yours alone'})",
        notes=notes,
    )


def _capacity(jobs: Mapping[str, Mapping[str, Any]], settings: Settings) -> tuple[Capacity, str]:
    """The capacity the latest job was admitted against, and the others' when they differ."""
    seen: list[tuple[int, Amounts, str]] = []
    for entry in jobs.values():
        given = entry.get("capacity")
        if not isinstance(given, dict) or not isinstance(given.get("amounts"), dict):
            continue  # an entry of an older torchjob
        amounts = {
            k: float(v) for k, v in given["amounts"].items() if k in RESOURCES and isinstance(v, int | float)
        }
        seen.append((int(entry.get("seq", 0)), amounts, str(given.get("source", ""))))
    if not seen:
        wants_gpus = any(GPU in p for e in jobs.values() for p in (e.get("pods") or {}).values())
        return machine_capacity(settings, wants_gpus), ""
    seen.sort(key=lambda s: s[0])
    _, amounts, source = seen[-1]
    devices = tuple(str(i) for i in range(int(amounts.get(GPU, 0.0))))  # counted, never handed out here
    distinct = {_text(a) for _, a, _ in seen}
    disagree = "; ".join(sorted(distinct)) if len(distinct) > 1 else ""
    return Capacity(amounts, devices, f"as the jobs were given: {source}"), disagree


def _text(amounts: Amounts) -> str:
    return ", ".join(f"{fmt(k, amounts[k])} {k}" for k in RESOURCES if k in amounts)


def _rows(jobs: Mapping[str, Mapping[str, Any]], scene: Scene, shared: bool) -> list[QueuedJob]:
    from torchjob.engine_api.base import QueuedJob

    running = sorted((e for e in jobs.values() if e.get("admitted")), key=lambda e: int(e.get("order", 0)))
    rows = []
    for entry, state in [*((e, "Running") for e in running), *((e, "Waiting") for e in scene.waiting())]:
        pods = entry.get("pods") or {}
        keys = list(entry.get("granted") or {}) if state == "Running" else list(entry.get("gang") or [])
        held = total(pods, [k for k in keys if k in pods])
        rows.append(
            QueuedJob(
                id=str(entry.get("job")),
                name=str(entry.get("name")),
                queue=str(entry.get("queue")),
                priority=int(entry.get("priority", 0)),
                state=state,
                requests={k: fmt(k, held[k]) for k in RESOURCES if held.get(k)},
                reason=str(entry.get("reason") or ""),
                since=float(entry.get("at") or 0) or None,
                user=_user(int(entry.get("uid", -1))) if shared else "",
            )
        )
    return rows


def _queues(rows: list[QueuedJob], settings: Settings) -> list[QueueInfo]:
    from torchjob.engine_api.base import QueueInfo

    names = [DEFAULT_QUEUE, *(q for q in settings.queues if q != DEFAULT_QUEUE)]
    names += sorted({r.queue for r in rows} - set(names))
    return [
        QueueInfo(
            name=q,
            weight=settings.queue(q).weight,
            capability={k: fmt(k, v) for k, v in settings.queue(q).capability.items()},
            running=sum(1 for r in rows if r.queue == q and r.state == "Running"),
            waiting=sum(1 for r in rows if r.queue == q and r.state == "Waiting"),
        )
        for q in names
    ]


def _user(uid: int) -> str:
    import pwd

    if uid < 0:
        return "?"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
