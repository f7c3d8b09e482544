"""Admission: Volcano's scheduler for one machine. Jobs queue for CPUs, memory and GPUs and start
as a gang.

* **Capacity**: this machine's CPUs, memory and GPUs (:mod:`.gpus`' inventory), less the user's
  ``reserve``; ``TORCHJOB_CAPACITY=cpu=8,memory=16Gi,nvidia.com/gpu=2`` replaces what is found for
  the resources it names (GPUs are then named ``0``, ``1``, ...).
* **Requests**: a pod asks what Kubernetes counts for it, per resource the larger of its largest
  init container and the sum of its containers; a container's ``requests``, else its ``limits``
  (GPUs: ``limits``). A job whose pods ask for nothing is not queued at all: it takes nothing.
* **Gang**: a job is admitted when its gang (every task's ``minAvailable`` first pods, topped up to
  the job's ``minAvailable``) fits in what is free. It then gets the whole job if that fits too,
  else the gang; its other pods are granted one by one as they fit (:meth:`Ticket.grow`).
* **Order**: higher priority first; among equals, jobs of queues that use less than their
  weight's share first; then submission order. A job that does not fit blocks the jobs behind it
  that want what it is short of, but only after it was passed ``backfill`` times (3 by default):
  small jobs may fill the gaps, yet a large job's turn comes after a bounded number of them.
* **No daemon**: the state is one JSON file beside the port registry (same directory, same
  protections), locked with ``flock``. Each waiting supervisor polls it (every 0.2 s, slowing to 1 s
  after the first seconds) and decides for itself;
  entries of dead supervisors (pid and start time) are dropped, so a killed supervisor never
  keeps its reservation.

Settings (queues, weights, capabilities, priority classes, reserve) are in a small YAML file:
:func:`config_path`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from torchjob.engines.local import gpus
from torchjob.errors import Problem, SpecError
from torchjob.records import field, record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.engine_api.base import QueueListing
    from torchjob.spec.model import Job

GPU = gpus.RESOURCE
RESOURCES = ("cpu", "memory", GPU)
STATE_FILE = "admission.json"
LOCK_FILE = "admission.lock"
LOCK_TIMEOUT = 10.0
POLL = 0.2  # seconds between a waiting supervisor's looks at the queue, at first
POLL_MAX = 1.0  # ... growing to this after a while: fifty waiting jobs cost a few % of a core
GROW_EVERY = 0.5  # seconds between tries to grant a running job's pods beyond its gang
CHECK_EVERY = 5.0  # seconds between checks that a running job's entry is still in the state file
DEFAULT_BACKFILL = 3
DEFAULT_QUEUE = "default"
# Kubernetes' built-in priority classes; others come from the settings file.
BUILTIN_PRIORITIES = {"system-cluster-critical": 2000000000, "system-node-critical": 2000001000}

Amounts = dict[str, float]


# ------------------------------------------------------------------ settings


@record
class QueueSettings:
    weight: float = 1.0
    capability: Amounts = field(default_factory=dict)  # caps on what the queue's jobs hold together


@record
class Settings:
    queues: dict[str, QueueSettings] = field(default_factory=dict)
    priorities: dict[str, int] = field(default_factory=dict)
    reserve: Amounts = field(default_factory=dict)
    backfill: int = DEFAULT_BACKFILL
    source: str = ""

    def queue(self, name: str) -> QueueSettings:
        return self.queues.get(name) or QueueSettings()


def config_path() -> Path:
    """``$TORCHJOB_CONFIG``, else ``$XDG_CONFIG_HOME/torchjob/queues.yaml``, else
    ``~/.config/torchjob/queues.yaml``."""
    explicit = os.environ.get("TORCHJOB_CONFIG")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "torchjob" / "queues.yaml"


def load_settings(path: Path | None = None) -> Settings:
    """The settings file, or the defaults when there is none; SpecError naming the field if bad."""
    path = path or config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Settings()
    except OSError as err:
        raise SpecError(
            [Problem("", f"cannot read the queue settings: {err.strerror or err}", str(path))]
        ) from None
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise SpecError([Problem("", f"not valid YAML: {err}", str(path))]) from None
    problems: list[Problem] = []

    def bad(where: str, message: str) -> None:
        problems.append(Problem(where, message, str(path)))

    settings = Settings(source=str(path))
    if data is None:
        return settings
    if not isinstance(data, dict):
        raise SpecError(
            [Problem("", "expected a mapping (queues, priorityClasses, reserve, backfill)", str(path))]
        )
    for key in data:
        if key not in ("queues", "priorityClasses", "reserve", "backfill"):
            bad(str(key), "unknown setting; expected queues, priorityClasses, reserve or backfill")
    settings.reserve = _amounts(data.get("reserve"), "reserve", bad)
    backfill = data.get("backfill", DEFAULT_BACKFILL)
    if isinstance(backfill, bool) or not isinstance(backfill, int) or backfill < 0:
        bad("backfill", f"expected a whole number of 0 or more, got {backfill!r}")
    else:
        settings.backfill = backfill
    queues = data.get("queues") or {}
    if not isinstance(queues, dict):
        bad("queues", "expected a mapping of queue names to {weight, capability}")
        queues = {}
    for name, spec in queues.items():
        where = f"queues.{name}"
        spec = spec or {}
        if not isinstance(spec, dict):
            bad(where, "expected a mapping with weight and capability")
            continue
        for key in spec:
            if key not in ("weight", "capability"):
                bad(f"{where}.{key}", "unknown field; expected weight or capability")
        weight = spec.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight < float("inf"):
            bad(f"{where}.weight", f"expected a positive number, got {weight!r}")
            weight = 1
        settings.queues[str(name)] = QueueSettings(
            float(weight), _amounts(spec.get("capability"), f"{where}.capability", bad)
        )
    classes = data.get("priorityClasses") or {}
    if not isinstance(classes, dict):
        bad("priorityClasses", "expected a mapping of class names to integer values")
        classes = {}
    for name, value in classes.items():
        if isinstance(value, bool) or not isinstance(value, int):
            bad(f"priorityClasses.{name}", f"expected an integer, got {value!r}")
            continue
        settings.priorities[str(name)] = value
    if problems:
        raise SpecError(problems)
    return settings


def _amounts(value: object, where: str, bad: Any) -> Amounts:
    """``{cpu: 2, memory: 4Gi, nvidia.com/gpu: 1}`` as numbers."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        bad(where, "expected a mapping of cpu, memory and nvidia.com/gpu to quantities")
        return {}
    from torchjob.spec.units import parse_quantity

    out: Amounts = {}
    for name, quantity in value.items():
        if name not in RESOURCES:
            bad(f"{where}.{name}", f"unknown resource; expected {', '.join(RESOURCES)}")
            continue
        try:
            amount = parse_quantity(quantity)
        except ValueError as err:
            bad(f"{where}.{name}", str(err))
            continue
        if amount < 0:
            bad(f"{where}.{name}", f"expected 0 or more, got {quantity!r}")
            continue
        out[str(name)] = amount
    return out


# ------------------------------------------------------------------ requests


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


def _has_requests(job: Job) -> bool:
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


def total(pods: Mapping[str, Amounts], keys: list[str] | None = None) -> Amounts:
    out: Amounts = {}
    for key in pods if keys is None else keys:
        for name, amount in pods[key].items():
            out[name] = out.get(name, 0.0) + amount
    return out


# ------------------------------------------------------------------ capacity


@record
class Capacity:
    amounts: Amounts
    devices: tuple[str, ...]  # GPU names, as CUDA_VISIBLE_DEVICES entries
    source: str
    by_index: bool = False

    def inventory(self) -> gpus.Inventory:
        return gpus.Inventory(self.devices, self.source, self.by_index)


def parse_capacity(text: str) -> Amounts:
    """``cpu=8,memory=16Gi,nvidia.com/gpu=2``; ValueError saying what is wrong."""
    from torchjob.spec.units import parse_quantity

    out: Amounts = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in RESOURCES:
            raise ValueError(f"expected NAME=QUANTITY with NAME one of {', '.join(RESOURCES)}, got {part!r}")
        amount = parse_quantity(value.strip())
        if amount < 0 or (name == GPU and amount != int(amount)):
            what = "a whole number" if name == GPU else "a quantity"
            raise ValueError(f"{name}: expected {what} of 0 or more, got {value!r}")
        out[name] = amount
    return out


def override() -> Amounts | None:
    """``TORCHJOB_CAPACITY`` parsed, or None when it is not set; SpecError when it is malformed."""
    text = os.environ.get("TORCHJOB_CAPACITY")
    if text is None:
        return None
    try:
        return parse_capacity(text)
    except ValueError as err:
        raise SpecError([Problem("TORCHJOB_CAPACITY", str(err), "<environment>")]) from None


def gpu_override() -> gpus.Inventory | None:
    """The GPUs ``TORCHJOB_CAPACITY`` names (``0``, ``1``, ...), or None to look at the machine."""
    given = override()
    if given is None or GPU not in given:
        return None
    return gpus.Inventory(tuple(str(i) for i in range(int(given[GPU]))), "TORCHJOB_CAPACITY")


def machine_capacity(settings: Settings, with_gpus: bool) -> Capacity:
    """What jobs may use here: found (or ``TORCHJOB_CAPACITY``), less the reserve. GPUs are looked
    for only ``with_gpus`` (nvidia-smi can take a while)."""
    given = override() or {}
    amounts: Amounts = {}
    sources = []
    if "cpu" in given:
        amounts["cpu"] = given["cpu"]
    else:
        try:
            amounts["cpu"] = float(len(os.sched_getaffinity(0)))
        except (AttributeError, OSError):
            amounts["cpu"] = float(os.cpu_count() or 1)
    amounts["memory"] = given["memory"] if "memory" in given else _memory()
    devices: tuple[str, ...] = ()
    by_index = False
    if GPU in given:
        devices = tuple(str(i) for i in range(int(given[GPU])))
    elif with_gpus:
        found = gpus.inventory()
        devices, by_index = found.devices, found.by_index
        sources.append(found.source)
    if given:
        sources.insert(0, "TORCHJOB_CAPACITY")
    reserve = settings.reserve
    for name in ("cpu", "memory"):
        amounts[name] = max(0.0, amounts[name] - reserve.get(name, 0.0))
    if reserve.get(GPU):
        devices = devices[: max(0, len(devices) - int(reserve[GPU]))]
    amounts[GPU] = float(len(devices))
    return Capacity(amounts, devices, ", ".join(sources) or "this machine", by_index)


def _memory() -> float:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return float("inf")


def counted(demand_amounts: Amounts, capacity: Capacity) -> Amounts:
    """GPUs asked on a machine with none are not counted: the job runs without them (gpus.py's note)."""
    if capacity.devices:
        return demand_amounts
    return {k: v for k, v in demand_amounts.items() if k != GPU}


# ------------------------------------------------------------------ checks


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
    if not _has_requests(job):
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
    limits = dict(capacity.amounts)
    cap = settings.queue(queue).capability
    for resource, amount in cap.items():
        limits[resource] = min(limits.get(resource, 0.0), amount)
    notes = []
    for resource in RESOURCES:
        gang = total(demand.pods, demand.gang).get(resource, 0.0)
        largest = max((p.get(resource, 0.0) for p in demand.pods.values()), default=0.0)
        most = max(gang, largest)
        limit = limits.get(resource, 0.0)
        if most <= limit + 1e-9:
            continue
        where = (
            f"queue {queue}'s capability" if most <= capacity.amounts.get(resource, 0.0) else "this machine"
        )
        has = f"{where} has {fmt(resource, limit)} ({capacity.source})"
        if resource == GPU:  # a GPU cannot be shared: such a job could never start
            problems.append(
                Problem(
                    "spec.tasks",
                    f"the job's gang ({len(demand.gang)} pod{'s' if len(demand.gang) != 1 else ''}) needs "
                    f"{fmt(resource, gang)} {resource}; "
                    f"{has}: it could never start; lower the limits or minAvailable, or run with --no-queue",
                )
            )
            continue
        # CPUs and memory can be oversubscribed (a cluster would leave the job Pending for ever,
        # which is of no use on one machine): the job counts as taking all there is, and runs alone.
        scale = limit / most
        for request in demand.pods.values():
            if resource in request:
                request[resource] *= scale
        notes.append(
            f"the job asks for {fmt(resource, most)} {resource}; {has}: it is counted as taking all of "
            f"it, so it starts once nothing else holds {resource}"
        )
    if problems:
        raise SpecError(problems)
    return Plan(demand, queue, priority, settings, capacity, notes)


def fmt(resource: str, amount: float) -> str:
    if resource == "memory":
        for unit, size in (("Ti", 2.0**40), ("Gi", 2.0**30), ("Mi", 2.0**20), ("Ki", 2.0**10)):
            if amount >= size:
                return f"{amount / size:.3g}{unit}"
        return f"{amount:.0f}"
    return f"{amount:g}"


# ------------------------------------------------------------------ the state file


def _state_dir() -> Path:
    from torchjob.engines.local.ports import registry_dir

    return registry_dir()


_OPEN_FLAGS = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _refuse(root: Path, message: str) -> SpecError:
    from torchjob.engines.local.ports import RegistryError

    return RegistryError(root, message)


@contextlib.contextmanager
def locked_state(write: bool = True) -> Iterator[dict[str, Any]]:
    """The admission state, read and (with ``write``) written back under its lock. Beside the
    port registry and with its protections: a private directory, files opened relative to it and
    never through a symlink. Written only when something changed (most looks of a waiting job
    change nothing)."""
    root = _state_dir()
    try:
        dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | _OPEN_FLAGS)
    except OSError as err:
        raise _refuse(root, f"cannot open the admission state directory: {err.strerror or err}") from None
    try:
        info = os.fstat(dir_fd)
        if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) != 0o700:
            raise _refuse(root, "the admission state directory is not yours alone (mode 0700); refusing it")
        try:
            lock = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT | _OPEN_FLAGS, 0o600, dir_fd=dir_fd)
        except OSError as err:
            raise _refuse(
                root / LOCK_FILE, f"cannot open the admission lock: {err.strerror or err}"
            ) from None
        try:
            _lock(lock, root / LOCK_FILE)
            raw = _read(dir_fd)
            data = _parse(raw)
            yield data
            if write:
                text = json.dumps(data, separators=(",", ":")).encode()
                if text != raw.rstrip(b" "):
                    _write(dir_fd, root, text)
        finally:
            os.close(lock)
    finally:
        os.close(dir_fd)


def _lock(fd: int, path: Path) -> None:
    deadline = time.monotonic() + LOCK_TIMEOUT
    while True:  # held for a millisecond or so by each look; a stuck holder is an error, not a hang
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise _refuse(
                    path,
                    f"the admission state has been locked for more than {LOCK_TIMEOUT:g}s by another process",
                ) from None
            time.sleep(0.002)


def _read(dir_fd: int) -> bytes:
    try:
        fd = os.open(STATE_FILE, os.O_RDONLY | _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError:
        return b""
    try:
        with os.fdopen(fd, "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw) if raw.strip() else {}
    except ValueError:
        return {}  # damaged: start afresh (the live supervisors register again on their next look)
    return data if isinstance(data, dict) else {}


def _write(dir_fd: int, root: Path, text: bytes) -> None:
    """Rewrite the file in place, under the lock every reader takes too. A rename over it (as the
    port registry does) costs about 3 ms on ext4, a third of the budget of a job's admission; in
    place, the new text is first padded with spaces to the old size (JSON allows them) and written
    in one call, then the file is cut: whenever a writer is killed, the file holds valid JSON."""
    try:
        fd = os.open(STATE_FILE, os.O_RDWR | os.O_CREAT | _OPEN_FLAGS, 0o600, dir_fd=dir_fd)
    except OSError as err:  # ELOOP: a symlink planted in its place
        raise _refuse(root / STATE_FILE, f"cannot open the admission state: {err.strerror or err}") from None
    try:
        old = os.fstat(fd).st_size
        padded = text + b" " * (old - len(text))
        view = memoryview(padded)
        offset = 0
        while offset < len(padded):
            offset += os.pwrite(fd, view[offset:], offset)
        if old > len(text):
            os.ftruncate(fd, len(text))
    finally:
        os.close(fd)


def _alive(entry: Mapping[str, Any]) -> bool:
    from torchjob.engines.local.state import process_alive

    try:
        return process_alive(int(entry["pid"]), float(entry["created"]))
    except (KeyError, ValueError, TypeError):
        return False


def live_jobs(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The state's jobs, those of dead supervisors dropped (in place)."""
    jobs = data.get("jobs")
    if not isinstance(jobs, dict):
        jobs = data["jobs"] = {}
    for key in [k for k, v in jobs.items() if not isinstance(v, dict) or not _alive(v)]:
        del jobs[key]
    return jobs


# ------------------------------------------------------------------ deciding


def _held(entry: Mapping[str, Any]) -> Amounts:
    pods = entry.get("pods") or {}
    return total(pods, [k for k in entry.get("granted") or {} if k in pods])


def _devices_held(jobs: Mapping[str, Mapping[str, Any]]) -> set[str]:
    return {d for e in jobs.values() for ids in (e.get("granted") or {}).values() for d in ids}


def _minus(a: Mapping[str, float], b: Mapping[str, float]) -> Amounts:
    return {k: a.get(k, 0.0) - b.get(k, 0.0) for k in set(a) | set(b)}


def _plus(a: Mapping[str, float], b: Mapping[str, float]) -> Amounts:
    return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in set(a) | set(b)}


def _short(need: Mapping[str, float], free: Mapping[str, float]) -> list[str]:
    return [k for k in RESOURCES if need.get(k, 0.0) > free.get(k, 0.0) + 1e-9]


@record
class Verdict:
    granted: dict[str, list[str]] | None  # pod key -> GPU ids; None: not admitted yet
    reason: str = ""


class _Scene:
    """One look at the state, from one job's side: who holds what, who waits in which order."""

    def __init__(self, jobs: dict[str, dict[str, Any]], capacity: Capacity, settings: Settings) -> None:
        self.jobs = jobs
        self.capacity = capacity
        self.settings = settings
        held = [_held(e) for e in jobs.values() if e.get("admitted")]
        self.used: Amounts = {}
        for amounts in held:
            self.used = _plus(self.used, amounts)
        self.free = _minus(capacity.amounts, self.used)
        self.queue_used: dict[str, Amounts] = {}
        for e in jobs.values():
            if e.get("admitted"):
                q = str(e.get("queue"))
                self.queue_used[q] = _plus(self.queue_used.get(q, {}), _held(e))
        taken = _devices_held(jobs)
        self.devices = [d for d in capacity.devices if d not in taken]

    def queue_free(self, queue: str) -> Amounts:
        cap = self.settings.queue(queue).capability
        used = self.queue_used.get(queue, {})
        return {k: cap[k] - used.get(k, 0.0) for k in cap}

    def overused(self, queue: str) -> bool:
        """Whether the queue holds more than its weight's share of something (Volcano's proportion)."""
        active = {str(e.get("queue")) for e in self.jobs.values()}
        weights = sum(self.settings.queue(q).weight for q in active) or 1.0
        share = self.settings.queue(queue).weight / weights
        used = self.queue_used.get(queue, {})
        return any(used.get(k, 0.0) > self.capacity.amounts.get(k, 0.0) * share + 1e-9 for k in RESOURCES)

    def waiting(self) -> list[dict[str, Any]]:
        over = {q: self.overused(q) for q in {str(e.get("queue")) for e in self.jobs.values()}}
        found = [e for e in self.jobs.values() if not e.get("admitted")]
        return sorted(
            found, key=lambda e: (-int(e.get("priority", 0)), over[str(e.get("queue"))], int(e.get("seq", 0)))
        )

    def blocked_by(
        self, entry: Mapping[str, Any], free: Amounts, queue_free: Amounts
    ) -> tuple[list[str], list[str]]:
        """Resources the job's gang is short of: on the machine, and under its queue's capability."""
        need = total(entry["pods"], list(entry["gang"]))
        return _short(need, free), [k for k in queue_free if need.get(k, 0.0) > queue_free[k] + 1e-9]


def decide(jobs: dict[str, dict[str, Any]], me: str, capacity: Capacity, settings: Settings) -> Verdict:
    """Whether job ``me`` may start now, and with which pods and GPUs; pure, on a live state.

    The waiting jobs ahead of it are taken in order: one that fits would be admitted first (its
    supervisor will on its next look), so what it needs is set aside; one that does not fit
    blocks ``me`` if ``me`` wants what it is short of and it was passed ``backfill`` times already.
    """
    scene = _Scene(jobs, capacity, settings)
    mine = jobs[me]
    free = dict(scene.free)
    queue_free = {q: scene.queue_free(q) for q in {str(e.get("queue")) for e in jobs.values()}}
    blockers: list[tuple[dict[str, Any], list[str], list[str]]] = []
    ahead_in_queue = 0
    for entry in scene.waiting():
        if entry is mine:
            break
        if entry.get("queue") == mine.get("queue"):
            ahead_in_queue += 1
        short, capped = scene.blocked_by(entry, free, queue_free[str(entry.get("queue"))])
        if short or capped:
            blockers.append((entry, short, capped))
            continue
        need = total(entry["pods"], list(entry["gang"]))
        free = _minus(free, need)
        q = str(entry.get("queue"))
        queue_free[q] = _minus(queue_free[q], {k: need.get(k, 0.0) for k in queue_free[q]})
    queue = str(mine.get("queue"))
    need = total(mine["pods"], list(mine["gang"]))
    short, capped = scene.blocked_by(mine, free, queue_free[queue])
    ahead = f"; {ahead_in_queue} job{'s' if ahead_in_queue != 1 else ''} ahead in queue {queue}"
    if short or capped:
        parts = [f"{fmt(k, need[k])} {k}, {fmt(k, max(0.0, scene.free.get(k, 0.0)))} free" for k in short] + [
            f"{fmt(k, need[k])} {k} under queue {queue}'s capability, "
            f"{fmt(k, max(0.0, queue_free[queue][k]))} left"
            for k in capped
            if k not in short
        ]
        return Verdict(None, f"waiting for {'; '.join(parts)}{ahead}")
    conflicts = []
    for entry, bshort, bcapped in blockers:
        wants = [k for k in bshort if need.get(k)]
        if entry.get("queue") == queue:
            wants += [k for k in bcapped if need.get(k)]
        if wants:
            conflicts.append(entry)
            if int(entry.get("passed", 0)) >= settings.backfill:
                return Verdict(
                    None,
                    f"waiting for job {entry.get('job')} to start first (it was passed "
                    f"{settings.backfill} times){ahead}",
                )
    for entry in conflicts:
        entry["passed"] = int(entry.get("passed", 0)) + 1
    # The whole job when it fits, else its gang (the rest is granted as it fits: grow).
    everything = total(mine["pods"])
    cap_left = queue_free[queue]
    whole = not _short(everything, free) and not any(
        everything.get(k, 0.0) > cap_left[k] + 1e-9 for k in cap_left
    )
    keys = list(mine["pods"]) if whole else list(mine["gang"])
    return Verdict(_give(mine, keys, scene.devices), "")


def _give(entry: Mapping[str, Any], keys: list[str], devices: list[str]) -> dict[str, list[str]]:
    granted: dict[str, list[str]] = {}
    cursor = 0
    for key in entry["pods"]:  # pod order: the first pods get the first free GPUs
        if key in keys:
            n = int(entry["pods"][key].get(GPU, 0))
            granted[key] = devices[cursor : cursor + n]
            cursor += n
    return granted


def grow(
    jobs: dict[str, dict[str, Any]],
    me: str,
    capacity: Capacity,
    settings: Settings,
    finished: set[str] | frozenset[str] = frozenset(),
) -> dict[str, list[str]]:
    """Pods of a running job beyond what it holds that fit now (``finished`` pods need nothing):
    after every waiting gang, which comes first (a gang waits whole, an extra pod may start alone)."""
    scene = _Scene(jobs, capacity, settings)
    mine = jobs[me]
    free = dict(scene.free)
    for entry in scene.waiting():
        free = _minus(free, total(entry["pods"], list(entry["gang"])))
    queue = str(mine.get("queue"))
    cap_left = scene.queue_free(queue)
    out: dict[str, list[str]] = {}
    devices = list(scene.devices)
    granted = mine.get("granted") or {}
    # A gang pod that gave its share back (it had ended) and is wanted again (the job restarts):
    # the gang's missing pods come back together or not at all, before any pod beyond the gang.
    missing = [k for k in mine["gang"] if k not in granted and k not in finished]
    if missing:
        need = total(mine["pods"], missing)
        if _short(need, free) or any(need.get(k, 0.0) > cap_left[k] + 1e-9 for k in cap_left):
            return {}
    for key, request in mine["pods"].items():
        if key in granted or key in finished:
            continue
        if _short(request, free) or any(request.get(k, 0.0) > cap_left[k] + 1e-9 for k in cap_left):
            break  # in pod order: index 3 does not start before index 2
        n = int(request.get(GPU, 0))
        out[key], devices = devices[:n], devices[n:]
        free = _minus(free, request)
        cap_left = _minus(cap_left, {k: request.get(k, 0.0) for k in cap_left})
    return out


# ------------------------------------------------------------------ one job's ticket


class Ticket:
    """One job's place in the queue, held by its supervisor from registration to release."""

    def __init__(self, plan: Plan, job_id: str, name: str) -> None:
        self.plan = plan
        self.id = job_id
        self.name = name
        self.granted: dict[str, list[str]] = {}
        self.reason = ""
        self.registered = False
        self.seq = 0
        self.at = 0.0
        self.next_check = 0.0
        self.finished: set[str] = set()  # pods that succeeded and gave their share back

    def _entry(self, data: dict[str, Any], jobs: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """This job's entry, added (first look) or added again (the file was removed meanwhile)."""
        mine = jobs.get(self.id)
        if mine is not None:
            return mine
        from torchjob.engines.local.state import start_time

        if not self.seq:
            self.seq = data["seq"] = int(data.get("seq", 0)) + 1
            self.at = time.time()
        pid = os.getpid()
        mine = jobs[self.id] = {
            "job": self.id,
            "name": self.name,
            "pid": pid,
            "created": start_time(pid),
            "at": self.at,
            "seq": self.seq,
            "queue": self.plan.queue,
            "priority": self.plan.priority,
            "pods": self.plan.demand.pods,
            "gang": self.plan.demand.gang,
            "granted": dict(self.granted),
            "passed": 0,
            "reason": "",
        }
        self.registered = True
        return mine

    def register(self) -> None:
        with locked_state() as data:
            self._entry(data, live_jobs(data))

    def poll(self) -> bool:
        """One look (the first registers the job): True once the job is admitted (``granted`` says
        which pods, with which GPUs)."""
        with locked_state() as data:
            jobs = live_jobs(data)
            mine = self._entry(data, jobs)
            verdict = decide(jobs, self.id, self.plan.capacity, self.plan.settings)
            if verdict.granted is None:
                self.reason = mine["reason"] = verdict.reason
                return False
            mine["granted"] = self.granted = verdict.granted
            mine["reason"] = ""
            mine["admitted"] = time.time()
            data["admitted"] = order = int(data.get("admitted", 0)) + 1
            mine["order"] = order
            return True

    def grow(self, finished: set[str] | frozenset[str] = frozenset()) -> dict[str, list[str]]:
        """Give back what ``finished`` pods held, and grant pods beyond the gang that fit now;
        those newly granted. A job with nothing to change only checks, every few seconds, that its
        entry is still there (someone may have removed the file)."""
        self.finished = set(finished)
        done = [k for k in self.granted if k in finished]
        wanted = [k for k in self.plan.demand.pods if k not in self.granted and k not in finished]
        if not done and not wanted:
            if time.monotonic() < self.next_check:
                return {}
            self.next_check = time.monotonic() + CHECK_EVERY
        with locked_state() as data:
            jobs = live_jobs(data)
            mine = self._entry(data, jobs)
            for key in done:  # a pod that ended frees what it held, as on a node
                self.granted.pop(key, None)
            mine["granted"] = dict(self.granted)
            mine.setdefault("admitted", time.time())
            if not wanted:
                return {}
            more = grow(jobs, self.id, self.plan.capacity, self.plan.settings, finished)
            if more:
                self.granted.update(more)
                mine["granted"] = dict(self.granted)
            return more

    def release(self) -> None:
        """Give everything back; quietly nothing when the state cannot be used (entries of a dead
        supervisor are dropped by the next look anyway)."""
        if not self.registered:
            return
        with contextlib.suppress(SpecError, OSError), locked_state() as data:
            live_jobs(data).pop(self.id, None)
        self.registered = False

    def gpu_env(
        self, pod_specs: Mapping[tuple[str, int], Mapping[str, Any]]
    ) -> dict[tuple[str, int], gpus.PodEnv]:
        """Each granted pod's containers' CUDA_VISIBLE_DEVICES, from the GPUs this job was given."""
        if not self.plan.capacity.devices or not any(GPU in p for p in self.plan.demand.pods.values()):
            return {}
        inventory = self.plan.capacity.inventory()
        out: dict[tuple[str, int], gpus.PodEnv] = {}
        for (task, index), spec in pod_specs.items():
            ids = self.granted.get(f"{task}/{index}")
            needs = gpus.needs_of(spec)
            if ids is None:
                continue
            shares = gpus.allocate({0: needs}, ids)[0]
            out[(task, index)] = {name: gpus.container_env(devs, inventory) for name, devs in shares.items()}
        return out

    def admits(self, task: str, index: int) -> bool:
        """Whether the pod may be created now: it is granted, and so is every gang pod that has not
        succeeded (a job is never started again below its gang)."""
        gang = self.plan.demand.gang
        if any(k not in self.granted and k not in self.finished for k in gang):
            return False
        return f"{task}/{index}" in self.granted


# ------------------------------------------------------------------ listing


def queue_listing(settings: Settings | None = None) -> QueueListing:
    """What ``torchjob queue`` shows: capacity, queues, and every queued job (running or waiting)."""
    from torchjob.engine_api.base import QueuedJob, QueueInfo, QueueListing

    settings = settings or load_settings()
    with locked_state() as data:  # written: dead entries are dropped for good
        jobs = live_jobs(data)
        wants_gpus = any(GPU in p for e in jobs.values() for p in (e.get("pods") or {}).values())
        capacity = machine_capacity(settings, wants_gpus)
        scene = _Scene(jobs, capacity, settings)
        waiting = scene.waiting()
    running = sorted((e for e in jobs.values() if e.get("admitted")), key=lambda e: int(e.get("order", 0)))
    rows = []
    for entry, state in [*((e, "Running") for e in running), *((e, "Waiting") for e in waiting)]:
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
            )
        )
    names = [DEFAULT_QUEUE, *(q for q in settings.queues if q != DEFAULT_QUEUE)]
    names += sorted({r.queue for r in rows} - set(names))
    queues = [
        QueueInfo(
            name=q,
            weight=settings.queue(q).weight,
            capability={k: fmt(k, v) for k, v in settings.queue(q).capability.items()},
            running=sum(1 for r in rows if r.queue == q and r.state == "Running"),
            waiting=sum(1 for r in rows if r.queue == q and r.state == "Waiting"),
        )
        for q in names
    ]
    return QueueListing(
        capacity={k: fmt(k, capacity.amounts.get(k, 0.0)) for k in RESOURCES},
        free={k: fmt(k, max(0.0, scene.free.get(k, 0.0))) for k in RESOURCES},
        source=capacity.source + (f"; settings {settings.source}" if settings.source else ""),
        queues=queues,
        jobs=rows,
    )
