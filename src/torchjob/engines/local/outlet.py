"""Writing to the caller's terminal or pipe without ever waiting for its reader.

A stalled reader (``| less`` not scrolled, Ctrl-S, ``| sleep 30``) must not stop the loop that
runs the job, and a reader that went away (``| head``) must not stop the job: :class:`Outlet`
queues what the reader has not taken yet and writes it as it can, :class:`SafeStream` writes a
file or string buffer (which never blocks) and swallows a broken pipe. :func:`outlet` picks one
for a stream.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat

from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import TextIO

MAX_BACKLOG = 1 << 20  # bytes written but not yet taken by the reader before log reading pauses
_WRITE_CHUNK = 1 << 16


class SafeStream:
    """Writes that never fail: when the reader goes away (``torchjob run ... | head``) the job goes
    on, only its printing stops; everything is in the log files anyway."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.broken = False
        self.backlog = 0  # written at once (a file, a string buffer or a blocking pipe)

    def wait(self, timeout: float) -> None:
        return

    def write(self, text: str, counted: bool = False) -> None:
        if self.broken:
            return
        try:
            self.stream.write(text)
        except (OSError, ValueError):
            self.broken = True

    def flush(self) -> None:
        if self.broken:
            return
        try:
            self.stream.flush()
        except (OSError, ValueError):
            self.broken = True


class Outlet:
    """Writes to a pipe, terminal or socket that never block: a stalled reader (``| less`` not
    scrolled, Ctrl-S, ``| sleep 30``) must not stop the loop that runs the job. What the reader
    has not taken yet waits here; the caller stops reading log files while ``backlog`` is large
    (the files hold everything), so memory stays bounded and nothing is lost unless given up on.

    The descriptor is reopened with O_NONBLOCK where Linux allows it (a pipe or terminal through
    /proc/self/fd): setting the flag on the inherited descriptor would change it for every process
    that shares it, the shell and our own stderr included. Otherwise the original is written only
    when poll says it is writable, at most PIPE_BUF bytes at a time (a pipe then takes them whole).
    """

    def __init__(self, fd: int) -> None:
        import collections
        import select

        self._select = select
        self.pending: collections.deque[tuple[bytes, bool]] = collections.deque()  # (text, a log line)
        self.backlog = 0  # bytes in pending
        self._head = 0  # bytes of pending[0] already written
        self.broken = False
        try:
            self.fd = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
            self.own = True
        except OSError:  # not Linux, a socket, or a pipe we may not reopen
            self.fd, self.own = fd, False

    def write(self, text: str, counted: bool = False) -> None:
        """Queue ``text``; ``counted`` marks a container's line (see :meth:`discard`)."""
        # Log lines wait for room (Console.room); this bounds the rest (notes) if nothing is read.
        if not self.broken and self.backlog < 4 * MAX_BACKLOG:
            data = text.encode(errors="replace")
            self.pending.append((data, counted))
            self.backlog += len(data)

    def discard(self) -> int:
        """Drop what the reader has not started to take; returns how many log lines that was."""
        keep = [self.pending.popleft()] if self.pending and self._head else []
        dropped = sum(1 for _data, counted in self.pending if counted)
        self.pending.clear()
        self.pending.extend(keep)
        self.backlog = sum(len(data) for data, _counted in keep) - self._head
        return dropped

    def flush(self) -> None:
        """Write what the reader takes now, without waiting."""
        limit = _WRITE_CHUNK if self.own else self._select.PIPE_BUF
        while self.pending and not self.broken:
            if not self.own and not self._writable(0.0):
                return
            chunk, size = [], 0
            for i, (data, _counted) in enumerate(self.pending):
                piece = data[self._head :] if i == 0 else data
                chunk.append(piece)
                size += len(piece)
                if size >= limit:
                    break
            try:
                written = os.write(self.fd, b"".join(chunk)[:limit])
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            except OSError:  # the reader went away
                self.broken = True
                self.discard()
                return
            self.backlog -= written
            written += self._head
            while self.pending and written >= len(self.pending[0][0]):
                written -= len(self.pending.popleft()[0])
            self._head = written

    def wait(self, timeout: float) -> None:
        """Until the reader can take more or ``timeout`` seconds passed."""
        if self.pending and not self.broken:
            self._writable(timeout)

    def _writable(self, timeout: float) -> bool:
        poller = self._select.poll()
        poller.register(self.fd, self._select.POLLOUT)
        return bool(poller.poll(int(timeout * 1000)))

    def close(self) -> None:
        if self.own:
            self.own = False
            os.close(self.fd)


def outlet(stream: TextIO) -> Outlet | None:
    """A non-blocking writer for ``stream`` when it is a pipe, terminal or socket; None for files
    and for streams that are not plain files of this process (a notebook's output, say)."""
    if not isinstance(stream, io.TextIOWrapper):
        return None
    try:
        fd = stream.fileno()
        mode = os.fstat(fd).st_mode
    except (OSError, ValueError, AttributeError):  # a string buffer: it never blocks
        return None
    if stat.S_ISREG(mode) or stat.S_ISBLK(mode):
        return None
    with contextlib.suppress(OSError, ValueError):
        stream.flush()  # what was printed before comes first
    return Outlet(fd)
