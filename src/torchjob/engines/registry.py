"""Engines by name, imported only when asked for: importing this module imports no engine.

Adding an engine is one module with a class that implements ``torchjob.engines.base.Engine``
and one line in ``_ENGINES`` below.
"""

from __future__ import annotations

import sys

from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.engines.base import Engine

# name -> "module:factory"; the factory takes keyword settings (state_dir, kubeconfig, ...).
_ENGINES: dict[str, str] = {
    "local": "torchjob.engines.local.engine:LocalEngine",
    "kubernetes": "torchjob.engines.kubernetes.engine:KubernetesEngine",
    "slurm": "torchjob.engines.slurm.engine:SlurmEngine",
}

DEFAULT_ENGINE = "local"


def engine_names() -> list[str]:
    return sorted(_ENGINES)


def get_engine(name: str = DEFAULT_ENGINE, **settings: Any) -> Engine:
    """The engine called ``name``, made with ``settings`` (each engine ignores the ones it has no use for)."""
    from torchjob.engines.base import EngineError

    try:
        where = _ENGINES[name]
    except KeyError:
        raise EngineError(f"no engine {name!r} (engines: {', '.join(engine_names())})") from None
    module_name, _, factory = where.partition(":")
    __import__(module_name)  # not importlib.import_module: the importlib package alone is 0.1 ms
    module = sys.modules[module_name]
    engine: Engine = getattr(module, factory)(**settings)
    return engine
