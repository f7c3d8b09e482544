"""A task's return value as flytekit gives it to the caller: converted to the declared output
types through flytekit's type engine (a value of another type raises flytekit's error)."""

from __future__ import annotations

import typing
from typing import Any


def as_declared(function: Any, value: Any) -> Any:
    """``value`` returned by ``function``, as flytekit's local execution would return it."""
    from flytekit.core.context_manager import FlyteContextManager
    from flytekit.core.interface import extract_return_annotation
    from flytekit.core.type_engine import TypeEngine

    returns = typing.get_type_hints(function, include_extras=True).get("return")
    outputs = list(extract_return_annotation(returns).values())
    if not outputs:
        return value
    ctx = FlyteContextManager.current_context()

    def convert(item: Any, kind: Any) -> Any:
        literal = TypeEngine.to_literal(ctx, item, kind, TypeEngine.to_literal_type(kind))
        return TypeEngine.to_python_value(ctx, literal, kind)

    if len(outputs) == 1:
        return convert(value, outputs[0])
    return tuple(convert(item, kind) for item, kind in zip(value, outputs, strict=True))
