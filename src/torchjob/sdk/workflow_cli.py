"""``torchjob run|render FILE.py:WORKFLOW -- --name value ...``: workflows from the command line.

The arguments after ``--`` are read from the workflow function's signature and type hints
(``--use-single-node true`` fills ``use_single_node: bool``). ``run`` calls the workflow in this
process, as Python code would, and prints its value; ``render`` traces it (no task runs) and prints
the Kubernetes objects of each task call, one ``List`` per node.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import json
import re
import sys
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torchjob.errors import Problem, SpecError
from torchjob.sdk.promise import InvalidOverride, Node
from torchjob.sdk.task import Task
from torchjob.sdk.workflow import ValueNeeded, Workflow, trace

_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
_NONE = ("none", "null")


def find_workflow(path: str, name: str) -> Workflow[..., Any] | None:
    """The workflow ``name`` in the file at ``path``, or None if that name is not a workflow."""
    from torchjob.sdk.loader import import_file

    found = getattr(import_file(path), name, None)
    return found if isinstance(found, Workflow) else None


def describe_workflow(path: str, name: str) -> str | None:
    """``validate FILE.py:WORKFLOW``: its parameters and the file's tasks (each task's job is
    built and checked when the file defines it); None if ``name`` is not a workflow."""
    from torchjob.sdk.loader import import_file

    flow = find_workflow(path, name)
    if flow is None:
        from torchjob.sdk.flyte.commands import describe, flyte_entity

        entity = flyte_entity(path, name)
        return None if entity is None else describe(entity, path, name)
    tasks = sorted({t.name for t in vars(import_file(path)).values() if isinstance(t, Task)})
    return (
        f"workflow {flow.name}: valid; parameters: {describe_parameters(flow.function)}; "
        f"tasks in the file: {', '.join(tasks) or 'none'}"
    )


def describe_parameters(function: Callable[..., Any]) -> str:
    """``--name (type) [--other (type)]``: the parameters, optional ones in brackets."""
    hints = _hints(function)
    params = []
    for param_name, param in inspect.signature(function).parameters.items():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        text = f"--{param_name.replace('_', '-')} ({_type_text(hints.get(param_name, param.annotation))})"
        params.append(text if param.default is inspect.Parameter.empty else f"[{text}]")
    return " ".join(params) or "none"


_PLAIN = {"bool": bool, "int": int, "float": float, "str": str}


def _hints(function: Callable[..., Any]) -> dict[str, Any]:
    """The parameters' type hints; one that cannot be evaluated stays text (``"bool"`` is bool)."""
    try:
        return typing.get_type_hints(function)
    except Exception:  # one hint names something undefined: evaluate them one by one
        pass
    hints: dict[str, Any] = {}
    for name, hint in getattr(function, "__annotations__", {}).items():
        if isinstance(hint, str):
            try:
                hint = eval(hint, getattr(function, "__globals__", {}))  # what get_type_hints does
            except Exception:
                hint = _PLAIN.get(hint, hint)
        hints[name] = hint
    return hints


def _type_text(hint: Any) -> str:
    if hint is inspect.Parameter.empty:
        return "str"
    return hint if isinstance(hint, str) else getattr(hint, "__name__", None) or str(hint)


_DECIMAL = re.compile(r"\s*[+-]?[0-9]+(_[0-9]+)*\s*")  # what int() takes, but for its digits limit


def _int_digits_limit() -> int:
    """sys.get_int_max_str_digits() (0: none, as on Pythons that have no limit)."""
    return int(getattr(sys, "get_int_max_str_digits", lambda: 0)())


def _given(text: str) -> str:
    """The user's value for a message: quoted, and cut when long."""
    return repr(text) if len(text) <= 80 else f"{text[:60]!r}... ({len(text)} characters)"


def _convert(text: str, hint: Any) -> Any:
    """``text`` as a value of type ``hint``; ValueError says what was expected."""
    if hint in (inspect.Parameter.empty, Any, str):
        return text
    if hint is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError(f"expected true or false, got {_given(text)}")
    if hint in (int, float):
        try:
            if not text.isascii():  # int() and float() take '٣' and '３' for 3; the pods' shells do not
                raise ValueError
            return hint(text)
        except ValueError:
            limit = _int_digits_limit()
            if hint is int and limit and _DECIMAL.fullmatch(text) and sum(map(str.isdigit, text)) > limit:
                raise ValueError(
                    f"expected an integer of at most {limit} digits (Python's limit for text to int; "
                    f"PYTHONINTMAXSTRDIGITS=0 lifts it), got one of {sum(map(str.isdigit, text))}"
                ) from None
            raise ValueError(
                f"expected {'an integer' if hint is int else 'a number'}, got {_given(text)}"
            ) from None
    if hint is Path:
        return Path(text)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        for member in hint:
            if text in (member.name, str(member.value)):
                return member
        choices = ", ".join(m.name for m in hint)
        raise ValueError(f"expected one of {choices}, got {_given(text)}")
    origin, members = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if type(None) in members and text.lower() in _NONE:
            return None
        errors = []
        for member in (m for m in members if m is not type(None)):
            try:
                return _convert(text, member)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError("; ".join(errors))
    if origin is typing.Literal:
        for choice in members:
            if text == str(choice):
                return choice
        raise ValueError(f"expected one of {', '.join(map(str, members))}, got {_given(text)}")
    container = origin or hint
    record = isinstance(hint, type) and dataclasses.is_dataclass(hint)  # pyflyte run: a JSON object
    if container in (list, tuple, dict) or record:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = None
        wanted = dict if record else list if container is tuple else container
        if not isinstance(value, wanted):
            what = f"object of {hint.__name__}'s fields" if record else wanted.__name__
            raise ValueError(f"expected a JSON {what}, got {_given(text)}")
        if record:
            return _dataclass(hint, value)
        return tuple(value) if container is tuple else value
    raise ValueError(f"has type {_type_text(hint)}, which cannot be given on the command line")


def _dataclass(cls: Any, value: Any) -> Any:
    """Dataclass ``cls`` from a JSON object, nested ones too; left out, a field keeps its default."""
    hints, names = typing.get_type_hints(cls), sorted(f.name for f in dataclasses.fields(cls) if f.init)
    if unknown := [key for key in value if key not in names]:
        raise ValueError(f"{cls.__name__} has no field {unknown[0]!r} (it has {', '.join(names)})")
    inner = {k: v for k, v in value.items() if dataclasses.is_dataclass(hints[k]) and isinstance(v, dict)}
    nested = {k: _dataclass(hints[k], v) for k, v in inner.items()}  # flytekit checks the rest
    try:
        return cls(**{**value, **nested})
    except TypeError as err:  # a field without a default left out
        raise ValueError(f"{cls.__name__}: {err}") from None


def parse_arguments(
    flow: Workflow[..., Any] | Task[..., Any] | Any, argv: Sequence[str], ref: str, *, required: bool = True
) -> tuple[list[Any], dict[str, Any]]:
    """The positional and keyword arguments ``--name value`` tokens give the workflow (or task);
    ``required=False``: a parameter left out is not a problem (what is given is still checked)."""
    signature = inspect.signature(flow.function)
    params = {
        name: p
        for name, p in signature.parameters.items()
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    }
    hints = _hints(flow.function)

    def hint_of(name: str) -> Any:
        return hints.get(name, params[name].annotation)

    problems: list[Problem] = []
    values: dict[str, Any] = {}
    given: set[str] = set()
    tokens = list(argv)
    while tokens:
        token = tokens.pop(0)
        if not token.startswith("--") or token == "--":
            problems.append(Problem("", f"expected --NAME VALUE after --, got {token!r}", ref))
            continue
        option, has_value, text = token[2:].partition("=")
        name = option.replace("-", "_")
        flag = f"--{option}"
        if name not in params and name.startswith("no_") and _is_bool(params, hints, name[3:]):
            if has_value:
                problems.append(Problem(flag, "takes no value", ref))
            values[name[3:]] = False
            given.add(name[3:])
            continue
        if name not in params:
            if not has_value and tokens and not tokens[0].startswith("--"):
                tokens.pop(0)  # its value: one problem, not two
            known = ", ".join("--" + n.replace("_", "-") for n in params) or "none"
            problems.append(
                Problem(flag, f"{flow.name} has no such parameter (its parameters: {known})", ref)
            )
            continue
        given.add(name)
        if not has_value:
            if hint_of(name) is bool and (not tokens or tokens[0].startswith("--")):
                values[name] = True  # a bare boolean flag
                continue
            if not tokens:
                problems.append(Problem(flag, f"expected a value ({_type_text(hint_of(name))})", ref))
                continue
            text = tokens.pop(0)
        try:
            values[name] = _convert(text, hint_of(name))
        except ValueError as err:
            problems.append(Problem(flag, str(err), ref))
    for name, param in params.items():
        if required and name not in given and param.default is inspect.Parameter.empty:
            flag = "--" + name.replace("_", "-")
            problems.append(
                Problem(
                    flag, f"missing ({_type_text(hint_of(name))}); give it after --: -- {flag} VALUE", ref
                )
            )
    if problems:
        raise SpecError(problems)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for name, param in params.items():
        if name not in values:
            continue
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            args.append(values[name])
        else:
            kwargs[name] = values[name]
    return args, kwargs


def _is_bool(params: dict[str, inspect.Parameter], hints: dict[str, Any], name: str) -> bool:
    return name in params and hints.get(name, params[name].annotation) is bool


def run_workflow(path: str, name: str, argv: Sequence[str], refused: Sequence[str]) -> int | None:
    """Run workflow ``name`` of ``path`` here; None if ``name`` is not a workflow (a task, say)."""
    from torchjob.sdk.results import RemoteError, TaskFailed, shown

    flow = find_workflow(path, name)
    if flow is None:  # a flytekit workflow runs under flytekit
        from torchjob.sdk.flyte.commands import flyte_entity, run

        entity = flyte_entity(path, name)
        return None if entity is None else run(entity, path, name, argv, refused)
    ref = f"{path}:{name}"
    if refused:
        options = ", ".join(refused)
        raise SpecError([Problem("", f"{options}: not for a workflow, which runs in this process", ref)])
    args, kwargs = parse_arguments(flow, argv, ref)
    try:
        value = flow(*args, **kwargs)
    except InvalidOverride as err:
        raise SpecError([Problem("", str(err), ref)]) from None
    except (RemoteError, TaskFailed) as err:
        notes = "".join(f"\n{note}" for note in getattr(err, "__notes__", ()))
        print(f"torchjob: workflow {name} failed: {err}{notes}", file=sys.stderr)
        return 1
    except Exception as err:  # the workflow's own code raised: its traceback, from its frame on
        from torchjob.engine_api.base import EngineError

        if isinstance(err, SpecError | EngineError):
            raise  # one line, as for any command
        _print_from(err, flow.function)
        print(f"torchjob: workflow {name} failed: {_error_text(err)}", file=sys.stderr)
        return 1
    print(f"torchjob: workflow {name} returned {shown(value)}", flush=True)
    return 0


def _print_from(err: BaseException, function: Callable[..., Any]) -> None:
    """The traceback of ``err`` without torchjob's frames above the workflow's function."""
    import traceback

    tb = err.__traceback__
    while tb is not None and tb.tb_frame.f_code is not getattr(function, "__code__", None):
        tb = tb.tb_next
    traceback.print_exception(type(err), err, tb or err.__traceback__, file=sys.stderr)


def _error_text(err: BaseException) -> str:
    try:
        text = str(err)
    except Exception:
        text = ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _task_reference(node: Node, path: str, name_in_file: Callable[[str], Any]) -> str:
    """How a pod finds the node's task: through the file given, if the task is defined there."""
    found = name_in_file(node.task.name)
    if getattr(found, "function", None) is node.task.function:
        return f"{path}:{node.task.name}"
    return node.task.ref


def _node_job_name(node: Node) -> str:
    from torchjob.sdk.tojob import MAX_JOB_NAME, job_name

    suffix = f"-{node.index}"
    return job_name(node.task.name)[: MAX_JOB_NAME - len(suffix)].rstrip("-") + suffix


def render_workflow(
    path: str, name: str, argv: Sequence[str], fmt: str, write: Callable[[str], Any], kind: str = "pods"
) -> int | None:
    """Write one Kubernetes List per task call of the workflow; None if ``name`` is not a workflow.
    ``kind`` (``--target``) applies to a flytekit workflow (torchjob's own show their pods)."""
    from torchjob.expand import Expansion
    from torchjob.render import write_list
    from torchjob.sdk.loader import import_file
    from torchjob.sdk.tojob import build_job

    flow = find_workflow(path, name)
    if flow is None:
        from torchjob.sdk.flyte.commands import flyte_entity, render

        entity = flyte_entity(path, name)
        return None if entity is None else render(entity, path, name, argv, fmt, kind, write)
    ref = f"{path}:{name}"
    args, kwargs = parse_arguments(flow, argv, ref)
    try:
        nodes = trace(flow, tuple(args), kwargs)
    except (ValueNeeded, InvalidOverride) as err:
        raise SpecError([Problem("", str(err), ref)]) from None
    except Exception as err:  # the workflow's own code raised as it was traced: as run says it
        from torchjob.engine_api.base import EngineError

        if isinstance(err, SpecError | EngineError):
            raise
        _print_from(err, flow.function)
        print(f"torchjob: workflow {name} failed as it was traced: {_error_text(err)}", file=sys.stderr)
        return 1
    module = import_file(path)
    expansions = []
    for node in nodes:  # every node is checked before the first byte goes out
        target = ["--task", _task_reference(node, path, lambda n: getattr(module, n, None))]
        try:
            job, document = build_job(
                node.task.job_request(target=target, name=_node_job_name(node)), file=ref
            )
        except SpecError as err:
            raise SpecError(
                [Problem(f"{node.label}: {p.path}", p.message, ref) for p in err.problems]
            ) from None
        expansion = Expansion(job)
        for note in expansion.warnings():
            print(
                document.problem(note.path, f"warning: {node.label}: {note.message}").format(),
                file=sys.stderr,
            )
        expansions.append((node, expansion))
    if not nodes:
        print(f"{ref}: the workflow calls no task; nothing to render", file=sys.stderr)
    for number, (node, expansion) in enumerate(expansions):
        if fmt == "yaml":
            write(("---\n" if number else "") + f"# {node.label}\n")

        def items(expansion: Any = expansion) -> Any:
            yield from expansion.objects()
            for pod in expansion.pods():
                yield pod.manifest

        write_list(items(), fmt, write)
    return 0
