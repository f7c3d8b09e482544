"""A task's return value as flytekit gives it to the caller: converted to the declared output
types through flytekit's type engine (a value of another type raises flytekit's error), and,
for a task run in a workflow or from Python, its outputs written as a Flyte pod writes them: its
files where the caller's flytekit keeps outputs (:func:`stored`), not in the rank's temporary
directory, which goes with the job."""

from __future__ import annotations

import os
import sys
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


class Outputs:
    """A flytekit task's outputs as rank 0 left them: flytekit's ``LiteralMap``, serialized. The
    caller's flytekit takes it as the task's outputs, as Flyte's backend takes a pod's."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def literal_map(self) -> Any:
        from flyteidl.core import literals_pb2
        from flytekit.models.literals import LiteralMap

        return LiteralMap.from_flyte_idl(literals_pb2.LiteralMap.FromString(self.data))


def stored(prefix: str, function: Any, value: Any) -> Any:
    """Rank 0's ``value`` as a Flyte pod leaves it: its outputs made literals in task-execution
    mode, so that the files, directories, data frames and pickles among them are written under
    ``prefix``, the caller's raw output prefix (its flytekit's own folder here, 0700), not in the
    pod's temporary directory, which goes with the job. A value flytekit refuses comes back as
    it is: the caller's flytekit then says why, as it does for a task it runs itself."""
    from flytekit.core.context_manager import ExecutionState, FlyteContextManager
    from flytekit.core.data_persistence import FileAccessProvider
    from flytekit.core.type_engine import TypeEngine, TypeTransformerFailedError
    from flytekit.models.literals import LiteralMap

    interface = _interface(function)
    names = list(interface.outputs)
    if len(names) == 1 and not (interface.output_tuple_name and isinstance(value, tuple)):
        values = {names[0]: value}
    elif names and isinstance(value, tuple) and len(value) == len(names):
        values = dict(zip(names, value, strict=True))
    elif names or value is not None:  # not the outputs declared: the caller's flytekit says so
        return value
    else:
        values = {}
    ctx = FlyteContextManager.current_context()
    sandbox = os.path.dirname(str(ctx.file_access.local_sandbox_dir))  # flytekit adds the last part
    storage = FileAccessProvider(local_sandbox_dir=sandbox, raw_output_prefix=prefix)
    state = ctx.execution_state.with_params(mode=ExecutionState.Mode.TASK_EXECUTION)
    try:
        with FlyteContextManager.with_context(
            ctx.with_file_access(storage).with_execution_state(state)
        ) as here:
            literals = {}
            for name, item in values.items():
                kind = interface.outputs[name]
                literals[name] = TypeEngine.to_literal(here, item, kind, TypeEngine.to_literal_type(kind))
    except TypeTransformerFailedError:
        return value
    return Outputs(LiteralMap(literals).to_flyte_idl().SerializeToString())


def _interface(function: Any) -> Any:
    """The interface of the flytekit task whose function ``function`` is (the module the rank
    imported defines it), else the one flytekit reads from the function's annotations."""
    from flytekit.core.interface import transform_function_to_interface

    module = sys.modules.get(getattr(function, "__module__", None) or "")
    found: Any = getattr(module, getattr(function, "__name__", ""), None)
    if getattr(found, "task_function", None) is function:
        return found.python_interface
    return transform_function_to_interface(function)
