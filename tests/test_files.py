"""torchjob/files.py: whole-file writes that a reader sees entirely old or entirely new."""

from __future__ import annotations

import os
import threading
from pathlib import Path

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
