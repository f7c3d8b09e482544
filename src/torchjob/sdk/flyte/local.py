"""flytekit runs the workflow here; torchjob runs each kfpytorch task of it distributed.

flytekit's local execution calls a kfpytorch task in this process (a ``PyTorch`` task once, with
no ``WORLD_SIZE``; an ``Elastic`` task waits for nodes nothing starts), and it offers no supported
way to hand a task's execution to someone else: its plugin registry (``TaskPlugins``) refuses a
second class for kfpytorch's config types, and its entry points run before kfpytorch registers.
So torchjob does not touch flytekit: for the duration of a run it binds the names a workflow's
code calls its kfpytorch tasks by (in the modules of the workflow, its sub-workflows and
``@dynamic`` tasks) to a :class:`DistributedTask`, a flytekit task of the same function, name,
interface and config whose ``execute`` runs the torchjob task of the original (``convert``).
flytekit does everything else as it always does: inputs and outputs through its type engine,
``conditional``, ``@dynamic``, plain tasks. The names are bound back when the run ends.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from torchjob.sdk.flyte import is_flyte
from torchjob.sdk.flyte.convert import Unsupported, convert, kind_of

_DISTRIBUTED = ("pytorch", "elastic")
_LOCK = threading.Lock()  # one thread binds names at a time
_made: dict[int, tuple[Any, tuple[str, ...], Any]] = {}  # id(original) -> (original, fingerprint, task)


def _task_class() -> type:
    from flytekit.core.python_function_task import PythonFunctionTask

    class DistributedTask(PythonFunctionTask):  # type: ignore[misc]
        """A kfpytorch task whose execution is torchjob's (the original is left untouched)."""

        def __init__(self, original: Any) -> None:
            super().__init__(
                original.task_config,
                original.task_function,
                task_type=original.task_type,
                metadata=original.metadata,
                environment=original.environment,
                container_image=original.container_image,
            )
            self.original = original
            self.torchjob_task = convert(original).task

        @property
        def name(self) -> str:  # the original's: flytekit names errors and logs after it
            return str(self.original.name)

        def execute(self, **kwargs: Any) -> Any:
            from torchjob.sdk.launch import run_task

            return run_task(self.torchjob_task, (), kwargs)

    return DistributedTask


_CLASS: list[type] = []


def _fingerprint(task: Any) -> tuple[str, ...]:
    """What the torchjob task is made of; with_overrides(task_config=...) changes it in place."""
    return (
        repr(task.task_config),
        repr(task.container_image),
        repr(sorted((task.environment or {}).items())),
        repr(task.resources),
        str(task.task_type),
    )


def distributed(task: Any) -> Any:
    """The :class:`DistributedTask` of kfpytorch task ``task`` (made again when it changed)."""
    fingerprint = _fingerprint(task)
    made = _made.get(id(task))
    if made is not None and made[0] is task and made[1] == fingerprint:
        return made[2]
    if not _CLASS:
        _CLASS.append(_task_class())
    replacement = _CLASS[0](task)
    _made[id(task)] = (task, fingerprint, replacement)
    return replacement


def _is_distributed(value: Any) -> bool:
    return is_flyte(value) and not isinstance(value, tuple(_CLASS)) and kind_of(value) in _DISTRIBUTED


def _entities(entity: Any) -> Iterator[Any]:
    """The entities a workflow's compiled graph names: tasks, sub-workflows, branch nodes' tasks."""
    for node in getattr(entity, "nodes", None) or []:
        yield from _node_entities(node)


def _node_entities(node: Any) -> Iterator[Any]:
    found = node.flyte_entity
    block = getattr(found, "_ifelse_block", None)  # a conditional: its cases' nodes
    if block is None:
        yield found
        yield from _entities(found)
        return
    cases = [block.case, *(block.other or [])]
    for then in [c.then_node for c in cases] + [block.else_node]:
        if then is not None:
            yield from _node_entities(then)


def _function_of(entity: Any) -> Any:
    """The Python function a workflow or @dynamic task runs locally (None for a plain task)."""
    from flytekit.core.workflow import PythonFunctionWorkflow

    if isinstance(entity, PythonFunctionWorkflow):
        return entity.function
    if kind_of(entity) == "dynamic":
        return entity.task_function
    return None


def _namespaces(entity: Any) -> tuple[list[dict[str, Any]], list[Any]]:
    """The module namespaces whose names the run may call tasks by, and the kfpytorch tasks of
    the compiled graphs (every one of which must be found by a name there)."""
    namespaces: list[dict[str, Any]] = []
    in_graph: list[Any] = []
    pending, seen = [entity], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        function = _function_of(current)
        if function is None:
            continue
        space = getattr(function, "__globals__", None)
        if isinstance(space, dict) and all(space is not s for s in namespaces):
            namespaces.append(space)
            pending += [v for v in list(space.values()) if is_flyte(v) and _function_of_safe(v)]
        for found in _entities(current):
            if _is_distributed(found):
                in_graph.append(found)
            elif _function_of_safe(found):
                pending.append(found)
    return namespaces, in_graph


def _function_of_safe(value: Any) -> bool:
    try:
        return _function_of(value) is not None
    except Exception:
        return False


@contextlib.contextmanager
def bound(entity: Any) -> Iterator[None]:
    """Within: the kfpytorch tasks ``entity``'s code calls by name are DistributedTasks."""
    with _LOCK:
        namespaces, in_graph = _namespaces(entity)
        swapped: list[tuple[dict[str, Any], str, Any, Any]] = []
        try:
            for space in namespaces:
                for key, value in list(space.items()):
                    if _is_distributed(value):
                        replacement = distributed(value)
                        space[key] = replacement
                        swapped.append((space, key, value, replacement))
            found = {id(original) for _, _, original, _ in swapped}
            hidden = [t for t in in_graph if id(t) not in found]
            if hidden:
                names = ", ".join(sorted({str(t.name) for t in hidden}))
                raise Unsupported(
                    f"the workflow calls kfpytorch task(s) {names} by a name torchjob cannot find in "
                    "the module of the workflow (e.g. module.task(...)); import them by name "
                    "(from module import task) so that torchjob can run them distributed"
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
