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


def import_for_start(name: str) -> None:
    """Import what starting a job on the engine ``name`` imports (its factory's module and its
    ``start_modules``) ahead, while the caller waits on something else anyway; only for an
    engine that declares start modules (a cluster engine's client is not imported before the
    job file is known to be good). Nothing is made; an import that fails is left for get_engine
    or the start to tell."""
    from torchjob.engine_api.base import EngineError

    try:
        info = engine_info(name)
        if not info.start_modules:
            return
        _object(info.factory)
        for module in info.start_modules:
            __import__(module)
    except (EngineError, ImportError, AttributeError):
        pass


def get_engine(name: str = DEFAULT_ENGINE, **settings: Any) -> Engine:
    """The engine called ``name``, made with ``settings`` (each engine ignores the ones it has no use
    for); EngineError in one line when what it is made with does not implement the interface."""
    from torchjob.engine_api.base import EngineError

    factory = engine_info(name).factory
    engine: Engine = _object(factory)(**settings)
    kind = type(engine)
    if kind not in _checked:
        missing = interface_gaps(engine)
        if missing:
            raise EngineError(
                f"engine {name}: {factory} does not implement the engine interface: {'; '.join(missing)}"
            )
        _checked.add(kind)
    return engine


# The interface's verbs (engine_api.base.Engine) and the parameters each is called with: what the
# CLI and the SDK may ask of any engine. Checked when an engine is made, so that one that lacks a
# verb is refused when it is loaded, in one line, not when a command first needs the verb.
VERBS: dict[str, tuple[str, ...]] = {
    "check": ("job",),
    "warnings": ("job",),
    "plan": ("job", "options"),
    "start": ("plan",),
    "list_jobs": (),
    "status": ("ref",),
    "logs": ("ref", "query"),
    "wait": ("ref", "timeout", "sink"),
    "delete": ("refs",),
}
_checked: set[type] = set()  # engine classes found whole


def interface_gaps(engine: object) -> list[str]:
    """What of the interface ``engine`` lacks, one phrase each (``no plan``, ``wait takes no sink``);
    [] when it has every verb, each taking the parameters it is called with and needing no other."""
    gaps = [] if isinstance(getattr(engine, "name", None), str) else ["no name"]
    for verb, wanted in VERBS.items():
        method = getattr(engine, verb, None)
        if not callable(method):
            gaps.append(f"no {verb}")
            continue
        function = getattr(method, "__func__", method)
        code = getattr(function, "__code__", None)
        if code is None or code.co_flags & 0x0C:  # not plain Python, or *args/**kwargs: any call fits
            continue
        first = 1 if hasattr(method, "__self__") else 0  # a bound method's self
        positional = code.co_varnames[first : code.co_argcount]
        lacking = [p for p in wanted if p not in positional]
        required = positional[: len(positional) - len(function.__defaults__ or ())]
        extra = [p for p in required if p not in wanted]
        if lacking:
            gaps.append(f"{verb} takes no {' or '.join(lacking)}")
        if extra:
            gaps.append(f"{verb} needs {', '.join(extra)}, which the interface never gives")
    return gaps
