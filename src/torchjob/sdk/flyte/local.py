"""flytekit runs the workflow here; torchjob runs each kfpytorch task of it distributed.

flytekit's local execution calls a kfpytorch task in this process (a ``PyTorch`` task once, with
no ``WORLD_SIZE``; an ``Elastic`` task waits for nodes nothing starts), and it offers no supported
way to hand a task's execution to someone else: its plugin registry (``TaskPlugins``) refuses a
second class for kfpytorch's config types, and its entry points run before kfpytorch registers
(docs/flyte.md). So torchjob leaves flytekit as it is: for the duration of a run it binds the
names a workflow's code calls its kfpytorch tasks by (in the modules of the workflow, of its
sub-workflows and of its ``@dynamic`` tasks) to a copy of each task, an instance of a subclass of
kfpytorch's own task class made from the same function, config, image, environment and resources,
whose ``execute`` runs the torchjob task of what the copy serializes (``convert``) and returns
the literals rank 0 made of its outputs (``values.stored``: files where this process's flytekit
keeps outputs, as a Flyte pod uploads them). flytekit does
everything else as it always does: inputs and outputs through its type engine, ``conditional``,
``@dynamic``, plain tasks. The names are bound back when the run ends.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

from torchjob.sdk.flyte import is_flyte
from torchjob.sdk.flyte.convert import Unsupported, convert, kind_of

_DISTRIBUTED = ("pytorch", "elastic")
_LOCK = threading.RLock()  # one thread binds names at a time (a task may run a workflow)
_made: dict[int, tuple[Any, Any]] = {}  # id(original) -> (original, its DistributedTask)
_classes: dict[type, type] = {}  # kfpytorch's task class -> torchjob's subclass of it


def _task_class(base: type) -> type:
    """A subclass of kfpytorch's task class whose execution is torchjob's: made from the same
    config, it serializes exactly as the original does (with_overrides(task_config=...) at a
    workflow's compilation changes it as it would the original)."""

    class DistributedTask(base):  # type: ignore[misc]
        original: Any = None  # the user's task, and its config when this copy was made of it
        original_config: Any = None
        _made: tuple[tuple[str, ...], Any] | None = None

        @property
        def name(self) -> str:  # the original's: flytekit names errors and logs after it
            return str(self.original.name)

        def torchjob_task(self) -> Any:
            """The torchjob task of this task's current config (made again when it changed)."""
            fingerprint = (repr(self.task_config), str(self.task_type))
            if self._made is None or self._made[0] != fingerprint:
                self._made = (fingerprint, convert(self).task)
            return self._made[1]

        def execute(self, **kwargs: Any) -> Any:
            from flytekit.core.context_manager import FlyteContextManager

            from torchjob.sdk.flyte.values import Outputs, stored
            from torchjob.sdk.launch import run_task

            # Rank 0 writes the outputs' files where this process's flytekit keeps its own, as a
            # Flyte pod uploads them: its temporary directory goes with the job.
            prefix = FlyteContextManager.current_context().file_access.raw_output_prefix
            value = run_task(self.torchjob_task(), (), kwargs, functools.partial(stored, prefix))
            # A LiteralMap is taken by flytekit as the outputs themselves (dispatch_execute).
            return value.literal_map() if isinstance(value, Outputs) else value

    DistributedTask.__name__ = DistributedTask.__qualname__ = f"Torchjob{base.__name__}"
    return DistributedTask


def distributed(task: Any) -> Any:
    """The torchjob-run copy of kfpytorch task ``task``: the same function, config, image,
    environment and resources (made again when the task's config was replaced)."""
    made = _made.get(id(task))
    if made is not None and made[0] is task and made[1].original_config is task.task_config:
        return made[1]
    base = type(task)
    if base not in _classes:
        _classes[base] = _task_class(base)
    spec = task.resources
    copy = _classes[base](
        task.task_config,
        task.task_function,
        metadata=task.metadata,
        environment=task.environment,
        container_image=task.container_image,
        requests=spec.requests,
        limits=spec.limits,
        shared_memory=task.shared_memory,
    )
    copy.original, copy.original_config = task, task.task_config
    _made[id(task)] = (task, copy)
    return copy


def _is_distributed(value: Any) -> bool:
    """A kfpytorch task of the user's (not one of torchjob's copies)."""
    return is_flyte(value) and type(value) not in _classes.values() and kind_of(value) in _DISTRIBUTED


def _entities(entity: Any, deep: bool = True) -> Iterator[Any]:
    """The entities a workflow's compiled graph names: tasks, sub-workflows (and with ``deep``
    theirs), the nodes of every case of a conditional."""
    for node in getattr(entity, "nodes", None) or []:
        yield from _node_entities(node, deep)


def _node_entities(node: Any, deep: bool) -> Iterator[Any]:
    found = node.flyte_entity
    block = getattr(found, "_ifelse_block", None)  # a conditional: its cases' nodes
    if block is None:
        yield found
        if deep:
            yield from _entities(found)
        return
    cases = [block.case, *(block.other or [])]
    for then in [c.then_node for c in cases] + [block.else_node]:
        if then is not None:
            yield from _node_entities(then, deep)


def _function_of(entity: Any) -> Any:
    """The Python function a workflow or @dynamic task runs locally (None for a plain task)."""
    from flytekit.core.workflow import PythonFunctionWorkflow

    if isinstance(entity, PythonFunctionWorkflow):
        return entity.function
    if kind_of(entity) == "dynamic":
        return entity.task_function
    return None


def _namespaces(entity: Any) -> list[dict[str, Any]]:
    """The module namespaces whose names the run may call tasks by: those of the workflow's and
    ``@dynamic`` tasks' functions, of the workflows it calls and of those in these modules."""
    namespaces: list[dict[str, Any]] = []
    pending, seen = [entity], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        function = _function_of(current)
        if function is None:
            continue
        if kind_of(current) != "dynamic":
            current.compile()  # as flytekit does before it runs a workflow: its nodes
            pending += list(_entities(current))
        space = getattr(function, "__globals__", None)
        if isinstance(space, dict) and all(space is not s for s in namespaces):
            namespaces.append(space)
            pending += [v for v in list(space.values()) if is_flyte(v)]
    return namespaces


def _unreached(entity: Any, seen: set[int] | None = None) -> list[Any]:
    """The kfpytorch tasks a workflow still calls as they are, the names being bound: those it
    reaches otherwise than by a name of a module (``module.task(...)``). Its function is traced
    again, as flytekit compiles it, into a new workflow object (the workflow is left as it was)."""
    from flytekit.core.workflow import PythonFunctionWorkflow

    seen = set() if seen is None else seen
    if id(entity) in seen or not isinstance(entity, PythonFunctionWorkflow):
        return []
    seen.add(id(entity))
    fresh = PythonFunctionWorkflow(
        entity.function,
        metadata=entity.workflow_metadata,
        default_metadata=entity.workflow_metadata_defaults,
    )
    fresh.compile()
    out = []
    for found in _entities(fresh, deep=False):  # a sub-workflow is traced again itself
        if _is_distributed(found):
            out.append(found)
        else:
            out += _unreached(found, seen)
    return out


@contextlib.contextmanager
def bound(entity: Any) -> Iterator[None]:
    """Within: the kfpytorch tasks ``entity``'s code calls by name are torchjob's copies."""
    with _LOCK:
        namespaces = _namespaces(entity)
        swapped: list[tuple[dict[str, Any], str, Any, Any]] = []
        try:
            for space in namespaces:
                for key, value in list(space.items()):
                    if _is_distributed(value):
                        replacement = distributed(value)
                        space[key] = replacement
                        swapped.append((space, key, value, replacement))
            hidden = _unreached(entity)
            if hidden:
                names = ", ".join(sorted({str(t.name) for t in hidden}))
                raise Unsupported(
                    f"the workflow calls kfpytorch task(s) {names} otherwise than by a name of its "
                    "module (module.task(...), say), which torchjob cannot run distributed: "
                    "import them by name (from module import task)"
                )
            yield
        finally:
            for space, key, original, replacement in reversed(swapped):
                if space.get(key) is replacement:
                    space[key] = original


def run_entity(entity: Any, inputs: dict[str, Any]) -> Any:
    """Run a flytekit task, workflow or @dynamic task with ``inputs``; its value as flytekit
    returns it."""
    from torchjob.sdk.flyte.support import check

    check(getattr(entity, "name", "<flytekit>"))
    from flytekit.core.workflow import PythonFunctionWorkflow

    kind = kind_of(entity) if not isinstance(entity, PythonFunctionWorkflow) else "workflow"
    if kind in _DISTRIBUTED:
        return distributed(entity)(**inputs)
    if kind == "plain":
        return entity(**inputs)
    if kind in ("workflow", "dynamic"):
        with bound(entity):
            return entity(**inputs)
    raise Unsupported(
        f"{getattr(entity, 'name', entity)!r} is a flytekit {type(entity).__name__}; torchjob runs "
        "flytekit tasks (plain or kfpytorch), workflows and @dynamic tasks"
    )
