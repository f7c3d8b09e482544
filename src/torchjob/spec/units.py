"""The two unit syntaxes a job is written in: Go durations (``30s``, ``1m30s``) for policy
timeouts, and Kubernetes quantities (``500m``, ``4Gi``, ``1e3``) for resources; and the plain
numbers typed on the command line (``--timeout 30``, ``--max-restarts 3``, ``-j 2x4``).

ASCII digits only: Python's ``\\d`` and ``float()`` would also take other scripts' digits, which
neither Go nor the API server accepts.
"""

from __future__ import annotations

import math
import re

# Patterns are compiled (and cached by re) on first use: a job that sets no duration or quantity
# does not pay for them (0.5 ms for both).
_DURATION_PART = r"([0-9]+(?:\.[0-9]+)?)(ns|us|µs|ms|s|m|h)"
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
# What an int64 of nanoseconds holds (about 292 years): Go's time.Duration.
MAX_DURATION = (2**63 - 1) / 1e9

# The API's grammar: a signed decimal number, then a binary (Ki..Ei) or decimal (m, k..E) suffix
# or an exponent.
_QUANTITY = (
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<exponent>[eE][+-]?[0-9]{1,5})|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?)"
)
_SUFFIX = {
    None: 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60,
}  # fmt: skip
# A quantity beyond a signed 64-bit count of units is a typo, and would overflow what reads it.
MAX_QUANTITY = float(2**63 - 1)

# A number as Go's strconv and the shell's arithmetic read one: int() and float() would also take
# '٣', '３', '1_000', ' 3', 'nan' and 'inf', which a user never means on a command line.
_INTEGER = r"[+-]?[0-9]{1,18}"  # fits in 64 bits; int() refuses 4,300 digits and more
_NUMBER = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,5})?"


def parse_int(text: str) -> int:
    """A whole number in ASCII decimal digits, with an optional sign; ValueError for anything else."""
    if not re.fullmatch(_INTEGER, text):
        raise ValueError(f"not a whole number: {text!r}")
    return int(text)


def parse_number(text: str) -> float:
    """A finite decimal number in ASCII (``30``, ``2.5``, ``.5``, ``1e3``); ValueError for anything
    else, nan and infinity included (a timeout of nan would never pass)."""
    value = float(text) if len(text) <= 400 and re.fullmatch(_NUMBER, text) else math.nan
    if not math.isfinite(value):  # also 1e999, which float() reads as infinity
        raise ValueError(f"not a finite number: {text!r}")
    return value


def parse_duration(text: str) -> float:
    """Seconds in a Go duration such as ``30s``, ``1m30s`` or ``250ms``; ValueError if malformed
    or longer than Go can hold."""
    pos = 0
    total = 0.0
    for match in re.finditer(_DURATION_PART, text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"not a duration: {text!r}")
    if total > MAX_DURATION:
        raise ValueError(f"duration {text!r} is longer than about 292 years")
    return total


def parse_quantity(value: object) -> float:
    """The number a quantity stands for (``"2Gi"`` -> 2147483648.0); ValueError if malformed or absurd.

    The API takes a quantity as text or as a JSON number, so integers and floats are accepted too.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected a quantity such as '500m' or '2Gi', got {type(value).__name__}")
    if isinstance(value, int) and abs(value) > MAX_QUANTITY:  # not printed: it may have 5,000 digits
        raise ValueError(f"quantity is too large; expected at most {MAX_QUANTITY:.3g}")
    text = str(value).strip() if not isinstance(value, str) else value
    shown = text if len(text) <= 40 else text[:37] + "..."
    match = re.fullmatch(_QUANTITY, text)
    if match is None:
        raise ValueError(f"{shown!r} is not a quantity; expected for example '500m', '2', '1.5Gi' or '1e3'")
    number = float(match["number"])
    if match["exponent"]:
        # 10.0 ** 309 raises OverflowError; an exponent clamped to 308 still overflows to inf.
        amount = number * 10.0 ** max(-400, min(int(match["exponent"][1:]), 308))
    else:
        amount = number * _SUFFIX[match["suffix"]]
    if not abs(amount) <= MAX_QUANTITY:  # also catches inf
        raise ValueError(f"quantity {shown!r} is too large; expected at most {MAX_QUANTITY:.3g}")
    return amount
