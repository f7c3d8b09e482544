"""What jobs may use on this machine: its CPUs, memory and GPUs, less the settings' ``reserve``.

Each resource is, in this order, what ``TORCHJOB_CAPACITY=cpu=8,memory=16Gi,nvidia.com/gpu=2``
says, what the settings file's ``capacity`` says (a persistent setting every command sees alike),
or what is found: the CPUs this process may run on, ``MemTotal``, and :mod:`..gpus`' inventory. GPUs
that are declared rather than found are named ``0``, ``1``, ... Each GPU also has an identity
(:func:`gpus.identities`), so that two names of one GPU are one GPU to the queue.
"""

from __future__ import annotations

import os

from torchjob.engines.local import gpus
from torchjob.engines.local.admission.amounts import GPU, RESOURCES, Amounts, quantity
from torchjob.engines.local.admission.settings import Settings, load_settings
from torchjob.errors import Problem, SpecError
from torchjob.records import record

ENV = "TORCHJOB_CAPACITY"


@record
class Capacity:
    amounts: Amounts
    devices: tuple[str, ...]  # GPU names, as CUDA_VISIBLE_DEVICES entries
    source: str
    by_index: bool = False
    ids: tuple[str, ...] | None = None  # each device's identity (gpus.identities); None: its name

    @property
    def gpu_ids(self) -> tuple[str, ...]:
        return self.devices if self.ids is None else self.ids

    def device_of(self, ids: list[str]) -> list[str]:
        """The names this job's pods know the GPUs ``ids`` by."""
        names = dict(zip(self.gpu_ids, self.devices, strict=True))
        return [names.get(i, i) for i in ids]

    def inventory(self) -> gpus.Inventory:
        return gpus.Inventory(self.devices, self.source, self.by_index)

    def summary(self) -> dict[str, object]:
        """What a job's entry records of the capacity it was admitted against (``torchjob queue``)."""
        return {"amounts": {k: self.amounts.get(k, 0.0) for k in RESOURCES}, "source": self.source}


def parse_capacity(text: str) -> Amounts:
    """``cpu=8,memory=16Gi,nvidia.com/gpu=2``; ValueError saying what is wrong."""
    out: Amounts = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in RESOURCES:
            shown = part if len(part) <= 60 else part[:57] + "..."
            raise ValueError(f"expected NAME=QUANTITY with NAME one of {', '.join(RESOURCES)}, got {shown!r}")
        try:
            out[name] = quantity(name, value.strip())
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
    return out


def override() -> Amounts | None:
    """``TORCHJOB_CAPACITY`` parsed, or None when it is not set; SpecError when it is malformed."""
    text = os.environ.get(ENV)
    if text is None:
        return None
    try:
        return parse_capacity(text)
    except ValueError as err:
        raise SpecError([Problem(ENV, str(err), "<environment>")]) from None


def declared(settings: Settings) -> tuple[Amounts, list[str]]:
    """The resources given rather than found: ``TORCHJOB_CAPACITY`` over the settings' ``capacity``;
    and where they come from."""
    given = dict(settings.capacity)
    env = override() or {}
    given.update(env)
    sources = [ENV] if env else []
    if any(k not in env for k in settings.capacity):
        sources.append(f"capacity in {settings.source}")
    return given, sources


def _fake(count: float) -> tuple[str, ...]:
    return tuple(map(str, range(int(count))))  # at most amounts.MAX_GPUS


def declared_gpus() -> gpus.Inventory | None:
    """The GPUs declared (``TORCHJOB_CAPACITY`` or the settings' ``capacity``), named ``0``, ``1``,
    ...; None to look at the machine. For ``run --no-queue`` and the checks before a job starts."""
    given, sources = declared(load_settings())
    if GPU not in given:
        return None
    return gpus.Inventory(_fake(given[GPU]), ", ".join(sources))


def machine_capacity(settings: Settings, with_gpus: bool) -> Capacity:
    """What jobs may use here, less the reserve. GPUs are looked for only ``with_gpus`` (nvidia-smi
    can take a while); declared ones are counted always."""
    given, sources = declared(settings)
    amounts: Amounts = {}
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
        devices = _fake(given[GPU])
    elif with_gpus:
        found = gpus.inventory()
        devices, by_index = found.devices, found.by_index
        sources.append(found.source)
    reserve = settings.reserve
    for name in ("cpu", "memory"):
        amounts[name] = max(0.0, amounts[name] - reserve.get(name, 0.0))
    if reserve.get(GPU):
        devices = devices[: max(0, len(devices) - int(reserve[GPU]))]
    amounts[GPU] = float(len(devices))
    ids = gpus.identities(devices) if with_gpus and devices else None
    return Capacity(amounts, devices, ", ".join(sources) or "this machine", by_index, ids)


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
