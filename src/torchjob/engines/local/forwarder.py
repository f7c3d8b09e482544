"""The port forwarder of a job in a network of its own: what the user reaches from this machine.

This file is not imported by torchjob. The engine runs ``python -I -S <this file> SPEC`` in the
job's network namespace (``netns.py``, ``forward.py``) with listening sockets it bound on this
machine's network before (sockets keep the namespace they were made in), and SPEC, a JSON object:

- ``listeners``: ``[[fd, address, port], ...]``; a connection accepted on fd goes to
  ``address:port`` in the job's network, where the pod's program listens;
- ``table``: this machine's ``/proc/net/tcp``, opened by the engine (read anew for each connection);
- ``uids``: whose connections are forwarded (the user's, and the uids the job's pods run as); a
  connection from a process of any other uid is closed at once, and said in the log;
- ``control``: a pipe whose end of file (the supervisor is gone or done) ends this process.

Only the standard library, without ``site`` (``-S``), so it starts in a few milliseconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import struct
import sys
import time

CHUNK = 65536  # bytes read at once; a side with this much not yet sent is not read from
UID_COLUMN = 7  # /proc/net/tcp: sl local rem st queues tr retrnsmt uid ...
ESTABLISHED = b"01"  # the "st" column; a closed connection's TIME_WAIT row shows uid 0


def main() -> None:
    spec = json.loads(sys.argv[1])
    forwarder = Forwarder(spec["table"], set(spec["uids"]))
    forwarder.selector.register(spec["control"], selectors.EVENT_READ, None)
    for fd, address, port in spec["listeners"]:
        listener = socket.socket(fileno=fd)
        listener.setblocking(False)
        forwarder.selector.register(listener, selectors.EVENT_READ, (address, port))
    forwarder.run(spec["control"])


def _say(text: str) -> None:
    sys.stdout.write(time.strftime("%H:%M:%S ") + text + "\n")
    sys.stdout.flush()


def _key(address: str, port: int) -> bytes:
    """An IPv4 address and port as /proc/net/tcp writes them (the address in host byte order)."""
    return b"%08X:%04X" % (struct.unpack("=I", socket.inet_aton(address))[0], port)


class Side:
    """One socket of a forwarded connection, with the bytes waiting to be written to it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending = b""
        self.read_done = False  # its peer sent all it will: nothing more to read
        self.write_done = False  # shut down for writing, once everything was written
        self.peer: Side = self
        self.watched = 0  # the events registered for it


class Forwarder:
    def __init__(self, table: int, uids: set[int]) -> None:
        self.table = table
        self.uids = uids
        self.selector = selectors.DefaultSelector()
        self.connecting: dict[Side, Side] = {}  # inside side -> outside side, until connected

    def run(self, control: int) -> None:
        while True:
            for key, events in self.selector.select():
                if key.data is None:  # the control pipe
                    if not os.read(control, 100):
                        return
                elif isinstance(key.data, tuple):
                    self.accept(key.fileobj, *key.data)  # type: ignore[arg-type]
                else:
                    self.serve(key.data, events)

    def uid_of(self, peer: tuple[str, int], here: tuple[str, int]) -> int | None:
        """The uid of the process whose connection from ``peer`` to ``here`` was just accepted:
        its socket is the row of this machine's table from ``peer`` to ``here``, established."""
        wanted = (_key(*peer), _key(*here), ESTABLISHED)
        for _ in range(3):  # the row is there once connected; read again should it be missed
            os.lseek(self.table, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(self.table, CHUNK):
                chunks.append(chunk)
            for line in b"".join(chunks).split(b"\n")[1:]:
                fields = line.split()
                if len(fields) > UID_COLUMN and tuple(fields[1:4]) == wanted:
                    return int(fields[UID_COLUMN])
            time.sleep(0.01)
        return None

    def accept(self, listener: socket.socket, address: str, port: int) -> None:
        try:
            outside, peer = listener.accept()
            here = outside.getsockname()
        except OSError:
            return
        uid = self.uid_of(peer[:2], here[:2])
        if uid not in self.uids:
            who = "an unknown uid" if uid is None else f"uid {uid}"
            _say(f"refused a connection to {address}:{port} from {who} ({peer[0]}:{peer[1]})")
            outside.close()
            return
        inside = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        outside.setblocking(False)
        inside.setblocking(False)
        try:
            inside.connect((address, port))
        except BlockingIOError:
            pass
        except OSError:  # nothing listens there yet: the client sees its connection closed
            inside.close()
            outside.close()
            return
        a, b = Side(outside), Side(inside)
        a.peer, b.peer = b, a
        self.connecting[b] = a
        self.watch(b, selectors.EVENT_WRITE)

    def watch(self, side: Side, events: int) -> None:
        if events == side.watched:
            return
        if side.watched == 0:
            self.selector.register(side.sock, events, side)
        elif events == 0:
            self.selector.unregister(side.sock)
        else:
            self.selector.modify(side.sock, events, side)
        side.watched = events

    def serve(self, side: Side, events: int) -> None:
        try:
            if side in self.connecting:
                outside = self.connecting.pop(side)
                if side.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    raise ConnectionRefusedError
                self.update(outside)
            if events & selectors.EVENT_READ:
                data = side.sock.recv(CHUNK)
                if data:
                    side.peer.pending += data
                else:
                    side.read_done = True
            if events & selectors.EVENT_WRITE and side.pending:
                side.pending = side.pending[side.sock.send(side.pending) :]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # reset, refused: both ends go
            self.close(side)
            return
        for each in (side, side.peer):
            if each.peer.read_done and not each.pending and not each.write_done:
                with contextlib.suppress(OSError):
                    each.sock.shutdown(socket.SHUT_WR)
                each.write_done = True
        if side.write_done and side.peer.write_done:
            self.close(side)
            return
        self.update(side)
        self.update(side.peer)

    def update(self, side: Side) -> None:
        events = 0
        if not side.read_done and len(side.peer.pending) < CHUNK and side.peer not in self.connecting:
            events |= selectors.EVENT_READ
        if side.pending:
            events |= selectors.EVENT_WRITE
        self.watch(side, events)

    def close(self, side: Side) -> None:
        for each in (side, side.peer):
            self.connecting.pop(each, None)
            self.watch(each, 0)
            each.sock.close()


if __name__ == "__main__":
    main()
