"""``@workflow``: Flyte-style workflows whose task calls are nodes, run when their values are needed.

Inside a workflow a task call does not run: it becomes a :class:`~torchjob.sdk.promise.Node` and
returns a :class:`~torchjob.sdk.promise.Promise`, which takes per-call ``with_overrides``. Nodes
run one after another in the order they were written, as late as possible: when a value is needed
(a promise passed to a task that runs, or used in Python code such as ``if`` or arithmetic) the
nodes up to that one run; when the workflow returns, every node left runs and the promises in the
returned value become plain values. Each node runs exactly as a direct call of its task would.

A workflow called from plain Python returns plain values. A workflow called inside another one
is inlined: its task calls become nodes of the caller, and it returns promises.

Workflows can also be *traced* (:func:`trace`): the function runs, task calls are collected, and
nothing is executed; that is what ``torchjob render FILE.py:WORKFLOW`` shows.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from torchjob.logs import configure, get_logger
from torchjob.sdk import scope
from torchjob.sdk.config import Elastic, PyTorch
from torchjob.sdk.promise import Node, Promise, State, WorkflowError, caller_line, plain

if TYPE_CHECKING:
    from torchjob.sdk.task import Task

P = ParamSpec("P")
R = TypeVar("R")

logger = get_logger()
_NOTE = "torchjob workflow"


class ValueNeeded(WorkflowError):
    """While tracing, workflow code used a task's result as a value, which only a run can give."""


def plan(config: PyTorch | Elastic | None) -> str:
    """How a task call with this config runs (the same choice :func:`~torchjob.sdk.launch.run_task` makes)."""
    if config is None:
        return "no task_config: the function is called in this process"
    if isinstance(config, PyTorch):
        return f"PyTorch: master + {config.workers} worker(s), pods of the local engine"
    if config.single_node and config.nproc_per_node == 1:
        return (
            "single node detected (one process): elastic launch bypassed, "
            "the function is called in this process"
        )
    if config.single_node:
        return f"single node, {config.nproc_per_node} processes: torch's elastic launcher in this process"
    return (
        f"multi-node: {config.nnodes_text} nodes x {config.nproc_per_node} process(es), "
        "one local-engine pod per node"
    )


def _log_decisions(node: Node) -> None:
    config = node.task.task_config
    origin = "with_overrides on this call" if "task_config" in node.overrides else "the task's own"
    logger.debug("%s: task_config received (%s): %r", node.label, origin, config)
    if isinstance(config, Elastic):
        logger.debug(
            "%s: nnodes=%r (type %s), nproc_per_node=%d",
            node.label, config.nnodes, type(config.nnodes).__name__, config.nproc_per_node,
        )  # fmt: skip
    logger.debug("%s: %s", node.label, plan(config))


class Scope:
    """The nodes of one top-level workflow call (nested workflows add to their caller's scope)."""

    def __init__(self, name: str, *, trace: bool = False) -> None:
        self.names = [name]
        self.trace = trace
        self.nodes: list[Node] = []
        self.running: Node | None = None

    @contextlib.contextmanager
    def nested(self, name: str) -> Iterator[None]:
        self.names.append(name)
        try:
            yield
        finally:
            self.names.pop()

    def add(self, task: Task[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Promise:
        # A call that does not fit the function fails on the line that wrote it, not later.
        inspect.signature(task.function).bind(*args, **kwargs)
        node = Node(len(self.nodes) + 1, " > ".join(self.names), task, args, kwargs, self)
        self.nodes.append(node)
        logger.debug("%s: called", node.label)
        return Promise(node)

    def resolve(self, node: Node) -> Any:
        """The node's value, running every pending node up to it first (in the order written)."""
        if node.state is State.DONE:
            return node.value
        if node.state is State.FAILED:
            assert node.error is not None
            raise node.error
        if self.trace:
            raise ValueNeeded(
                f"{node.label}: its result is used as a value at {caller_line()}; only running "
                "the workflow can give it (render shows workflows whose task calls do not depend "
                "on task results in Python code; give the workflow's arguments after --)"
            )
        if self.running is not None:
            raise WorkflowError(
                f"{node.label}: its result is needed while {self.running.label} runs; pass the "
                "promise to that task as an argument instead"
            )
        for pending in self.nodes[: node.index]:
            if pending.state is State.PENDING:
                self._run(pending)
        return node.value

    def finish(self) -> None:
        """Run every node not run yet, in the order written."""
        for node in self.nodes:
            if node.state is State.PENDING:
                self._run(node)

    def _run(self, node: Node) -> None:
        node.state = State.RUNNING
        self.running = node
        started = time.monotonic()
        try:
            args = plain(node.args)
            kwargs = plain(node.kwargs)
            _log_decisions(node)
            token = scope.enter(None)  # calls made by the task itself run at once
            try:
                value = node.task(*args, **kwargs)
            finally:
                scope.leave(token)
        except BaseException as err:
            node.state, node.error = State.FAILED, err
            add_note = getattr(err, "add_note", None)  # Python 3.11+
            if add_note and not any(note.startswith(_NOTE) for note in getattr(err, "__notes__", ())):
                add_note(f"{_NOTE} {node.workflow}: raised by node {node.index} ({node.task.name})")
            logger.debug(
                "%s: failed after %.2f s: %s", node.label, time.monotonic() - started, type(err).__name__
            )
            raise
        finally:
            self.running = None
        node.state, node.value = State.DONE, value
        logger.debug("%s: done in %.2f s", node.label, time.monotonic() - started)


class Workflow(Generic[P, R]):
    """A function whose task calls are collected as nodes and run as their values are needed."""

    def __init__(self, function: Callable[P, R]) -> None:
        if not callable(function):
            raise ValueError(f"@workflow must decorate a function, got {type(function).__name__}")
        self.function = function
        functools.update_wrapper(self, function)

    @property
    def name(self) -> str:
        return str(getattr(self.function, "__name__", "workflow"))

    def __repr__(self) -> str:
        return f"Workflow({self.name})"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        outer = scope.current()
        if isinstance(outer, Scope):  # nested: inline, its calls are nodes of the caller
            with outer.nested(self.name):
                return self.function(*args, **kwargs)
        if os.environ.get("TORCHJOB_LOG") and not logger.handlers:
            configure()
        current = Scope(self.name)
        logger.debug("workflow %s: called", self.name)
        started = time.monotonic()
        token = scope.enter(current)
        try:
            out = self.function(*args, **kwargs)
            current.finish()
            value: R = plain(out)
        finally:
            scope.leave(token)
        logger.debug(
            "workflow %s: %d node(s) done in %.2f s",
            self.name,
            len(current.nodes),
            time.monotonic() - started,
        )
        return value


def trace(flow: Workflow[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Node]:
    """The nodes ``flow(*args, **kwargs)`` would run, without running any (raises ValueNeeded)."""
    current = Scope(flow.name, trace=True)
    token = scope.enter(current)
    try:
        flow.function(*args, **kwargs)
    finally:
        scope.leave(token)
    return current.nodes


@overload
def workflow(function: Callable[P, R], /) -> Workflow[P, R]: ...


@overload
def workflow() -> Callable[[Callable[P, R]], Workflow[P, R]]: ...


def workflow(
    function: Callable[P, R] | None = None, /
) -> Workflow[P, R] | Callable[[Callable[P, R]], Workflow[P, R]]:
    """Make a function a workflow: ``@workflow`` (or ``@workflow()``)."""
    if function is not None:
        return Workflow(function)
    return Workflow
