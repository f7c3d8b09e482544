"""Files written whole or read as they grow: atomic writes and following growing files by line.

Shared by the local engine (status, logs), the SDK (results, rendezvous progress) and the CLI.
"""

from __future__ import annotations

import os
from pathlib import Path

from torchjob.records import field, record

_READ_CHUNK = 1 << 16
_MAX_LINE = 1 << 16


def write_atomic(path: Path, data: str | bytes) -> None:
    """Replace ``path`` at once: a reader sees the old content or the new, never a part.

    The file is private (0600 whatever the umask: job state holds tokens and output), and the
    temporary file is always a new one, never a symlink someone planted in its place.
    """
    import contextlib

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # left by a process with this pid that died before the rename
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(tmp, flags, 0o600), "wb" if isinstance(data, bytes) else "w") as handle:
        handle.write(data)
    os.replace(tmp, path)


@record
class _Followed:
    path: Path
    prefix: str
    color: str
    offset: int = 0
    partial: bytes = b""
    closing: bool = False


@record
class LogFollower:
    """Reads new lines from growing log files; each line comes out with its file's prefix."""

    files: dict[Path, _Followed] = field(default_factory=dict)

    def follow(self, path: Path, prefix: str, color: str = "") -> None:
        if path in self.files:
            return
        self.files[path] = _Followed(path, prefix, color)

    def close(self, path: Path) -> None:
        """No more output will come: the next read also returns an unterminated last line."""
        if path in self.files:
            self.files[path].closing = True

    def read(self) -> list[tuple[_Followed, str]]:
        out: list[tuple[_Followed, str]] = []
        for path, item in list(self.files.items()):
            try:
                with open(path, "rb") as handle:
                    handle.seek(item.offset)
                    data = handle.read(_READ_CHUNK * 16)
            except OSError:
                data = b""
            item.offset += len(data)
            data = item.partial + data
            *lines, item.partial = data.split(b"\n")
            if len(item.partial) > _MAX_LINE:  # no newline in sight: print what there is
                lines.append(item.partial)
                item.partial = b""
            out.extend((item, _text(line)) for line in lines)
            if item.closing:
                more = path.exists() and path.stat().st_size > item.offset
                if not more:
                    if item.partial:
                        out.append((item, _text(item.partial)))
                    del self.files[path]
        return out


def _text(line: bytes) -> str:
    """One output line; of a line redrawn with carriage returns (progress bars) only its last state."""
    parts = [p for p in line.split(b"\r") if p]
    return (parts[-1] if parts else b"").decode(errors="replace")
