"""Read YAML or JSON documents and remember the line of every field.

Documents are composed into YAML nodes first (PyYAML's C composer when available), then built into
plain Python values while a map from field path (``spec.tasks[1].replicas``) to line number is
filled in. Validation later turns a path into ``FILE:LINE``.

The builder also keeps out what a Kubernetes object cannot hold or what would only blow up later:
values nested absurdly deep, aliases that refer to themselves or multiply into millions of values
("billion laughs"), binary data and non-finite numbers. Timestamps stay text, as kubectl keeps them.
"""

from __future__ import annotations

import json
import math
import re
import sys

from torchjob.errors import Problem, SpecError
from torchjob.records import field, record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    import yaml  # at run time imported by the first parse (_yaml): data already parsed never needs it

PathPart = str | int

# Real Kubernetes objects nest about 15 levels; far deeper input only risks recursion limits later.
MAX_DEPTH = 100
# Values one document may expand to through aliases; a 10,000-replica job needs a few hundred.
MAX_VALUES = 1_000_000
# Characters of text a file's documents may expand to through aliases, in all (each document can
# have its own aliases). A Kubernetes object is limited to about 1.5 MiB; far more is a few large
# strings repeated by aliases, which would blow up later when rendered or copied into every pod.
MAX_TEXT = 16 * 2**20
# Kubernetes' integers are 64-bit; a longer one cannot be submitted (and Python refuses to turn
# integers of over 4,300 digits into text). The length check comes before the conversion.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_INT_MAX_CHARS = 100
_PLAIN_KEY = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$-]*$")
_YAML_TAG = "tag:yaml.org,2002:"
# Tags of plain data; anything else (``!!python/...``, ``!custom``) is refused, never constructed.
_PLAIN_TAGS = {
    _YAML_TAG + name for name in ("str", "int", "float", "bool", "null", "timestamp", "binary", "map", "seq")
}
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_INT_TAG = "tag:yaml.org,2002:int"
_BINARY_TAG = "tag:yaml.org,2002:binary"
_NULL_TAG = "tag:yaml.org,2002:null"
_MERGE_TAG = "tag:yaml.org,2002:merge"


def child(path: str, key: PathPart) -> str:
    """The path of ``key`` under ``path``: ``spec.tasks[1]``, ``metadata.labels["app.io/x"]``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _PLAIN_KEY.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def parent(path: str) -> str:
    """``spec.tasks[1].replicas`` -> ``spec.tasks[1]``; ``metadata`` -> ``""``."""
    if path.endswith('"]'):
        start = path.rfind('["')
        if start >= 0:
            return path[:start]
    cut = max(path.rfind("."), path.rfind("["))
    return path[:cut] if cut > 0 else ""


@record
class Document:
    """One document of an input file, with the line of each field path."""

    data: Any
    file: str
    lines: dict[str, int] = field(default_factory=dict)
    index: int = 0
    # How many documents the file holds; with more than one, problems say which document they are in.
    total: int = 1
    # Mistakes the document could still be read past (a key written twice: the last one counts),
    # reported together with every problem of the job it holds.
    problems: list[Problem] = field(default_factory=list)
    # A Volcano Job translated from another kind (spec/kinds/): its field paths and lines are
    # told in the original document's terms (``origin.problem(path, message)``), and the job
    # checked from it gets what the kind says beyond a Volcano Job (``origin.finish(job, data)``).
    origin: Any = None
    # Where the object is in its YAML document: ``items[2]`` of a ``kind: List`` (``render`` prints
    # one, as kubectl does); its problems are told at that path (``lines`` holds the whole document's).
    prefix: str = ""

    def line_of(self, path: str) -> int | None:
        """The line of ``path``, or of its nearest parent that has one."""
        while True:
            line = self.lines.get(path)
            if line is not None or not path:
                return line
            path = parent(path)

    def problem(self, path: str, message: str) -> Problem:
        """A problem at ``path`` of this document, with its line (an :class:`Issue` unpacks to both)."""
        if self.origin is not None:
            found: Problem = self.origin.problem(path, message)
            return found
        if self.total > 1:
            message = f"{message} (in document {self.index + 1})"
        if self.prefix:
            path = f"{self.prefix}.{path}" if path else self.prefix
        return Problem(path=path, message=message, file=self.file, line=self.line_of(path))


class _Builder:
    def __init__(self, file: str) -> None:
        self.file = file
        self.constructor = yaml.constructor.SafeConstructor()
        self.lines: dict[str, int] = {}
        self.problems: list[Problem] = []
        self.duplicates: list[Problem] = []  # per document: reported with the job's own problems
        self.values = 0
        self.text = 0  # characters of every scalar built, aliases counted each time
        # Mapping nodes whose ``<<`` merge keys are flattened: how many leading pairs came from merges.
        self.merged: dict[yaml.MappingNode, int] = {}
        self.active: set[int] = set()  # nodes being built now, to catch self-referring aliases

    def fail(self, path: str, message: str, node: yaml.Node) -> None:
        self.problems.append(Problem(path, message, self.file, node.start_mark.line + 1))

    def build(self, node: yaml.Node, path: str, depth: int = 0) -> Any:
        self.lines.setdefault(path, node.start_mark.line + 1)
        self.values += 1
        if self.values > MAX_VALUES:
            raise _TooBig(node)
        if depth > MAX_DEPTH:
            raise _TooDeep(node)
        if node.tag not in _PLAIN_TAGS:
            tag = node.tag.replace(_YAML_TAG, "!!")
            self.fail(path, f"unsupported YAML tag {tag!r}; expected plain data", node)
            return None
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node, path)
        if id(node) in self.active:
            raise _Recursive(node)
        self.active.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self.mapping(node, path, depth)
            return [self.build(item, child(path, i), depth + 1) for i, item in enumerate(node.value)]
        finally:
            self.active.discard(id(node))

    def mapping(self, node: yaml.MappingNode, path: str, depth: int) -> dict[Any, Any]:
        merged = self.merged.get(node)
        if merged is None:  # flattening changes the node, which aliases may bring back here
            written = sum(1 for key, _ in node.value if key.tag != _MERGE_TAG)
            self.constructor.flatten_mapping(node)
            merged = self.merged[node] = len(node.value) - written
        result: dict[Any, Any] = {}
        written_keys: set[str] = set()
        for index, (key_node, value_node) in enumerate(node.value):
            if not isinstance(key_node, yaml.ScalarNode):
                self.fail(path, "expected a plain key, got a list or mapping as a key", key_node)
                continue
            raw_key = self.build(key_node, path, depth + 1)
            # Kubernetes objects only have text keys (``1:`` means "1", ``null:`` means "null").
            key = raw_key if isinstance(raw_key, str) else json.dumps(raw_key)
            key_path = child(path, key)
            # Keys brought in by ``<<: *base`` come first; a key written here overrides them (YAML's
            # merge key), but a key written twice here is a mistake.
            if index >= merged:
                if key in written_keys:
                    line = key_node.start_mark.line + 1
                    self.duplicates.append(Problem(key_path, f"duplicate key {key!r}", self.file, line))
                written_keys.add(key)
            self.lines.setdefault(key_path, key_node.start_mark.line + 1)
            result[key] = self.build(value_node, key_path, depth + 1)
        return result

    def scalar(self, node: yaml.ScalarNode, path: str) -> Any:
        self.text += len(node.value)
        if self.text > MAX_TEXT:
            raise _TooLong(node)
        if node.tag == _INT_TAG and len(node.value) > _INT_MAX_CHARS:
            self.fail(path, f"integer of {len(node.value)} characters is too large; {_INT64_RANGE}", node)
            return None
        if node.tag == _TIMESTAMP_TAG:
            return node.value
        if node.tag == _BINARY_TAG:
            self.fail(path, "binary data is not allowed here; expected text", node)
            return None
        value = self.constructor.construct_object(node, deep=True)
        if isinstance(value, float) and not math.isfinite(value):
            self.fail(path, f"expected a finite number, got {node.value!r}", node)
            return None
        if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
            self.fail(path, f"integer {node.value} is too large; {_INT64_RANGE}", node)
            return None
        if isinstance(value, str) and not value.isascii() and re.search(_SURROGATE, value):
            return self.surrogates(value, path, node)
        return value

    def surrogates(self, value: str, path: str, node: yaml.ScalarNode) -> str | None:
        """JSON writes a character beyond U+FFFF as two escapes (``"\\ud83d\\ude00"``): join them."""
        try:
            return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
        except UnicodeDecodeError:
            self.fail(path, "a \\u escape of half a UTF-16 surrogate pair is not a character", node)
            return None


_INT64_RANGE = "expected a 64-bit integer, as Kubernetes has"
_SURROGATE = r"[\ud800-\udfff]"  # compiled (and cached by re) only for non-ASCII text


class _Stop(Exception):
    message = ""

    def __init__(self, node: yaml.Node) -> None:
        super().__init__()
        self.line = node.start_mark.line + 1


class _TooBig(_Stop):
    message = f"document expands to more than {MAX_VALUES} values (through YAML aliases?)"


class _TooLong(_Stop):
    message = f"the file expands to more than {MAX_TEXT // 2**20} MiB of text (through YAML aliases?)"


class _TooDeep(_Stop):
    message = f"document is nested more than {MAX_DEPTH} levels deep"


class _Recursive(_Stop):
    message = "a YAML alias refers to a value that contains it; expected a finite document"


def read_text(file: str) -> str:
    """The text of ``file`` (``-`` is standard input), or a SpecError naming it."""
    try:
        # Read no more than a job file can be (/dev/zero, a stray log), and strictly UTF-8,
        # whatever the locale makes of sys.stdin.
        if file == "-":
            data = sys.stdin.buffer.read(MAX_TEXT + 1)
        else:
            with open(file, "rb") as handle:
                data = handle.read(MAX_TEXT + 1)
        if len(data) > MAX_TEXT:
            reason = f"it is larger than {MAX_TEXT // 2**20} MiB; expected a job file"
            raise SpecError([Problem("", reason, file)])
        text = data.decode("utf-8")
        # A file's line ends as open() in text mode gives them (\r\n and \r read as \n).
        return text if file == "-" or "\r" not in text else text.replace("\r\n", "\n").replace("\r", "\n")
    except (OSError, UnicodeDecodeError, MemoryError) as err:
        if isinstance(err, UnicodeDecodeError):
            reason = f"not UTF-8 text ({err.reason} at byte {err.start})"
        elif isinstance(err, MemoryError):
            reason = "not enough memory to read it"
        else:
            reason = err.strerror or str(err)
        raise SpecError([Problem("", f"cannot read file: {reason}", file)]) from None


def _yaml() -> tuple[Any, bool]:
    """Import PyYAML as this module's ``yaml`` (a job given as data, such as the Slurm controller's
    job.json, is checked without it); the loader to compose with and whether it counts bytes."""
    global yaml
    import yaml

    try:  # the C composer is many times faster on large inputs
        from yaml import CSafeLoader

        return CSafeLoader, True  # libyaml reads the text as UTF-8 and counts bytes
    except ImportError:  # pragma: no cover - depends on how PyYAML was built
        return yaml.SafeLoader, False


def parse_documents(text: str, file: str) -> list[Document]:
    """Every non-empty document in ``text``; a syntax error becomes a SpecError with its line."""
    loader, in_bytes = _yaml()
    try:
        return _parse(text, file, loader, in_bytes)
    except _SurrogateEscape:
        # libyaml refuses ``"\\ud83d\\ude00"``, JSON's escape of a character beyond U+FFFF. PyYAML's
        # own (slower) reader takes each half, and the builder joins the pair.
        return _parse(text, file, yaml.SafeLoader, False)


def _order(problem: Problem) -> int:
    return problem.line or 0


class _SurrogateEscape(Exception):
    pass


def _parse(text: str, file: str, loader: Any, in_bytes: bool) -> list[Document]:
    builder = _Builder(file)
    documents: list[Document] = []
    current = 1  # the document being read, to say which one a syntax error is in
    try:
        for index, node in enumerate(yaml.compose_all(text, Loader=loader)):
            current = index + 2  # once this one is built, any error is in the next
            if node is None or (isinstance(node, yaml.ScalarNode) and node.tag == _NULL_TAG):
                continue  # an empty document, such as after a trailing '---', as kubectl skips it
            builder.lines = {}
            builder.values = 0  # the text is counted for the whole file: anchors are per document
            builder.merged = {}
            builder.duplicates = []
            current = index + 1
            data = builder.build(node, "")
            current = index + 2
            document = Document(data=data, file=file, lines=builder.lines, index=index)
            document.problems = builder.duplicates
            documents += _listed(document)
    except yaml.MarkedYAMLError as err:
        if loader is not yaml.SafeLoader and "Unicode character escape" in str(err.problem):
            raise _SurrogateEscape from None
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark is not None else None
        what = err.problem or err.context or "invalid YAML"
        if mark is not None:
            what = f"{what} (column {mark.column + 1})"
        context = err.context_mark
        if err.context and context is not None and mark is not None and context.line != mark.line:
            what = f"{what}, {err.context} that starts on line {context.line + 1}"
        if current > 1:
            what = f"{what} (in document {current})"
        raise SpecError([Problem("", f"invalid YAML or JSON: {what}", file, line)]) from None
    except yaml.reader.ReaderError as err:
        # A character YAML does not allow (control characters, for instance); say where it is.
        if in_bytes:
            before = text.encode("utf-8", "surrogatepass")[: err.position].decode("utf-8", "ignore")
        else:
            before = text[: err.position]
        line, column = before.count("\n") + 1, len(before) - before.rfind("\n")
        char = chr(err.character) if isinstance(err.character, int) else str(err.character)
        message = f"invalid YAML or JSON: character {char!r} is not allowed (column {column})"
        raise SpecError([Problem("", message, file, line)]) from None
    except yaml.YAMLError as err:
        raise SpecError([Problem("", f"invalid YAML or JSON: {' '.join(str(err).split())}", file)]) from None
    except _Stop as err:
        raise SpecError([Problem("", err.message, file, err.line)]) from None
    except RecursionError:
        raise SpecError([Problem("", "document is nested too deeply", file)]) from None
    if builder.problems:  # the documents cannot be read on: with the duplicates found so far
        raise SpecError(sorted(builder.problems + [p for d in documents for p in d.problems], key=_order))
    total = len({document.index for document in documents})
    if total > 1:
        for document in documents:
            document.total = total
    return documents


def _listed(document: Document) -> list[Document]:
    """A ``v1`` ``List`` (as ``kubectl get -o yaml`` and ``torchjob render`` print) as its items,
    each a document of its own; any other document as itself."""
    data = document.data
    if not (
        isinstance(data, dict)
        and data.get("apiVersion") == "v1"
        and data.get("kind") == "List"
        and isinstance(data.get("items"), list)
    ):
        return [document]
    items = []
    for i, item in enumerate(data["items"]):
        listed = Document(data=item, file=document.file, lines=document.lines, index=document.index)
        listed.prefix = f"items[{i}]"
        listed.problems = [p for p in document.problems if p.path.startswith(f"{listed.prefix}.")]
        items.append(listed)
    return items


def load_documents(file: str) -> list[Document]:
    from torchjob.spec import prefetch  # (not above: prefetch's child imports this module)

    documents = prefetch.take(file)  # read already by ``torchjob run``'s second process
    return documents if documents is not None else parse_documents(read_text(file), file)
