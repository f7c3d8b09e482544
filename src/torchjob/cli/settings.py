"""Command-line flags made from the settings engines declare (``engines.base.Setting``).

A command gets a flag for every setting of every engine that lists the command; a value given is
checked (its range, and that the chosen engine declares it) and handed to the engine by name.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from torchjob.engine_api.registry import DEFAULT_ENGINE, engine_names, get_engine, settings_of
from torchjob.errors import Problem, SpecError
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.engine_api.base import Engine, Setting

COMMAND_LINE = "<command line>"
# Numbers stay text for argparse (whose own error is a usage block): read by number_option.
_TYPES: dict[str, Any] = {"path": Path}


def _declared(command: str) -> dict[str, tuple[Setting, list[str]]]:
    """Each setting ``command`` takes, once, with the engines that declare it."""
    found: dict[str, tuple[Setting, list[str]]] = {}
    for engine, setting in settings_of(command):
        found.setdefault(setting.name, (setting, []))[1].append(engine)
    return found


def add_setting_options(parser: argparse.ArgumentParser, command: str) -> None:
    for setting, _ in _declared(command).values():
        kwargs: dict[str, Any] = {"dest": setting.name, "default": None, "help": setting.help}
        if setting.type == "bool":  # the flag says the other way than the default
            kwargs.update(action="store_const", const=not setting.default)
        else:
            kwargs.update(type=_TYPES.get(setting.type, str), metavar=setting.metavar)
            choices = setting.allowed()
            if choices:
                kwargs.update(choices=choices)
                del kwargs["metavar"]
        parser.add_argument(*setting.spellings, **kwargs)


def given_settings(args: argparse.Namespace, command: str, engine: str) -> dict[str, object]:
    """The settings given on the command line for ``engine``: refused if out of range or if
    ``engine`` does not declare them (a flag of another engine is a mistake, not to be ignored)."""
    settings: dict[str, object] = {}
    for name, (setting, engines) in _declared(command).items():
        value = getattr(args, name, None)
        if value is None:
            continue
        flag = setting.spellings[-1]
        if engine not in engines:
            message = f"applies only to --engine {' or '.join(engines)}, not to --engine {engine}"
            raise SpecError([Problem(flag, message, COMMAND_LINE)])
        settings[name] = _checked(setting, flag, value)
    return settings


def _checked(setting: Setting, flag: str, value: Any) -> object:
    if setting.type == "modules":
        return module_names(flag, value)
    if setting.type in ("int", "float"):
        least = setting.minimum
        expected = f"a finite number of {least:g} or more" if least is not None else "a finite number"
        message = setting.invalid or f"expected {expected}, got {{value}}"
        return number_option(flag, value, message, integer=setting.type == "int", minimum=least)
    return value


def number_option(
    flag: str,
    text: str,
    invalid: str,
    *,
    integer: bool = False,
    minimum: float | None = None,
    positive: bool = False,
) -> Any:
    """The number an option's ``text`` gives (an int with ``integer``), at least ``minimum`` (above
    0 with ``positive``). Only what Go and the shell read as a number: ASCII digits, no ``1_000``,
    no spaces, no nan or infinity (spec/units.py). Else one line naming ``flag``: ``invalid``,
    whose ``{value}`` is the text as typed."""
    from torchjob.spec.units import parse_int, parse_number

    try:
        value: float = parse_int(text) if integer else parse_number(text)
    except ValueError:
        value = math.nan
    if math.isnan(value) or (minimum is not None and value < minimum) or (positive and value <= 0):
        plain = text.isascii() and text.isprintable() and text.split() == [text]
        message = invalid.format(value=text if plain else repr(text))
        if not text.isascii():  # '３' looks like 3: say why it is not
            message += " (only ASCII digits 0-9 are read)"
        raise SpecError([Problem(flag, message, COMMAND_LINE)])
    return value


def module_names(flag: str, text: str) -> tuple[str, ...]:
    import re

    names = tuple(m.strip() for m in text.split(","))
    if not all(re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", m, re.ASCII) for m in names):
        message = f"expected module names separated by commas (torch,numpy), got {text!r}"
        raise SpecError([Problem(flag, message, COMMAND_LINE)])
    return names


def locating_flags(engine: str, settings: dict[str, object]) -> list[str]:
    """The flags, with their values, that tell ``status`` where ``engine``'s jobs are, taken from a
    command's ``settings`` (--job-root, --state-dir, -n, --context): for engine_api/lastrun.py."""
    import os

    flags: list[str] = []
    for owner, setting in settings_of("status"):
        value = settings.get(setting.name)
        if owner != engine or value is None or setting.type == "bool":
            continue
        text = os.path.abspath(str(value)) if setting.type == "path" else str(value)
        flags += [setting.spellings[-1], text]
    return flags


def remember_start(command: str, engine: str, settings: dict[str, object], *refs: str) -> None:
    """Note where the job ``refs`` name (its name, its id) was started (engine_api/lastrun.py)."""
    from torchjob.engine_api.lastrun import remember

    remember(refs, engine, locating_flags(engine, settings), f"torchjob {command}")


def given_flags(args: argparse.Namespace, command: str) -> list[str]:
    """The flags of engine settings given (whatever the engine), as spelt in --help."""
    return [
        s.spellings[-1] for s, _ in _declared(command).values() if getattr(args, s.name, None) is not None
    ]


def find_engines(argv: list[str]) -> None:
    """Read the engines other distributions declare when this command line may need them: an
    ``--engine`` that is not built in, or ``--help`` (which lists them). Else the disk is not read."""
    from torchjob.engine_api.registry import engine_names, load_entry_points

    for i, arg in enumerate(argv):
        if arg == "--":
            return
        name = (
            argv[i + 1]
            if arg == "--engine" and i + 1 < len(argv)
            else arg[9:]
            if arg.startswith("--engine=")
            else None
        )
        if arg in ("-h", "--help") or (name is not None and name not in engine_names()):
            load_entry_points()
            return


def engine_options(parser: argparse.ArgumentParser, command: str) -> None:
    """``--engine`` and every engine's settings that ``command`` takes."""
    parser.add_argument(
        "--engine",
        choices=engine_names(),
        default=DEFAULT_ENGINE,
        help=f"where jobs run (default: {DEFAULT_ENGINE}; kubernetes: a cluster, see docs/kubernetes.md)",
    )
    parser.set_defaults(engine_command=command)
    add_setting_options(parser, command)  # what the engines declare (engines/*/settings.py)


def chosen_settings(args: argparse.Namespace) -> dict[str, object]:
    """The chosen engine's settings given on the command line; another engine's is refused."""
    return given_settings(args, args.engine_command, args.engine)


def chosen_engine(args: argparse.Namespace) -> Engine:
    """The engine ``--engine`` names, made with its settings given."""
    return get_engine(args.engine, **chosen_settings(args))
