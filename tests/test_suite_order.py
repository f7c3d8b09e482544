"""The suite's order (suite_order.py): its longest tests first, each named as it is collected."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from suite_order import SLOW_FIRST

REPO = Path(__file__).resolve().parent.parent


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def test_each_slow_test_named_is_a_test_of_its_file() -> None:
    """A renamed or removed test leaves the list (its old id would silently stop counting)."""
    missing = []
    for nodeid in SLOW_FIRST:
        file, name = nodeid.split("::")
        path = REPO / file
        if not path.is_file() or name.split("[", 1)[0] not in _test_functions(path):
            missing.append(nodeid)
    assert missing == []
    assert len(set(SLOW_FIRST)) == len(SLOW_FIRST)


def test_the_named_tests_go_first_in_the_lists_order_and_the_rest_keep_theirs() -> None:
    """conftest.py's collection hook, on a collection holding two of them among others."""
    from conftest import pytest_collection_modifyitems

    names = [
        "tests/test_a.py::one",
        SLOW_FIRST[1],
        "tests/test_b.py::two",
        SLOW_FIRST[0],
        "tests/test_c.py::x",
    ]
    items: list[Any] = [SimpleNamespace(nodeid=name) for name in names]
    pytest_collection_modifyitems(items)
    assert [item.nodeid for item in items] == [
        SLOW_FIRST[0],
        SLOW_FIRST[1],
        "tests/test_a.py::one",
        "tests/test_b.py::two",
        "tests/test_c.py::x",
    ]


def test_a_module_with_a_module_fixture_is_listed_whole_and_together() -> None:
    """Else the fixture (a Slurm cluster, say) would be set up once more for the tests moved."""
    files = [nodeid.split("::")[0] for nodeid in SLOW_FIRST]
    for file in dict.fromkeys(files):
        path = REPO / file
        if 'scope="module"' not in path.read_text():
            continue
        at = [i for i, name in enumerate(files) if name == file]
        assert at == list(range(at[0], at[0] + len(at))), f"{file}: its tests are not next to each other"
        listed = {SLOW_FIRST[i].split("::")[1].split("[", 1)[0] for i in at}
        tests = {name for name in _test_functions(path) if name.startswith("test_")}
        assert listed == tests, f"{file}: not all of its tests are listed"
