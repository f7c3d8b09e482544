"""``torchjob run|render|validate FILE.py:NAME`` when NAME is a flytekit task, workflow or @dynamic.

A task takes the path every torchjob task takes (its Job, on any engine); a workflow or a
``@dynamic`` task runs in this process under flytekit (:mod:`.local`), its arguments given as
``pyflyte run`` takes them (``--epochs 10 --batch_size 32``, ``--flag``/``--no-flag``).
``render`` shows a workflow as flytekit compiles it: every kfpytorch task node, in every branch
of a ``conditional``, with the node's ``with_overrides``, as the objects ``--target`` makes.
"""

from __future__ import annotations

import contextlib
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from torchjob.errors import Problem, SpecError
from torchjob.sdk.flyte import is_flyte
from torchjob.sdk.flyte.convert import NodeOverrides, Unsupported, convert, kind_of, node_overrides, settings
from torchjob.sdk.task import Task

_DISTRIBUTED = ("pytorch", "elastic")


def flytekit_logs_to_stderr() -> contextlib.AbstractContextManager[Any]:
    """flytekit logs to standard output (its rich console's default): while torchjob reads or
    compiles a flytekit entity, that goes to stderr, so that ``render -o json`` stays JSON."""
    return contextlib.redirect_stdout(sys.stderr)


def task_of(found: Any, ref: str, file: str) -> Task[Any, Any]:
    """The torchjob task of flytekit task ``found`` (``ref`` is how a pod finds it); its notes
    are kept on it as ``flyte_notes`` for the command to print."""
    from torchjob.sdk.flyte.support import check

    check(file)
    try:
        with flytekit_logs_to_stderr():
            converted = convert(found, ref=ref, typed_value=True)
    except ValueError as err:  # Unsupported too
        raise SpecError([Problem(ref.rpartition(":")[2], str(err), file)]) from None
    converted.task.flyte_notes = converted.notes  # type: ignore[attr-defined]
    return converted.task


def entity_names(module: Any) -> list[str]:
    """The names of a module's flytekit tasks and workflows (for a message)."""
    return sorted(k for k, v in vars(module).items() if is_flyte(v) and hasattr(v, "python_interface"))


def flyte_entity(path: str, name: str) -> Any:
    """The flytekit workflow or @dynamic task ``name`` of the file, else None."""
    from torchjob.sdk.loader import import_file

    found = getattr(import_file(path), name, None)
    if not is_flyte(found):
        return None
    from flytekit.core.workflow import WorkflowBase

    if isinstance(found, WorkflowBase) or kind_of(found) == "dynamic":
        from torchjob.sdk.flyte.support import check

        check(path)
        return found
    return None


@dataclass
class _Signature:
    """What ``parse_arguments`` reads of a workflow: its name and Python function."""

    name: str
    function: Callable[..., Any]


def _signature(entity: Any) -> _Signature:
    function = entity.task_function if kind_of(entity) == "dynamic" else entity.function
    return _Signature(str(getattr(function, "__name__", entity.name)), function)


def run(entity: Any, path: str, name: str, argv: Sequence[str], refused: Sequence[str]) -> int:
    """``torchjob run FILE.py:WORKFLOW --arg value``: flytekit runs it here, torchjob its
    kfpytorch tasks; prints the value (exit 0) or the failure (exit 1)."""
    from torchjob.sdk.flyte.local import run_entity
    from torchjob.sdk.results import RemoteError, TaskFailed, shown
    from torchjob.sdk.workflow_cli import _error_text, _print_from, parse_arguments

    ref = f"{path}:{name}"
    if refused:
        options = ", ".join(refused)
        raise SpecError([Problem("", f"{options}: not for a workflow, which runs in this process", ref)])
    signature = _signature(entity)
    args, kwargs = parse_arguments(signature, argv, ref)
    if args:  # flytekit takes inputs by name only
        raise SpecError([Problem("", "positional-only parameters cannot be flytekit inputs", ref)])
    try:
        value = run_entity(entity, kwargs)
    except Unsupported as err:
        raise SpecError([Problem("", str(err), ref)]) from None
    except (RemoteError, TaskFailed) as err:
        print(f"torchjob: workflow {name} failed: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # a plain task or flytekit raised: its traceback from the workflow on
        from torchjob.engine_api.base import EngineError

        if isinstance(err, SpecError | EngineError):
            raise
        _print_from(err, signature.function)
        print(f"torchjob: workflow {name} failed: {_error_text(err)}", file=sys.stderr)
        return 1
    print(f"torchjob: workflow {name} returned {shown(value)}", flush=True)
    return 0


@dataclass
class TaskNode:
    """A kfpytorch task node of a compiled workflow, with its serialized overrides."""

    label: str
    entity: Any
    overrides: NodeOverrides

    @property
    def name(self) -> str:
        return short_name(self.entity)


def short_name(task: Any) -> str:
    """The task's function name (flytekit's own name has the module in front)."""
    return str(getattr(task.task_function, "__name__", task.name))


def task_nodes(entity: Any) -> tuple[list[TaskNode], list[str]]:
    """Every kfpytorch task node of the workflow as flytekit serializes it (both sides of every
    ``conditional``, sub-workflows inlined) and notes on the nodes flytekit runs itself."""
    from flytekit.core.node import Node
    from flytekit.tools.translator import get_serializable

    if kind_of(entity) == "dynamic":
        raise Unsupported(
            f"{entity.name!r} is a @dynamic task: its nodes are decided when it runs; "
            "render the tasks it calls (FILE.py:TASK)"
        )
    entities: OrderedDict[Any, Any] = OrderedDict()
    spec = get_serializable(entities, settings(), entity)
    python = {id(model): node for node, model in entities.items() if isinstance(node, Node)}
    subworkflows = {str(w.id): w for w in spec.sub_workflows or []}
    found: list[TaskNode] = []
    others: list[str] = []

    def walk(models: Sequence[Any], prefix: str) -> None:
        for model in models:
            label = f"{prefix}{model.id}"
            if model.task_node is not None:
                task = python[id(model)].flyte_entity
                kind = kind_of(task)
                short = short_name(task)
                if kind in _DISTRIBUTED:
                    found.append(TaskNode(label, task, node_overrides(model.task_node.overrides)))
                elif kind == "dynamic":
                    others.append(f"{label} ({short}: @dynamic, its tasks are decided when it runs)")
                else:
                    others.append(f"{label} ({short})")
            elif model.branch_node is not None:
                block = model.branch_node.if_else
                cases = [block.case, *(block.other or [])]
                nodes = [c.then_node for c in cases] + ([block.else_node] if block.else_node else [])
                walk(nodes, f"{label} > ")
            elif model.workflow_node is not None and model.workflow_node.sub_workflow_ref is not None:
                sub = subworkflows.get(str(model.workflow_node.sub_workflow_ref))
                if sub is not None:
                    walk(sub.nodes, f"{label} > ")
            else:
                others.append(f"{label} (a launch plan or another kind of node)")

    walk(spec.template.nodes, "")
    return found, others


def _reference(task: Any, path: str, module: Any) -> str:
    """How a pod finds the task: through the file given when the file defines it by that name."""
    short = short_name(task)
    if getattr(module, short, None) is task:
        return f"{path}:{short}"
    return f"{task.task_function.__module__}:{short}"


def _jobs(entity: Any, path: str, ref: str) -> tuple[list[tuple[TaskNode, Any, Any]], list[str]]:
    """Each kfpytorch node's checked Job and Document, and the notes to print."""
    from torchjob.sdk.loader import import_file
    from torchjob.sdk.tojob import MAX_JOB_NAME, build_job, job_name

    try:
        with flytekit_logs_to_stderr():  # compiling the workflow logs (with_overrides is "beta")
            nodes, others = task_nodes(entity)
    except Unsupported as err:
        raise SpecError([Problem("", str(err), ref)]) from None
    module = import_file(path)
    jobs, notes = [], []
    for number, node in enumerate(nodes, 1):
        where = f"node {node.label}"
        try:
            with flytekit_logs_to_stderr():
                converted = convert(node.entity, overrides=node.overrides)
        except ValueError as err:
            raise SpecError([Problem(where, str(err), ref)]) from None
        suffix = f"-{number}"
        name = job_name(converted.task.name)[: MAX_JOB_NAME - len(suffix)].rstrip("-") + suffix
        target = ["--task", _reference(node.entity, path, module)]
        try:
            job, document = build_job(converted.task.job_request(target=target, name=name), file=ref)
        except SpecError as err:
            raise SpecError([Problem(f"{where}: {p.path}", p.message, ref) for p in err.problems]) from None
        notes += [f"{where}: {note}" for note in converted.notes]
        jobs.append((node, job, document))
    if others:
        notes.append(f"nodes flytekit runs itself (not rendered): {', '.join(others)}")
    return jobs, notes


def render(
    entity: Any, path: str, name: str, argv: Sequence[str], fmt: str, target: str, write: Callable[[str], Any]
) -> int:
    """One Kubernetes List per kfpytorch task node of the workflow, as ``--target`` makes it."""
    from torchjob.render import write_list
    from torchjob.sdk.workflow_cli import parse_arguments

    ref = f"{path}:{name}"
    parse_arguments(_signature(entity), argv, ref, required=False)  # the compiled graph needs none
    jobs, notes = _jobs(entity, path, ref)
    rendered = []
    for node, job, document in jobs:  # every node is checked before the first byte goes out
        items, warnings = _objects(job, target)
        for field_path, message in warnings:
            print(
                document.problem(field_path, f"warning: node {node.label}: {message}").format(),
                file=sys.stderr,
            )
        rendered.append((node, items))
    for note in notes:
        print(f"{ref}: {note}", file=sys.stderr)
    if not jobs:
        print(f"{ref}: the workflow has no kfpytorch task node; nothing to render", file=sys.stderr)
    for number, (node, items) in enumerate(rendered):
        if fmt == "yaml":
            write(("---\n" if number else "") + f"# node {node.label} ({node.name})\n")
        write_list(items, fmt, write)
    return 0


def _objects(job: Any, target: str) -> tuple[Iterator[dict[str, Any]] | list[dict[str, Any]], list[Any]]:
    from torchjob.expand import Expansion

    if target == "pods":
        expansion = Expansion(job)

        def items() -> Iterator[dict[str, Any]]:
            yield from expansion.objects()
            for pod in expansion.pods():
                yield pod.manifest

        return items(), list(expansion.warnings())
    from torchjob.targets import for_cluster

    rendered = for_cluster(job, target, job.metadata.namespace)
    return rendered.objects, list(rendered.warnings)


def describe(entity: Any, path: str, name: str) -> str:
    """``validate FILE.py:WORKFLOW``: its parameters and its kfpytorch nodes (each node's Job is
    built and checked)."""
    from torchjob.sdk.workflow_cli import describe_parameters

    ref = f"{path}:{name}"
    what = "@dynamic task" if kind_of(entity) == "dynamic" else "workflow"
    params = describe_parameters(_signature(entity).function)
    if what == "workflow":
        jobs, _ = _jobs(entity, path, ref)
        nodes = ", ".join(f"{n.label} ({n.name}: {job.total_replicas} pods)" for n, job, _ in jobs)
    else:
        nodes = "decided when it runs"
    return f"flytekit {what} {name}: valid; parameters: {params}; kfpytorch task nodes: {nodes or 'none'}"
