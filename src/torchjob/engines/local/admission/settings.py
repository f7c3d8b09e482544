"""The queue's settings: queues and their weights and capabilities, priority classes, what to keep
back for other work, how often a waiting job may be passed, and the machine's capacity when it is
declared rather than found (fake GPUs on a laptop, a share of a bigger machine).

A small YAML file (:func:`config_path`); a mistake in it is one line naming the file and the field.
In a shared queue the file is the administrator's, beside the queue's state, and the same for
every user: a user's own file is not read then.
"""

from __future__ import annotations

import os
from pathlib import Path

from torchjob.engines.local.admission.amounts import RESOURCES, Amounts, quantity
from torchjob.errors import Problem, SpecError
from torchjob.records import field, record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

DEFAULT_BACKFILL = 3
DEFAULT_QUEUE = "default"
# Kubernetes' built-in priority classes; others come from the settings file.
BUILTIN_PRIORITIES = {"system-cluster-critical": 2000000000, "system-node-critical": 2000001000}
KEYS = ("queues", "priorityClasses", "reserve", "backfill", "capacity")


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
    capacity: Amounts = field(default_factory=dict)  # declared: replaces what is found, per resource
    source: str = ""

    def queue(self, name: str) -> QueueSettings:
        return self.queues.get(name) or QueueSettings()


def config_path() -> Path:
    """A shared queue's ``queues.yaml``; else ``$TORCHJOB_CONFIG``, else
    ``$XDG_CONFIG_HOME/torchjob/queues.yaml``, else ``~/.config/torchjob/queues.yaml``."""
    from torchjob.engines.local.admission.place import shared_place

    shared = shared_place()
    if shared is not None:
        return shared.settings
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
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise SpecError([Problem("", f"cannot read the queue settings: {why}", str(path))]) from None
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
        raise SpecError([Problem("", f"expected a mapping ({', '.join(KEYS)})", str(path))])
    for key in data:
        if key not in KEYS:
            bad(str(key), f"unknown setting; expected {', '.join(KEYS[:-1])} or {KEYS[-1]}")
    settings.reserve = _amounts(data.get("reserve"), "reserve", bad)
    settings.capacity = _amounts(data.get("capacity"), "capacity", bad)
    backfill = data.get("backfill", DEFAULT_BACKFILL)
    if isinstance(backfill, bool) or not isinstance(backfill, int) or backfill < 0:
        bad("backfill", f"expected a whole number of 0 or more, got {backfill!r}")
    else:
        settings.backfill = backfill
    _queues(data.get("queues") or {}, settings, bad)
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


def _queues(queues: object, settings: Settings, bad: Callable[[str, str], None]) -> None:
    if not isinstance(queues, dict):
        bad("queues", "expected a mapping of queue names to {weight, capability}")
        return
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


def _amounts(value: object, where: str, bad: Callable[[str, str], None]) -> Amounts:
    """``{cpu: 2, memory: 4Gi, nvidia.com/gpu: 1}`` as numbers."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        bad(where, f"expected a mapping of {', '.join(RESOURCES)} to quantities")
        return {}
    out: Amounts = {}
    for name, given in value.items():
        if name not in RESOURCES:
            bad(f"{where}.{name}", f"unknown resource; expected {', '.join(RESOURCES)}")
            continue
        try:
            out[str(name)] = quantity(name, given)
        except ValueError as err:
            bad(f"{where}.{name}", str(err))
    return out
