"""What the engines read of the host (torchjob/host): the TCP tables and /proc, against this
machine's own sockets and processes."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from torchjob.host import tcp

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")


def _inode(sock: socket.socket) -> int:
    link = Path(f"/proc/self/fd/{sock.fileno()}").readlink().name  # socket:[INODE]
    return int(link.removeprefix("socket:[").removesuffix("]"))


def test_a_listener_is_found_with_its_uid_and_socket_and_a_bound_socket_is_not() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        assert tcp.listening([port]) == []  # bound, not listening
        sock.listen()
        assert tcp.listening([port]) == [tcp.Listener(port, os.getuid(), _inode(sock))]


TABLE = b"""\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:5BA0 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 4242 1
   1: 0100007F:D431 0100007F:5BA0 01 00000000:00000000 00:00000000 00000000  1001        0 4343 1
   2: 0100007F:1F90 00000000:0000 07 00000000:00000000 00:00000000 00000000  1002        0 4444 1
"""


def test_only_listening_rows_of_the_tables_given_count() -> None:
    """Port 23456 (5BA0) listens; 54321 (D431) is a connection to it; 8080 (1F90) is a closed
    socket: only the first is a listener, whatever table it comes from."""
    assert tcp.listening({23456, 54321, 8080}, lambda: [TABLE]) == [tcp.Listener(23456, 1000, 4242)]
    assert tcp.listening({23456}, lambda: [b"", TABLE, TABLE]) == [tcp.Listener(23456, 1000, 4242)] * 2
    assert tcp.listening({80}, lambda: [TABLE]) == []


def test_the_ephemeral_range_begins_where_the_kernel_says() -> None:
    first = int(Path(tcp.PORT_RANGE).read_text().split()[0])
    assert tcp.ephemeral_low() == first
