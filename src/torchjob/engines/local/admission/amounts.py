"""The three resources the local queue counts, their quantities, and sums of them.

A GPU count is a whole number of devices, at most :data:`MAX_GPUS`: ``nvidia.com/gpu=80Gi`` (GPU
memory meant) is refused in one line rather than read as 85 billion GPUs. Nothing here makes one
object per unit of a resource: amounts are numbers.
"""

from __future__ import annotations

from collections.abc import Mapping

from torchjob.engines.local import gpus

GPU = gpus.RESOURCE
RESOURCES = ("cpu", "memory", GPU)
# More GPUs than any one machine holds (a rack-scale NVLink domain has 72): a count beyond it is a
# mistake, and each GPU is named (CUDA_VISIBLE_DEVICES entries), so it would also cost memory.
MAX_GPUS = 1024
EPSILON = 1e-9

Amounts = dict[str, float]


def quantity(name: str, value: object) -> float:
    """One resource's quantity as a number; ValueError saying what was expected."""
    from torchjob.spec.units import parse_quantity

    if name == GPU and isinstance(value, str) and value.strip()[-1:].isalpha():
        # 80Gi, 40G: GPU memory meant; a GPU is a device, counted in whole ones
        raise ValueError(
            f"expected a whole number of GPUs (at most {MAX_GPUS}), got {value!r}: a GPU is "
            "counted as a device, not by its memory"
        )
    amount = parse_quantity(value)
    if name != GPU:
        if amount < 0:
            raise ValueError(f"expected a quantity of 0 or more, got {value!r}")
        return amount
    if not 0 <= amount <= MAX_GPUS or amount != int(amount):
        raise ValueError(f"expected a whole number of GPUs (at most {MAX_GPUS}), got {value!r}")
    return amount


def total(pods: Mapping[str, Amounts], keys: list[str] | None = None) -> Amounts:
    out: Amounts = {}
    for key in pods if keys is None else keys:
        for name, amount in pods[key].items():
            out[name] = out.get(name, 0.0) + amount
    return out


def minus(a: Mapping[str, float], b: Mapping[str, float]) -> Amounts:
    return {k: a.get(k, 0.0) - b.get(k, 0.0) for k in set(a) | set(b)}


def plus(a: Mapping[str, float], b: Mapping[str, float]) -> Amounts:
    return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in set(a) | set(b)}


def short(need: Mapping[str, float], free: Mapping[str, float]) -> list[str]:
    """The resources ``need`` asks more of than ``free`` has."""
    return [k for k in RESOURCES if need.get(k, 0.0) > free.get(k, 0.0) + EPSILON]


def over(need: Mapping[str, float], caps: Mapping[str, float]) -> list[str]:
    """The capped resources ``need`` asks more of than ``caps`` leaves."""
    return [k for k in caps if need.get(k, 0.0) > caps[k] + EPSILON]


def fmt(resource: str, amount: float) -> str:
    if resource == "memory":
        for unit, size in (("Ti", 2.0**40), ("Gi", 2.0**30), ("Mi", 2.0**20), ("Ki", 2.0**10)):
            if amount >= size:
                return f"{amount / size:.3g}{unit}"
        return f"{amount:.0f}"
    return f"{amount:g}"


def text(amounts: Mapping[str, float]) -> str:
    """``cpu=8,memory=16Gi,nvidia.com/gpu=2``: what :func:`capacity.parse_capacity` reads back."""
    return ",".join(f"{k}={fmt(k, amounts[k])}" for k in RESOURCES if k in amounts)
