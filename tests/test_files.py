"""torchjob/files.py: whole-file writes that a reader sees entirely old or entirely new."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from torchjob import files
from torchjob.files import swap_in, write_atomic


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("exchange", [True, False], ids=["names-exchanged", "os-replace"])
def test_a_write_over_a_file_leaves_the_new_content_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    if not exchange:
        monkeypatch.setattr(files, "_exchange", [None])  # as where names cannot be exchanged
    path = tmp_path / "status.json"
    write_atomic(path, "first")  # no file there yet
    old = os.open(path, os.O_RDONLY)
    try:
        write_atomic(path, "second" * 100)
        assert path.read_text() == "second" * 100
        assert os.read(old, 100) == b"first"  # a reader of the old file reads it to its end
    finally:
        os.close(old)
    assert (path.stat().st_mode & 0o777) == 0o600
    assert _leftovers(tmp_path) == []


def test_names_are_exchanged_where_the_system_can(tmp_path: Path) -> None:
    """On Linux (glibc 2.28+) with a file system that exchanges names (ext4, tmpfs, xfs, btrfs)."""
    if files._find_exchange() is None:
        pytest.skip("no renameat2 in this libc")
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("new")
    b.write_text("old")
    calls: list[str] = []
    real = files._exchange[-1]

    def counted(*args: object) -> int:
        calls.append("exchange")
        return int(real(*args))

    files._exchange[:] = [counted]
    try:
        swap_in(a, b)
    finally:
        files._exchange[:] = [real]
    if b.read_text() == "new" and not a.exists() and calls:
        return
    pytest.fail(f"not exchanged: {calls}, {b.read_text()!r}, {a.exists()}")


def test_a_symlink_at_the_path_is_replaced_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("someone else's")
    path = tmp_path / "status.json"
    path.symlink_to(target)
    write_atomic(path, "mine")
    assert not path.is_symlink() and path.read_text() == "mine"
    assert target.read_text() == "someone else's"


def test_readers_never_see_a_part_of_a_write(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    texts = ["a" * 5000, "b" * 7000]
    write_atomic(path, texts[0])
    seen: set[str] = set()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            seen.add(path.read_text())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(300):
            write_atomic(path, texts[i % 2])
    finally:
        stop.set()
        reader.join(timeout=30)
    assert seen <= set(texts)


def _line_of(function: object, text: str) -> int:
    """The number of the line of ``function``'s source that holds ``text``."""
    import inspect

    lines, first = inspect.getsourcelines(function)  # type: ignore[arg-type]
    (found,) = [first + i for i, line in enumerate(lines) if text in line]
    return found


@pytest.mark.parametrize("where", ["handle.write(data)", "swap_in(tmp, path)"])
def test_a_ctrl_c_inside_the_write_leaves_the_old_file_and_no_temporary_file(
    tmp_path: Path, where: str
) -> None:
    """A KeyboardInterrupt raised where write_atomic is about to write, or to rename what it wrote,
    as a Ctrl-C landing there raises it (by a trace function: Python raises it into the frame)."""
    import sys

    path = tmp_path / "last-started.json"
    write_atomic(path, "old")
    line = _line_of(write_atomic, where)
    hit: list[int] = []

    def tracer(frame: Any, event: str, arg: object) -> Any:
        if frame.f_code is not write_atomic.__code__:
            return None
        if event == "line" and frame.f_lineno == line:
            hit.append(line)
            assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir())  # made, not yet renamed
            raise KeyboardInterrupt
        return tracer

    before = sys.gettrace()
    sys.settrace(tracer)
    try:
        with pytest.raises(KeyboardInterrupt):
            write_atomic(path, "new")
    finally:
        sys.settrace(before)
    assert hit == [line]
    assert path.read_text() == "old"
    assert _leftovers(tmp_path) == []


def test_text_that_cannot_be_encoded_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    with pytest.raises(UnicodeEncodeError):
        write_atomic(path, "half \udc80")  # a lone surrogate: no encoding writes it
    assert not path.exists()
    assert _leftovers(tmp_path) == []


def test_libc_is_looked_up_at_the_first_write_over_a_file_not_at_a_new_files(tmp_path: Path) -> None:
    """The Slurm controller's writes before its first pod all make new files: ctypes (2-3 ms) waits."""
    import subprocess
    import sys

    program = (
        "import sys; from pathlib import Path; from torchjob.files import write_atomic\n"
        "path = Path(sys.argv[1]) / 'status.json'\n"
        "write_atomic(path, 'first'); print('ctypes' in sys.modules)\n"
        "write_atomic(path, 'second'); print('ctypes' in sys.modules, path.read_text())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program, str(tmp_path)], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.splitlines() == ["False", "True second"]
