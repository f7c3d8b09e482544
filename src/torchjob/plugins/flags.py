"""Strict parsing of a plugin's flag list.

Volcano parses plugin flags with Go's ``flag`` package and only logs errors, so a typo silently
falls back to a default (``--port=abc`` becomes port 0, ``--wait-master-enabled true`` stops
parsing). torchjob accepts the same spellings (``-x``, ``--x``, ``--x=v``, ``--x v`` for
non-boolean flags, a bare ``--x`` for true) but every mistake is an error naming the flag.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# strconv.ParseBool's spellings, which Volcano's flags accept.
_TRUE = {"1", "t", "T", "true", "TRUE", "True"}
_FALSE = {"0", "f", "F", "false", "FALSE", "False"}
_DECIMAL = re.compile(r"^[+-]?[0-9]+$")


@dataclass(frozen=True)
class Flag:
    name: str
    kind: type  # str, int or bool
    default: Any
    help: str
    # Returns an error message for a value outside the allowed range, else None.
    check: Callable[[Any], str | None] | None = None


def parse_flags(plugin: str, flags: tuple[Flag, ...], args: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Parse ``args``; returns the value of every flag (defaults filled in) and the errors."""
    by_name = {f.name: f for f in flags}
    values: dict[str, Any] = {f.name: f.default for f in flags}
    given: set[str] = set()
    errors: list[str] = []
    known = ", ".join(f"--{f.name}" for f in flags) or "none"
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
            errors.append(f"plugin {plugin}: unknown flag --{name}; known flags are {known}")
            continue
        if name in given:
            errors.append(f"plugin {plugin}: flag --{name} is given more than once")
        given.add(name)
        if flag.kind is bool:
            if not has_value:
                values[name] = True
            elif value in _TRUE:
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
        if flag.kind is int:
            if not _DECIMAL.match(value):
                errors.append(f"plugin {plugin}: flag --{name}: expected a decimal integer, got {value!r}")
                continue
            parsed: Any = int(value)
        else:
            parsed = value
        problem = flag.check(parsed) if flag.check else None
        if problem:
            errors.append(f"plugin {plugin}: flag --{name}: {problem}")
            continue
        values[name] = parsed
    return values, errors


def port_range(value: Any) -> str | None:
    return None if 1 <= value <= 65535 else f"expected a port from 1 to 65535, got {value}"


def non_negative(value: Any) -> str | None:
    return None if value >= 0 else f"expected an integer >= 0, got {value}"
