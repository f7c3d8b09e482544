"""Kubernetes resource quantities (``500m``, ``2Gi``, ``1e3``) as numbers."""

from __future__ import annotations

import re

# The API's grammar: a signed decimal number, then a binary (Ki..Ei) or decimal (m, k..E) suffix
# or an exponent. ASCII digits only: Python's \d and float() would also take other scripts' digits.
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<exponent>[eE][+-]?[0-9]{1,5})|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?)"
)
_SUFFIX = {
    None: 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60,
}  # fmt: skip
# A quantity beyond a signed 64-bit count of units is a typo, and would overflow what reads it.
MAX_QUANTITY = float(2**63 - 1)


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
    match = _QUANTITY.fullmatch(text)
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
