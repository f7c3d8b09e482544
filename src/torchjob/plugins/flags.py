"""Strict parsing of a plugin's flag list.

Volcano parses plugin flags with Go's ``flag`` package and only logs errors, so a typo silently
falls back to a default (``--port=abc`` becomes port 0, ``--wait-master-enabled true`` stops
parsing). torchjob accepts the same spellings (``-x``, ``--x``, ``--x=v``, ``--x v`` for
non-boolean flags, a bare ``--x`` for true) but every mistake is an error naming the flag.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from torchjob.records import record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

# strconv.ParseBool's spellings, which Volcano's flags accept.
_TRUE = {"1", "t", "T", "true", "TRUE", "True"}
_FALSE = {"0", "f", "F", "false", "FALSE", "False"}
# Go's integer literal syntax (strconv.ParseInt with base 0): 0x, 0o, 0b prefixes and '_' between digits.
_GO_INT = re.compile(r"^[+-]?(0[xX](_?[0-9a-fA-F])+|0[oO](_?[0-7])+|0[bB](_?[01])+|[0-9](_?[0-9])*)$")
_LEADING_ZERO = re.compile(r"^[+-]?0_?[0-9]")
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1


def parse_int(value: str) -> tuple[int | None, str]:
    """An integer as Go's flag package reads it, or None and why not.

    Go reads ``010`` as octal 8, which surprises anyone who meant ten, so torchjob refuses it and
    asks for ``10`` or ``0o10``.
    """
    if not _GO_INT.fullmatch(value):
        return None, f"expected an integer, got {value!r}"
    if _LEADING_ZERO.match(value):
        return (
            None,
            f"{value!r} has a leading zero, which Go reads as octal; write it without the zero or as 0o...",
        )
    digits = value.replace("_", "")
    # A 64-bit integer has at most 67 characters (sign, 0b, 64 binary digits); a longer one is out
    # of range without converting it (int() refuses more than 4300 digits with a ValueError).
    number = int(digits, 0) if len(digits) <= 67 else INT64_MAX + 1
    if not -INT64_MAX - 1 <= number <= INT64_MAX:
        shown = value if len(value) <= 40 else f"{value[:20]}...({len(value)} characters)"
        return None, f"{shown!r} is out of range for a 64-bit integer"
    return number, ""


@record(frozen=True)
class Flag:
    name: str
    kind: type  # str, int or bool
    default: Any
    # Returns an error message for a value outside the allowed range, else None.
    check: Callable[[Any], str | None] | None = None


def parse_flags(plugin: str, flags: tuple[Flag, ...], args: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Parse ``args``; returns the value of every flag (defaults filled in) and the errors."""
    by_name = {f.name: f for f in flags}
    values: dict[str, Any] = {f.name: f.default for f in flags}
    given: set[str] = set()
    errors: list[str] = []
    known = ", ".join(f"--{f.name}" for f in flags)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--" or not arg.startswith("-") or arg == "-":
            hint = ""
            prev = args[i - 2] if i >= 2 else ""
            if prev.lstrip("-") in by_name and by_name[prev.lstrip("-")].kind is bool:
                hint = f"; to set a boolean flag write {prev}={arg}"
            errors.append(f"plugin {plugin}: unexpected argument {arg!r}{hint}")
            continue
        body = arg[2:] if arg.startswith("--") else arg[1:]
        if not body or body.startswith("-") or body.startswith("="):
            errors.append(f"plugin {plugin}: bad flag syntax {arg!r}")
            continue
        name, has_value, value = body.partition("=")
        flag = by_name.get(name)
        if flag is None:
            if flags:
                import difflib  # only for a mistake

                close = difflib.get_close_matches(name, list(by_name), n=1, cutoff=0.8)
                hint = f"did you mean --{close[0]}?" if close else f"known flags are {known}"
                errors.append(f"plugin {plugin}: unknown flag --{name}; {hint}")
            else:
                errors.append(f"plugin {plugin}: unknown flag --{name}; this plugin takes no flags")
            continue
        if name in given:
            errors.append(f"plugin {plugin}: flag --{name} is given more than once")
        given.add(name)
        if flag.kind is bool:
            if not has_value or value in _TRUE:
                values[name] = True
            elif value in _FALSE:
                values[name] = False
            else:
                errors.append(f"plugin {plugin}: flag --{name}: expected true or false, got {value!r}")
            continue
        if not has_value:
            if i >= len(args):
                errors.append(f"plugin {plugin}: flag --{name} needs a value")
                continue
            value = args[i]
            i += 1
        parsed: Any = value
        if flag.kind is int:
            parsed, why = parse_int(value)
            if parsed is None:
                errors.append(f"plugin {plugin}: flag --{name}: {why}")
                continue
        problem = flag.check(parsed) if flag.check else None
        if problem:
            errors.append(f"plugin {plugin}: flag --{name}: {problem}")
            continue
        values[name] = parsed
    return values, errors


def port_range(value: Any) -> str | None:
    return None if 1 <= value <= 65535 else f"expected a port from 1 to 65535, got {value}"


def non_negative(value: Any) -> str | None:
    """Seconds and counts: 0 or more, and small enough for a 32-bit shell or Kubernetes field."""
    return None if 0 <= value <= INT32_MAX else f"expected an integer from 0 to {INT32_MAX}, got {value}"
