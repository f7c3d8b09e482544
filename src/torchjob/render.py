"""Print a desired state as a Kubernetes ``List`` in YAML or JSON, byte-for-byte deterministic.

Rendered manifests are plain data (mappings, lists, strings, numbers, booleans, null), so the YAML
is written by a small emitter here rather than by PyYAML: PyYAML's representer is pure Python and
took about 15 s for a 10,000-pod job. The emitter quotes every string a YAML 1.1 reader (PyYAML,
or the Go reader behind ``kubectl``) could mistake for another type, and the tests check that
every output reads back to the very object it came from. It does not import PyYAML at all (13 ms,
which ``torchjob run`` would pay while its first pods start, as it writes its records): which
plain words YAML 1.1 reads as other types is decided here, and a test holds it to PyYAML's resolver.
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys
from collections.abc import Callable, Iterable

from torchjob.expand import DesiredState, paused_gc
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

FORMATS = ("yaml", "json")

# Strings written unquoted: common names, paths, images, host names.
_PLAIN = re.compile(r"[A-Za-z0-9_./][A-Za-z0-9_./:@+=-]*\Z")
# Strings that look like numbers to some YAML reader (Go reads 1e3 as a float, PyYAML does not).
_NUMBERISH = re.compile(r"[-+.0-9][-+.0-9a-fA-FxXoObB_:]*\Z")
# Words Go's YAML 1.1 reader takes as booleans beyond the ones PyYAML knows.
_GO_BOOLS = frozenset({"y", "Y", "n", "N"})
# Characters that may stand in a single-quoted scalar unescaped: YAML-printable, minus the
# characters YAML 1.1 treats as line breaks (U+0085, U+2028, U+2029) and the byte order mark.
# The two character classes below take about 5 ms to compile, so they are compiled on the first
# text that is not plain printable ASCII (``torchjob run`` writes its records after its first
# pods started, and such text is rare).
_NON_ASCII_PRINTABLE = "\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff"


@functools.cache
def _quotable() -> re.Pattern[str]:
    return re.compile(f"[\x20-\x7e{_NON_ASCII_PRINTABLE}]*\\Z")


@functools.cache
def _literal_line() -> re.Pattern[str]:
    """Lines allowed inside a literal block scalar (tabs are fine as content there)."""
    return re.compile(f"[\t\x20-\x7e{_NON_ASCII_PRINTABLE}]*\\Z")


def _is_quotable(text: str) -> bool:
    # For ASCII text, isprintable() is exactly the range 0x20-0x7e.
    return (text.isascii() and text.isprintable()) or _quotable().match(text) is not None


def _is_literal_line(line: str) -> bool:
    if line.isascii() and line.replace("\t", " ").isprintable():
        return True
    return _literal_line().match(line) is not None


# What YAML 1.1 reads as a boolean, a null or a float among the strings _PLAIN lets through and
# _NUMBERISH does not catch (every integer and decimal float form is "numberish"): whole words...
_YAML11_WORDS = frozenset(
    {"yes", "Yes", "YES", "no", "No", "NO", "true", "True", "TRUE", "false", "False", "FALSE"}
    | {"on", "On", "ON", "off", "Off", "OFF", "null", "Null", "NULL"}
    | {".inf", ".Inf", ".INF", ".nan", ".NaN", ".NAN"}
)
# ... and a timestamp with its time (a date alone is numberish); no blanks: _PLAIN has none.
_TIMESTAMP = re.compile(
    r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}[Tt][0-9]{1,2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]*)?"
    r"(?:Z|[-+][0-9]{1,2}(?::[0-9]{2})?)?\Z"
)
# YAML allows at most 1024 characters in an implicit key.
_MAX_IMPLICIT_KEY = 1000


def as_list(states: list[DesiredState]) -> dict[str, Any]:
    """Job-level objects first (so ``kubectl apply`` creates the ConfigMap before the pods)."""
    items: list[dict[str, Any]] = []
    for state in states:
        items.extend(state.objects)
        items.extend(p.manifest for p in state.pods)
    return list_of(items)


def dump(obj: Any, fmt: str) -> str:
    if fmt == "json":
        return dump_json(obj)
    if fmt == "yaml":
        return dump_yaml(obj)
    raise ValueError(f"unknown output format {fmt!r}; expected one of {', '.join(FORMATS)}")


def _is_date(value: Any) -> bool:
    """A ``datetime.date`` (or datetime), without importing the module for values that cannot be one."""
    module = sys.modules.get("datetime")
    return module is not None and isinstance(value, module.date)


def _float(value: float) -> str:
    """A float as YAML 1.1 writes it ('1.0e-05', '.inf', '.nan'): read back as the same float by
    PyYAML and Go alike. Python's repr, lower case, with a '.0' where YAML 1.1 needs a dot."""
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    text = repr(value).lower()
    if "." not in text and "e" in text:  # 1e+17: YAML 1.1's float has a dot
        text = text.replace("e", ".0e", 1)
    return text


def _json_default(value: Any) -> Any:
    # The YAML loader turns unquoted dates into date objects; print them as the text they were.
    if _is_date(value):
        return value.isoformat()
    raise TypeError(f"cannot print a {type(value).__name__} as JSON")


class _JsonWriter:
    """The exact text of ``json.dumps(obj, indent=2, ensure_ascii=False)``, several times faster.

    The standard library only uses its C encoder without ``indent``; with it, encoding a
    10,000-pod job took about 1.5 s.
    """

    def __init__(self) -> None:
        self.out: list[str] = []
        self._strings: dict[str, str] = {}

    def string(self, text: str) -> str:
        encoded = self._strings.get(text)
        if encoded is None:
            encoded = self._strings[text] = _encode_string(text)
        return encoded

    def key(self, key: Any) -> str:
        if isinstance(key, str):
            return self.string(key)
        if key is True or key is False or key is None:
            return f'"{json.dumps(key)}"'
        if isinstance(key, int | float):
            return f'"{json.dumps(key)}"'
        raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")

    def value(self, value: Any, indent: str) -> None:
        out = self.out
        kind = type(value)
        if kind is str:
            out.append(self.string(value))
        elif kind is dict or isinstance(value, dict):
            if not value:
                out.append("{}")
                return
            inner = indent + "  "
            sep = "{\n" + inner
            for k, v in value.items():
                out.append(sep + self.key(k) + ": ")
                sep = ",\n" + inner
                if type(v) is str:
                    out.append(self.string(v))
                else:
                    self.value(v, inner)
            out.append("\n" + indent + "}")
        elif kind is list or isinstance(value, list):
            if not value:
                out.append("[]")
                return
            inner = indent + "  "
            sep = "[\n" + inner
            for item in value:
                out.append(sep)
                sep = ",\n" + inner
                self.value(item, inner)
            out.append("\n" + indent + "]")
        else:
            out.append(json.dumps(value, default=_json_default))


_encode_string: Callable[[str], str] = json.encoder.encode_basestring


def dump_json(obj: Any) -> str:
    """Indented JSON (two spaces), the way ``kubectl get -o json`` prints."""
    writer = _JsonWriter()
    with paused_gc():
        writer.value(obj, "")
        return "".join(writer.out) + "\n"


# ---------------------------------------------------------------------------------------------
# YAML


def _double_quoted(text: str) -> str:
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif 0x20 <= code <= 0x7E or (code > 0x7E and _is_quotable(ch)):
            out.append(ch)
        elif code <= 0xFF:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def _needs_quotes(text: str) -> bool:
    if not _PLAIN.match(text) or text.endswith(":"):
        return True
    if text in _GO_BOOLS or _NUMBERISH.match(text):
        return True
    return text in _YAML11_WORDS or (text[0].isdigit() and _TIMESTAMP.match(text) is not None)


def _inline_string(text: str) -> str:
    """A string as a one-line scalar: plain when safe, else single- or double-quoted."""
    if not _needs_quotes(text):
        return text
    if _is_quotable(text):
        return "'" + text.replace("'", "''") + "'"
    return _double_quoted(text)


def _literal_block(text: str, indent: str) -> str | None:
    """A multi-line string as a literal block (``|``), or None when one cannot hold it exactly."""
    if text[0] in " \t\n":  # leading blanks would need an explicit indentation indicator
        return None
    body = text.rstrip("\n")
    trailing = len(text) - len(body)
    lines = body.split("\n")
    if not all(_is_literal_line(line) for line in lines):
        return None
    chomp = "-" if trailing == 0 else ("" if trailing == 1 else "+")
    pad = indent + "  "
    parts = [f"|{chomp}\n"]
    parts.extend(f"{pad}{line}\n" if line else "\n" for line in lines)
    parts.append("\n" * max(trailing - 1, 0))
    return "".join(parts)


def _other_scalar(value: Any) -> str:
    if isinstance(value, float):
        return _float(value)
    if _is_date(value):
        return _inline_string(value.isoformat())
    raise TypeError(f"cannot print a {type(value).__name__} as YAML")


class _YamlWriter:
    """Block-style YAML in PyYAML's layout: two-space indents, list items level with their key."""

    def __init__(self) -> None:
        self.out: list[str] = []
        self._strings: dict[str, str] = {}
        self._keys: dict[str, str] = {}
        self._prefixes: dict[str, dict[Any, str]] = {}
        self._blocks: dict[tuple[str, str], str] = {}

    def scalar(self, value: Any, indent: str) -> str:
        if type(value) is str:
            cached = self._strings.get(value)
            if cached is not None:
                return cached
            if "\n" in value:
                # A block's lines depend on the indentation, so these are cached per indent.
                block = self._blocks.get((value, indent))
                if block is None:
                    block = _literal_block(value, indent) or _double_quoted(value) + "\n"
                    self._blocks[(value, indent)] = block
                return block
            text = _inline_string(value) + "\n"
            self._strings[value] = text
            return text
        if value is True:
            return "true\n"
        if value is False:
            return "false\n"
        if value is None:
            return "null\n"
        if type(value) is int:
            return f"{value}\n"
        if isinstance(value, dict):
            return "{}\n"  # only empty ones get here
        if isinstance(value, list):
            return "[]\n"
        return _other_scalar(value) + "\n"

    def key(self, key: Any) -> str:
        cached = self._keys.get(key) if type(key) is str else None
        if cached is not None:
            return cached
        if type(key) is str:
            text = "" if "\n" in key else _inline_string(key)
            text = text if text and len(text) <= _MAX_IMPLICIT_KEY else ""
        else:
            text = self.scalar(key, "")[:-1]
        if not text:
            # Long or multi-line keys need YAML's explicit form; they are rare enough to not cache.
            return f"? {_double_quoted(str(key))}\n"
        text += ":"
        if type(key) is str:
            self._keys[key] = text
        return text

    def prefixes(self, indent: str) -> dict[Any, str]:
        """``key`` -> ``<indent>key:`` for one indentation level (keys repeat across pods)."""
        cache = self._prefixes.get(indent)
        if cache is None:
            cache = self._prefixes[indent] = {}
        return cache

    def mapping(self, data: dict[Any, Any], indent: str) -> None:
        out = self.out
        append = out.append
        strings = self._strings
        prefixes = self.prefixes(indent)
        child = indent + "  "
        for k, v in data.items():
            prefix = prefixes.get(k) if type(k) is str else None
            if prefix is None:
                key = self.key(k)
                if key[0] == "?":  # explicit key: '? key' then ': value' on the next line
                    append(indent + key)
                    prefix = indent + ":"
                else:
                    prefix = indent + key
                    if type(k) is str:
                        prefixes[k] = prefix
            kind = type(v)
            if kind is str:
                text = strings.get(v)
                append(prefix + " " + (text if text is not None else self.scalar(v, indent)))
            elif (kind is dict or isinstance(v, dict)) and v:
                append(prefix + "\n")
                self.mapping(v, child)
            elif (kind is list or isinstance(v, list)) and v:
                append(prefix + "\n")
                self.sequence(v, indent)
            else:
                append(prefix + " " + self.scalar(v, indent))

    def sequence(self, items: list[Any], indent: str) -> None:
        out = self.out
        child = indent + "  "
        dash = indent + "- "
        cut = len(child)
        for item in items:
            kind = type(item)
            if (kind is dict or isinstance(item, dict)) and item:
                start = len(out)
                self.mapping(item, child)
                out[start] = dash + out[start][cut:]
            elif (kind is list or isinstance(item, list)) and item:
                start = len(out)
                self.sequence(item, child)
                out[start] = dash + out[start][cut:]
            else:
                out.append(dash + self.scalar(item, indent))


def dump_yaml(obj: Any) -> str:
    """Block-style YAML for plain data; a mapping at the top, as every Kubernetes object is."""
    writer = _YamlWriter()
    with paused_gc():
        if isinstance(obj, dict) and obj:
            writer.mapping(obj, "")
        elif isinstance(obj, list) and obj:
            writer.sequence(obj, "")
        else:
            writer.out.append(writer.scalar(obj, ""))
        return "".join(writer.out)


# ---------------------------------------------------------------------------------------------
# Streaming: the same bytes as ``dump(list_of(items), fmt)``, written one item at a time so a
# large job never holds all of its text (or all of its pods, when ``items`` is a generator).

_FLUSH_AT = 1 << 20  # characters buffered before a write


def list_of(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": items}


def write_list(items: Iterable[dict[str, Any]], fmt: str, write: Callable[[str], Any]) -> None:
    """Write a Kubernetes ``List`` of ``items`` in ``fmt``, byte-identical to :func:`dump`."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown output format {fmt!r}; expected one of {', '.join(FORMATS)}")
    buffered: list[str] = []
    size = 0

    def emit(text: str) -> None:
        nonlocal size
        buffered.append(text)
        size += len(text)
        if size >= _FLUSH_AT:
            write("".join(buffered))
            buffered.clear()
            size = 0

    if fmt == "yaml":
        _write_yaml_items(items, emit)
    else:
        _write_json_items(items, emit)
    if buffered:
        write("".join(buffered))


def _write_yaml_items(items: Iterable[dict[str, Any]], emit: Callable[[str], None]) -> None:
    writer = _YamlWriter()
    emit("apiVersion: v1\nkind: List\n")
    empty = True
    for item in items:
        if empty:
            emit("items:\n")
            empty = False
        with paused_gc():
            writer.sequence([item], "")
            emit("".join(writer.out))
        writer.out.clear()
    if empty:
        emit("items: []\n")


def _write_json_items(items: Iterable[dict[str, Any]], emit: Callable[[str], None]) -> None:
    writer = _JsonWriter()
    emit('{\n  "apiVersion": "v1",\n  "kind": "List",\n  "items": ')
    separator = "[\n    "
    for item in items:
        with paused_gc():
            writer.value(item, "    ")
            emit(separator + "".join(writer.out))
        writer.out.clear()
        separator = ",\n    "
    emit("[]" if separator == "[\n    " else "\n  ]")
    emit("\n}\n")
