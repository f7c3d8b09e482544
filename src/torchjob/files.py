"""Files written whole or read as they grow: atomic writes and following growing files by line.

Shared by the local engine (status, logs), the SDK (results, rendezvous progress) and the CLI.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from torchjob.records import field, record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

_READ_CHUNK = 1 << 16
_MAX_LINE = 1 << 16
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_exchange: list[Any] = []  # libc's renameat2 once looked up, or None where there is none


def write_atomic(path: Path, data: str | bytes) -> None:
    """Replace ``path`` at once: a reader sees the old content or the new, never a part.

    The file is private (0600 whatever the umask: job state holds tokens and output), and the
    temporary file is always a new one, never a symlink someone planted in its place.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # left by a process with this pid that died before the rename
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        with os.fdopen(os.open(tmp, flags, 0o600), "wb" if isinstance(data, bytes) else "w") as handle:
            handle.write(data)
        swap_in(tmp, path)
    except BaseException:
        # Whatever ends the write (a full disk, text that cannot be encoded, a Ctrl-C landing in
        # it) leaves no temporary file behind: no later write of this pid is sure to remove it.
        tmp.unlink(missing_ok=True)
        raise


def swap_in(tmp: str | Path, path: str | Path, dir_fd: int | None = None) -> None:
    """Move ``tmp`` onto ``path`` at once, as ``os.replace`` does (both relative to ``dir_fd``).

    Renamed over an existing file, ext4 (its default ``auto_da_alloc``) first writes the new file's
    data to disk: 2-7 ms measured here for each status or registry update, three of them in the
    last milliseconds of every job. Exchanging the two names (``renameat2``'s RENAME_EXCHANGE) and
    removing the old file is as atomic for a reader and skips that flush; what is given up is
    ext4's guard against finding the file empty after the machine crashed, which every reader of
    these files takes as a damaged file (a job's status: phase Unknown). Where names cannot be
    exchanged (another system or file system, or no file at ``path`` yet): ``os.replace``.
    """
    # libc is looked up (ctypes, 2-3 ms) at the first write over a file, not before: a program's
    # first writes make new files (the Slurm controller's before its first pod).
    if not _exchange and not _exists(path, dir_fd):
        call = None
    else:
        call = _exchange[0] if _exchange else _find_exchange()
    if call is not None:
        at = _AT_FDCWD if dir_fd is None else dir_fd
        if call(at, os.fsencode(tmp), at, os.fsencode(path), _RENAME_EXCHANGE) == 0:
            # The old file, under the temporary name now; one that cannot be removed is left as a
            # dead process's temporary file is, for the next write of this name to remove.
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            return
    os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _exists(path: str | Path, dir_fd: int | None) -> bool:
    try:
        os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # the exchange is tried, as before, and says what it finds
    return True


def _find_exchange() -> Any:
    call = None
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            call = ctypes.CDLL(None, use_errno=True).renameat2
            call.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
            call.restype = ctypes.c_int
        except (OSError, AttributeError):  # a libc without it (glibc before 2.28)
            call = None
    _exchange.append(call)
    return call


def append_private(path: Path, text: str) -> None:
    """Add ``text`` to a log file (created 0600, never through a symlink): torchjob's own lines in
    a container's log. Lost, not fatal, when it cannot be written (a full disk)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    try:
        os.write(fd, text.encode())
    except OSError:
        pass
    finally:
        os.close(fd)


@record
class _Followed:
    path: Path
    prefix: str
    color: str
    offset: int = 0
    partial: bytes = b""
    closing: bool = False
    end: int | None = None  # read no further (see LogFollower.seal)
    shown: str = ""  # the state of an unfinished progress line last given by LogFollower.progress


@record
class LogFollower:
    """Reads new lines from growing log files; each line comes out with its file's prefix."""

    files: dict[Path, _Followed] = field(default_factory=dict)

    def follow(self, path: Path, prefix: str, color: str = "") -> None:
        if path not in self.files:
            self.files[path] = _Followed(path, prefix, color)

    def close(self, path: Path) -> None:
        """No more output will come: the next read also returns an unterminated last line."""
        if path in self.files:
            self.files[path].closing = True

    def seal(self) -> None:
        """Every file is closed at its present size: what a process that survived the end of its
        job still writes is not waited for."""
        for item in self.files.values():
            item.closing = True
            try:
                item.end = item.path.stat().st_size
            except OSError:
                item.end = item.offset

    def read(self) -> list[tuple[_Followed, str]]:
        out: list[tuple[_Followed, str]] = []
        for path, item in list(self.files.items()):
            if not item.closing:  # most reads find nothing new: a stat, not an open, says so
                try:
                    if os.stat(path).st_size <= item.offset:
                        continue
                except OSError:
                    continue
            size = _READ_CHUNK * 16 if item.end is None else min(_READ_CHUNK * 16, item.end - item.offset)
            try:
                with open(path, "rb") as handle:
                    handle.seek(item.offset)
                    data = handle.read(size) if size > 0 else b""
            except OSError:
                data = b""
            item.offset += len(data)
            data = item.partial + data
            *lines, item.partial = data.split(b"\n")
            if len(item.partial) > _MAX_LINE:  # no newline in sight: print what there is
                lines.append(item.partial)
                item.partial = b""
            out.extend((item, _text(line)) for line in lines)
            if lines:
                item.shown = ""
            if item.closing:
                more = path.exists() and path.stat().st_size > item.offset
                if not more or (item.end is not None and item.offset >= item.end):
                    if item.partial:
                        out.append((item, _text(item.partial)))
                    del self.files[path]
        return out

    def progress(self) -> list[tuple[_Followed, str]]:
        """Unfinished lines redrawn with carriage returns (tqdm's progress bars): the present state
        of each that changed since the last call, for a terminal to show before the line ends.
        (:meth:`read` gives each line once it ends, with its last state.)"""
        out: list[tuple[_Followed, str]] = []
        for item in self.files.values():
            if b"\r" not in item.partial:
                continue
            state = _text(item.partial)
            if state and state != item.shown:
                item.shown = state
                out.append((item, state))
        return out

    def skip(self) -> int:
        """Forget every followed file; returns how many lines were left unread in them."""
        count = 0
        for path, item in list(self.files.items()):
            rest = item.partial
            try:
                with open(path, "rb") as handle:
                    handle.seek(item.offset)
                    left = item.end - item.offset if item.end is not None else None
                    while (left is None or left > 0) and (chunk := handle.read(_READ_CHUNK * 16)):
                        if left is not None:
                            chunk, left = chunk[:left], left - len(chunk)
                        count += chunk.count(b"\n")
                        rest = chunk.rpartition(b"\n")[2] if b"\n" in chunk else rest + chunk
            except OSError:
                pass
            count += 1 if rest else 0  # an unterminated last line
            del self.files[path]
        return count


def _text(line: bytes) -> str:
    """One output line; of a line redrawn with carriage returns (progress bars) only its last state."""
    parts = [p for p in line.split(b"\r") if p]
    return (parts[-1] if parts else b"").decode(errors="replace")
