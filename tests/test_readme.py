"""The README's examples work as written (issue 34, item 8)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from torchjob.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_sdk_example_renders_as_the_readme_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    text = README.read_text()
    code = re.search(r"## From Python\n.*?```python\n(.*?)```", text, re.S)
    assert code is not None
    (tmp_path / "file.py").write_text(code[1])  # "Saved as `file.py`"
    prose = " ".join(text[code.end() :].split())  # the commands may wrap across lines
    found = re.search(r"`(torchjob render file\.py:allreduce[^`]*)`", prose)
    assert found is not None, "the README no longer shows how to render the example"
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(found[1])[1:]
    assert main(argv) == 0, capfd.readouterr().err
    items = yaml.safe_load(capfd.readouterr().out)["items"]
    pods = {i["metadata"]["name"]: i for i in items if i["kind"] == "Pod"}
    assert sorted(pods) == ["allreduce-master-0", "allreduce-worker-0", "allreduce-worker-1"]
    command = pods["allreduce-master-0"]["spec"]["containers"][0]["command"]
    given = argv[argv.index("--") + 1 :]  # what the README passes the task reaches every pod
    assert command[command.index("--task-args") + 1] == str(given).replace("'", '"')
