"""Engines by name, imported only when asked for: importing this module imports no engine.

Adding an engine is one package with a class that implements ``torchjob.engine_api.base.Engine``,
an :class:`~torchjob.engine_api.base.EngineInfo` in a module of its own that imports nothing of the
engine (its settings), and one line in ``_ENGINES`` below, or an entry point in the group
``torchjob.engines`` naming that ``EngineInfo`` (``slurm = my_pkg.info:ENGINE``).
"""

from __future__ import annotations

import sys

from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.engine_api.base import Engine, EngineInfo, Setting

# name -> "module:NAME": an EngineInfo (module light: listing settings imports no engine), or
# the engine's class itself (then it has no settings of its own).
_ENGINES: dict[str, str] = {
    "local": "torchjob.engines.local.settings:ENGINE",
    "kubernetes": "torchjob.engines.kubernetes.settings:ENGINE",
    "slurm": "torchjob.engines.slurm.settings:ENGINE",
}

DEFAULT_ENGINE = "local"
ENTRY_POINT_GROUP = "torchjob.engines"

_found: dict[str, EngineInfo] = {}  # by the registry's "module:NAME"
_entry_points_read = False


def _object(where: str) -> Any:
    module_name, _, name = where.partition(":")
    __import__(module_name)  # not importlib.import_module: the importlib package alone is 0.1 ms
    return getattr(sys.modules[module_name], name)


def load_entry_points() -> None:
    """Add the engines other distributions declare (group ``torchjob.engines``); once, and only when
    an engine is not built in or every engine is listed (--help): metadata is read from disk."""
    global _entry_points_read
    if _entry_points_read:
        return
    _entry_points_read = True
    from importlib.metadata import entry_points

    for point in entry_points(group=ENTRY_POINT_GROUP):
        _ENGINES.setdefault(point.name, point.value)


def engine_names() -> list[str]:
    return sorted(_ENGINES)


def engine_info(name: str) -> EngineInfo:
    """What ``name`` declares (its factory, settings and capabilities), importing only its declaration."""
    from torchjob.engine_api.base import EngineError, EngineInfo

    if name not in _ENGINES:
        load_entry_points()
    try:
        where = _ENGINES[name]
    except KeyError:
        raise EngineError(f"no engine {name!r} (engines: {', '.join(engine_names())})") from None
    if where not in _found:  # by where, not name: a test may point a name elsewhere
        try:
            found = _object(where)
        except (ImportError, AttributeError) as err:  # another distribution's, say, broken
            raise EngineError(f"engine {name}: cannot load {where}: {err}") from None
        _found[where] = found if isinstance(found, EngineInfo) else EngineInfo(where)
    return _found[where]


def settings_of(command: str) -> list[tuple[str, Setting]]:
    """Every known engine's settings that ``command`` takes, as (engine, setting), by engine name.
    An engine that cannot be loaded has none here; using it says why (get_engine)."""
    from torchjob.engine_api.base import EngineError

    found = []
    for name in engine_names():
        try:
            settings = engine_info(name).settings
        except EngineError:
            continue
        found += [(name, s) for s in settings if command in s.commands]
    return found


def engine_for(capability: str) -> str:
    """The engine that declares ``capability`` (an EngineInfo flag such as ``submits``): the default
    engine if it does, else the first by name."""
    from torchjob.engine_api.base import EngineError

    for name in [DEFAULT_ENGINE, *engine_names()]:
        if getattr(engine_info(name), capability):
            return name
    raise EngineError(f"no engine can {capability.rstrip('s')}")


def get_engine(name: str = DEFAULT_ENGINE, **settings: Any) -> Engine:
    """The engine called ``name``, made with ``settings`` (each engine ignores the ones it has no use for)."""
    factory = engine_info(name).factory
    engine: Engine = _object(factory)(**settings)
    return engine
