"""The two unit syntaxes a job is written in: Go durations (``30s``, ``1m30s``) for policy
timeouts, and Kubernetes quantities (``500m``, ``4Gi``, ``1e3``) for resources."""

from __future__ import annotations

import re

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}

_QUANTITY = re.compile(r"([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)([KMGTPE]i|[mkMGTPE]|[eE][+-]?[0-9]+)?")
_SUFFIX = {
    "": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60,
}  # fmt: skip


def parse_duration(text: str) -> float:
    """Seconds in a Go duration such as ``30s``, ``1m30s`` or ``250ms``; ValueError if malformed."""
    pos = 0
    total = 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"not a duration: {text!r}")
    return total


def parse_quantity(text: str) -> float:
    """The value of a Kubernetes quantity (``500m`` is 0.5, ``1Gi`` 2**30); ValueError if malformed."""
    match = _QUANTITY.fullmatch(str(text).strip())
    if not match:
        raise ValueError(f"not a quantity: {text!r}")
    number, suffix = match.group(1), match.group(2) or ""
    if suffix[:1] in ("e", "E") and suffix not in _SUFFIX:
        return float(number) * 10.0 ** int(suffix[1:])
    return float(number) * _SUFFIX[suffix]
