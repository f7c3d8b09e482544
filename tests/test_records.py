"""torchjob.records: dataclass-shaped records that are cheap to define."""

from __future__ import annotations

import copy
import pickle
from typing import Any, ClassVar

import pytest

from torchjob.records import FrozenRecordError, field, record, replace


@record
class Box:
    name: str
    size: int = 1
    tags: list[str] = field(default_factory=list)
    LIMIT: ClassVar[int] = 10


@record(frozen=True)
class Point:
    x: int
    y: int = 0


@record
class Labelled(Box):
    label: str = ""


@record
class Checked:
    value: int

    def __post_init__(self) -> None:
        if self.value < 0:
            raise ValueError("negative")


def test_fields_by_position_name_and_default() -> None:
    assert Box("a").size == 1 and Box("a", 2).size == 2 and Box(name="a", size=3).size == 3
    assert Box("a", tags=["t"]).tags == ["t"]
    first, second = Box("a"), Box("b")
    first.tags.append("x")
    assert second.tags == []  # a fresh default per record
    assert Box.LIMIT == 10 and "LIMIT" not in [f.name for f in Box.__record_fields__]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("args", "kwargs", "words"),
    [
        ((), {}, "missing field 'name'"),
        (("a",), {"name": "b"}, "field 'name' twice"),
        (("a",), {"colour": "red"}, "unknown field(s) 'colour'"),
        (("a", 1, [], "extra"), {}, "takes 3 fields, 4 were given"),
    ],
)
def test_wrong_calls_raise_type_errors(args: tuple[Any, ...], kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(TypeError, match=words.replace("(", r"\(").replace(")", r"\)")):
        Box(*args, **kwargs)


def test_repr_and_equality_by_class_and_values() -> None:
    assert repr(Box("a")) == "Box(name='a', size=1, tags=[])"
    assert Box("a") == Box("a", 1, []) and Box("a") != Box("a", 2)
    assert Labelled("a") != Box("a")  # another class is never equal
    assert Point(1, 2) != (1, 2)
    with pytest.raises(TypeError):
        hash(Box("a"))  # mutable records are unhashable, as dataclasses make them


def test_frozen_records_are_immutable_and_hashable() -> None:
    point = Point(1, 2)
    with pytest.raises(FrozenRecordError):
        point.x = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del point.y  # type: ignore[misc]
    assert hash(point) == hash(Point(1, 2)) and len({point, Point(1, 2), Point(2, 1)}) == 2


def test_replace_copies_with_changes_and_refuses_unknown_fields() -> None:
    point = Point(1, 2)
    assert replace(point, y=5) == Point(1, 5) and point == Point(1, 2)
    with pytest.raises(TypeError, match="has no field"):
        replace(point, z=1)


def test_inherited_fields_come_first() -> None:
    item = Labelled("a", 2, ["t"], "l")
    assert (item.name, item.size, item.tags, item.label) == ("a", 2, ["t"], "l")
    assert repr(item) == "Labelled(name='a', size=2, tags=['t'], label='l')"


def test_post_init_runs_after_the_fields_are_set() -> None:
    assert Checked(1).value == 1
    with pytest.raises(ValueError, match="negative"):
        Checked(-1)


def test_a_field_without_a_default_cannot_follow_one_with_a_default() -> None:
    with pytest.raises(TypeError, match="has no default but follows one that has"):

        @record
        class Bad:
            a: int = 0
            b: int  # type: ignore[misc]


def test_records_copy_and_pickle() -> None:
    box = Box("a", 2, ["t"])
    assert copy.deepcopy(box) == box and copy.deepcopy(box).tags is not box.tags
    assert pickle.loads(pickle.dumps(box)) == box
    assert pickle.loads(pickle.dumps(Point(1, 2))) == Point(1, 2)
    assert copy.copy(Point(3, 4)) == Point(3, 4)
