"""Read YAML or JSON documents and remember the line of every field.

Documents are composed into YAML nodes first (PyYAML's C composer when available), then built into
plain Python values while a map from field path (``spec.tasks[1].replicas``) to line number is
filled in. Validation later turns a path into ``FILE:LINE``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import yaml

from torchjob.errors import Problem, SpecError

try:  # the C composer is many times faster on large inputs
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover - depends on how PyYAML was built
    from yaml import SafeLoader as _Loader  # type: ignore[assignment]

PathPart = str | int


def join_path(parts: tuple[PathPart, ...] | list[PathPart]) -> str:
    """``("spec", "tasks", 1, "replicas")`` -> ``spec.tasks[1].replicas``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


@dataclass
class Document:
    """One document of an input file, with the line of each field path."""

    data: Any
    file: str
    lines: dict[str, int] = field(default_factory=dict)
    index: int = 0

    def line_of(self, path: str) -> int | None:
        """The line of ``path``, or of its nearest parent that has one."""
        while True:
            line = self.lines.get(path)
            if line is not None or not path:
                return line
            cut = max(path.rfind("."), path.rfind("["))
            path = path[:cut] if cut > 0 else ""

    def problem(self, path: str, message: str) -> Problem:
        return Problem(path=path, message=message, file=self.file, line=self.line_of(path))


class _Builder:
    def __init__(self, file: str) -> None:
        self.file = file
        self.constructor = yaml.constructor.SafeConstructor()
        self.lines: dict[str, int] = {}
        self.problems: list[Problem] = []

    def build(self, node: yaml.Node, parts: list[PathPart]) -> Any:
        path = join_path(parts)
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            self.constructor.flatten_mapping(node)
            result: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = self.constructor.construct_object(key_node, deep=True)
                if not isinstance(key, str | int | float | bool) and key is not None:
                    key = str(key)
                if key in result:
                    self.problems.append(
                        Problem(
                            join_path([*parts, str(key)]),
                            f"duplicate key {key!r}",
                            self.file,
                            key_node.start_mark.line + 1,
                        )
                    )
                result[key] = self.build(value_node, [*parts, str(key)])
            return result
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, [*parts, i]) for i, item in enumerate(node.value)]
        return self.constructor.construct_object(node, deep=True)


def read_text(file: str) -> str:
    """The text of ``file`` (``-`` is standard input), or a SpecError naming it."""
    try:
        if file == "-":
            return sys.stdin.read()
        with open(file, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise SpecError([Problem("", f"cannot read file: {reason}", file)]) from None


def parse_documents(text: str, file: str) -> list[Document]:
    """Every non-empty document in ``text``; a syntax error becomes a SpecError with its line."""
    builder = _Builder(file)
    documents: list[Document] = []
    try:
        for index, node in enumerate(yaml.compose_all(text, Loader=_Loader)):
            if node is None:
                continue
            builder.lines = {}
            data = builder.build(node, [])
            documents.append(Document(data=data, file=file, lines=builder.lines, index=index))
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark is not None else None
        what = err.problem or err.context or "invalid YAML"
        raise SpecError([Problem("", f"invalid YAML or JSON: {what}", file, line)]) from None
    except yaml.YAMLError as err:
        raise SpecError([Problem("", f"invalid YAML or JSON: {err}", file)]) from None
    except RecursionError:
        raise SpecError([Problem("", "document is nested too deeply", file)]) from None
    if builder.problems:
        raise SpecError(builder.problems)
    return documents


def load_documents(file: str) -> list[Document]:
    return parse_documents(read_text(file), file)
