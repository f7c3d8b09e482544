"""Typed record classes that cost next to nothing to define: ``@record``, ``field`` and ``replace``.

A record is declared like a dataclass: annotated fields, defaults, ``field(default_factory=...)``,
``@record(frozen=True)`` for an immutable one. It gets an ``__init__`` taking the fields by position
or by name, ``__repr__``, ``__eq__`` (same class, same values) and, when frozen, ``__hash__`` and
assignments that raise. mypy checks records as dataclasses (``dataclass_transform``, PEP 681).

Why not dataclasses: defining a dataclass compiles its methods from generated source, about half a
millisecond per class, and ``import dataclasses`` loads ``inspect``. ``torchjob run`` defines some
35 records before a job's first process starts, so that was about 25 ms of its start-up, a quarter
of it. msgspec's Structs, tried next, are defined in microseconds, but importing msgspec loads
``typing_extensions`` and ``inspect`` too (about 14 ms). Here every class shares the same few
methods, which read the class's field list. The SDK's public configs stay dataclasses.
"""

from __future__ import annotations

from collections.abc import Callable

from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, TypeVar, overload

    from typing_extensions import dataclass_transform

    T = TypeVar("T")
    C = TypeVar("C", bound=type)
else:

    def dataclass_transform(**_options: object) -> Callable[[Any], Any]:
        return lambda decorator: decorator


__all__ = ["FrozenRecordError", "field", "record", "replace"]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


_MISSING: Any = _Missing()


class FrozenRecordError(AttributeError):
    """Raised on assigning to a field of a frozen record."""


class _Field:
    __slots__ = ("default", "factory", "name")

    def __init__(self, default: Any = _MISSING, factory: Callable[[], Any] | None = None) -> None:
        self.name = ""
        self.default = default
        self.factory = factory


if TYPE_CHECKING:

    @overload
    def field(*, default: T) -> T: ...
    @overload
    def field(*, default_factory: Callable[[], T]) -> T: ...


def field(*, default: Any = _MISSING, default_factory: Callable[[], Any] | None = None) -> Any:
    """A field's default, or a function making a fresh default for each record (``list``, ``dict``)."""
    if default is not _MISSING and default_factory is not None:
        raise ValueError("give a field a default or a default_factory, not both")
    return _Field(default, default_factory)


def _is_class_var(annotation: object) -> bool:
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return text.startswith(("ClassVar", "typing.ClassVar", "t.ClassVar"))


def _fields_of(cls: type) -> tuple[_Field, ...]:
    inherited: dict[str, _Field] = {}
    for base in reversed(cls.__mro__[1:]):
        for f in base.__dict__.get("__record_fields__", ()):
            inherited[f.name] = f
    own: dict[str, _Field] = {}
    annotations = cls.__dict__.get("__annotations__", {})  # noqa: RUF063 - inspect is what we avoid
    for name, annotation in annotations.items():
        if _is_class_var(annotation):
            continue
        value = cls.__dict__.get(name, _MISSING)
        f = value if isinstance(value, _Field) else _Field(value)
        f.name = name
        if isinstance(value, _Field):  # the class attribute becomes the plain default, as in dataclasses
            if f.default is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        own[name] = f
    fields = tuple({**inherited, **own}.values())
    seen_default = False
    for f in fields:
        has_default = f.default is not _MISSING or f.factory is not None
        if seen_default and not has_default:
            raise TypeError(f"{cls.__qualname__}: field {f.name!r} has no default but follows one that has")
        seen_default = seen_default or has_default
    return fields


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    fields: tuple[_Field, ...] = type(self).__record_fields__
    put = object.__setattr__  # also for frozen records
    if len(args) == len(fields) and not kwargs:  # the common, fast case
        for f, value in zip(fields, args, strict=True):
            put(self, f.name, value)
    else:
        if len(args) > len(fields):
            raise TypeError(f"{type(self).__qualname__}() takes {len(fields)} fields, {len(args)} were given")
        for i, f in enumerate(fields):
            if i < len(args):
                if f.name in kwargs:
                    raise TypeError(f"{type(self).__qualname__}() got field {f.name!r} twice")
                value = args[i]
            elif f.name in kwargs:
                value = kwargs.pop(f.name)
            elif f.factory is not None:
                value = f.factory()
            elif f.default is not _MISSING:
                value = f.default
            else:
                raise TypeError(f"{type(self).__qualname__}() is missing field {f.name!r}")
            put(self, f.name, value)
        if kwargs:
            raise TypeError(
                f"{type(self).__qualname__}() got unknown field(s) {', '.join(map(repr, kwargs))}"
            )
    post_init = getattr(self, "__post_init__", None)
    if post_init is not None:
        post_init()


def _values(self: Any) -> tuple[Any, ...]:
    return tuple(getattr(self, f.name) for f in type(self).__record_fields__)


def _repr(self: Any) -> str:
    parts = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in type(self).__record_fields__)
    return f"{type(self).__qualname__}({parts})"


def _eq(self: Any, other: object) -> object:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return bool(_values(self) == _values(other))


def _hash(self: Any) -> int:
    return hash((type(self), *_values(self)))


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    raise FrozenRecordError(f"cannot assign to field {name!r} of a frozen {type(self).__qualname__}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise FrozenRecordError(f"cannot delete field {name!r} of a frozen {type(self).__qualname__}")


if TYPE_CHECKING:

    @overload
    def record(cls: C, /) -> C: ...
    @overload
    def record(*, frozen: bool = False) -> Callable[[C], C]: ...


@dataclass_transform(field_specifiers=(field,))
def record(cls: Any = None, /, *, frozen: bool = False) -> Any:
    """Make ``cls`` a record (see the module's docstring); ``@record`` or ``@record(frozen=True)``."""

    def make(cls: Any) -> Any:
        cls.__record_fields__ = _fields_of(cls)
        cls.__init__ = _init
        cls.__repr__ = _repr
        cls.__eq__ = _eq
        if frozen:
            cls.__setattr__ = _frozen_setattr
            cls.__delattr__ = _frozen_delattr
            cls.__hash__ = _hash
        else:
            cls.__hash__ = None  # mutable and compared by value: unhashable, as dataclasses make it
        return cls

    return make if cls is None else make(cls)


def replace(obj: T, /, **changes: Any) -> T:
    """A copy of the record ``obj`` with ``changes`` applied (fields by name)."""
    fields: tuple[_Field, ...] = type(obj).__record_fields__  # type: ignore[attr-defined]
    unknown = set(changes) - {f.name for f in fields}
    if unknown:
        raise TypeError(f"{type(obj).__qualname__} has no field(s) {', '.join(sorted(unknown))}")
    return type(obj)(*(changes.get(f.name, getattr(obj, f.name)) for f in fields))
