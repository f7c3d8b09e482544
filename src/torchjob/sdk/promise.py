"""Nodes and promises: what a task call inside a ``@workflow`` returns instead of running at once.

A :class:`Node` is one task call (the task, its arguments, per-call overrides); a
:class:`Promise` stands for its future value. The promise takes ``with_overrides`` for that call
only; using it as a value (``if``, arithmetic, ``str``, indexing, an attribute, pickling) asks the
workflow to run the nodes up to it and then works on the real value.
"""

from __future__ import annotations

import enum
import operator
import os
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from torchjob.sdk.config import Elastic, PyTorch, Resources
from torchjob.sdk.task import UNSET

if TYPE_CHECKING:
    from torchjob.sdk.task import Task


class WorkflowError(RuntimeError):
    """A workflow used in a way it cannot run (for instance a node overridden after it ran)."""


class InvalidOverride(ValueError):
    """``with_overrides`` on a node was given a setting the task cannot take."""


class State(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class Resolver(Protocol):
    def resolve(self, node: Node) -> Any: ...


@dataclass(eq=False)
class Node:
    """One task call inside a workflow."""

    index: int  # 1-based, in the order the calls were written
    workflow: str  # where it was called: "outer" or "outer > inner" for nested workflows
    task: Task[Any, Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    resolver: Resolver
    overrides: dict[str, Any] = field(default_factory=dict)
    state: State = State.PENDING
    value: Any = None
    error: BaseException | None = None

    @property
    def label(self) -> str:
        return f"workflow {self.workflow}: node {self.index} {self.task.name}"


class Promise:
    """The pending result of a task call inside a workflow."""

    __slots__ = ("_node",)

    def __init__(self, node: Node) -> None:
        self._node = node

    @property
    def node(self) -> Node:
        return self._node

    def with_overrides(
        self,
        *,
        task_config: PyTorch | Elastic | None = UNSET,
        image: str | None = UNSET,
        requests: Resources | None = UNSET,
        limits: Resources | None = UNSET,
        env: dict[str, str] | None = UNSET,
    ) -> Promise:
        """Change how this call runs (this call only: the task keeps its own settings)."""
        node = self._node
        if node.state is not State.PENDING:
            raise WorkflowError(
                f"{node.label}: with_overrides after the node {node.state.value}; write it on the "
                f"call itself: {node.task.name}(...).with_overrides(...)"
            )
        given = {
            "task_config": task_config,
            "image": image,
            "requests": requests,
            "limits": limits,
            "env": env,
        }
        given = {k: v for k, v in given.items() if v is not UNSET}
        # A new Task (checked now); the task itself is left untouched. UNSET keeps a setting.
        try:
            node.task = node.task.with_overrides(
                task_config=task_config, image=image, requests=requests, limits=limits, env=env
            )
        except ValueError as err:
            raise InvalidOverride(f"{node.label}: with_overrides at {caller_line()}: {err}") from None
        node.overrides.update(given)
        from torchjob.logs import debug

        debug("%s: with_overrides(%s)", node.label, ", ".join(f"{k}={v!r}" for k, v in given.items()))
        return self

    def _get(self) -> Any:
        return self._node.resolver.resolve(self._node)

    def __repr__(self) -> str:  # never resolves: safe in logs and debuggers
        node = self._node
        shown = f" = {node.value!r}" if node.state is State.DONE else f" ({node.state.value})"
        return f"Promise({node.label}{shown})"

    # Used as a value: resolve first, then behave as the value does.
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # private and special names are never forwarded
            raise AttributeError(name)
        return getattr(self._get(), name)

    def __reduce__(self) -> tuple[Any, ...]:  # crossing a process boundary: the value goes
        return (_identity, (self._get(),))

    def __bool__(self) -> bool:
        return bool(self._get())

    def __int__(self) -> int:
        return int(self._get())

    def __float__(self) -> float:
        return float(self._get())

    def __complex__(self) -> complex:
        return complex(self._get())

    def __index__(self) -> int:
        return operator.index(self._get())

    def __str__(self) -> str:
        return str(self._get())

    def __format__(self, spec: str) -> str:
        return format(self._get(), spec)

    def __hash__(self) -> int:
        return hash(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __iter__(self) -> Iterator[Any]:
        return iter(self._get())

    def __contains__(self, item: Any) -> bool:
        return plain(item) in self._get()

    def __getitem__(self, key: Any) -> Any:
        return self._get()[plain(key)]

    def __round__(self, ndigits: int | None = None) -> Any:
        return round(self._get(), ndigits)

    def __neg__(self) -> Any:
        return -self._get()

    def __pos__(self) -> Any:
        return +self._get()

    def __abs__(self) -> Any:
        return abs(self._get())

    def __invert__(self) -> Any:
        return ~self._get()


_SDK_DIR = os.path.dirname(os.path.abspath(__file__))


def caller_line() -> str:
    """``file:line`` of the innermost frame outside torchjob's SDK (the user's code)."""
    for frame in reversed(traceback.extract_stack()):
        if not frame.filename.startswith(_SDK_DIR):
            return f"{frame.filename}:{frame.lineno}"
    return "<unknown>"


def _identity(value: Any) -> Any:
    return value


def _binary(op: Callable[[Any, Any], Any]) -> Callable[[Promise, Any], Any]:
    def method(self: Promise, other: Any) -> Any:
        return op(self._get(), plain(other))

    return method


def _reflected(op: Callable[[Any, Any], Any]) -> Callable[[Promise, Any], Any]:
    def method(self: Promise, other: Any) -> Any:
        return op(plain(other), self._get())

    return method


_OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "matmul": operator.matmul,
    "truediv": operator.truediv,
    "floordiv": operator.floordiv,
    "mod": operator.mod,
    "divmod": divmod,
    "pow": pow,
    "lshift": operator.lshift,
    "rshift": operator.rshift,
    "and": operator.and_,
    "xor": operator.xor,
    "or": operator.or_,
}
for _name, _op in _OPERATORS.items():
    setattr(Promise, f"__{_name}__", _binary(_op))
    setattr(Promise, f"__r{_name}__", _reflected(_op))
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    setattr(Promise, f"__{_name}__", _binary(getattr(operator, _name)))


def has_promise(value: Any, _seen: set[int] | None = None) -> bool:
    if isinstance(value, Promise):
        return True
    if not isinstance(value, list | tuple | set | frozenset | dict):
        return False
    seen = set() if _seen is None else _seen
    if id(value) in seen:  # a container that holds itself
        return False
    seen.add(id(value))
    items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    return any(has_promise(item, seen) for item in items)


def plain(value: Any) -> Any:
    """``value`` with every promise in it (also inside lists, tuples, sets and dicts) resolved."""
    if isinstance(value, Promise):
        return value._get()
    if not has_promise(value):  # containers without promises keep their identity
        return value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(plain(item) for item in value))
    if isinstance(value, list | tuple | set | frozenset):
        return type(value)(plain(item) for item in value)
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    return value
