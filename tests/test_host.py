"""What the engines read of the host (torchjob/host): the TCP tables and /proc, against this
machine's own sockets and processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchjob.host import procfs, tcp

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


def test_a_process_is_read_from_proc_as_ps_would_show_it(tmp_path: Path) -> None:
    """A child's parent, start, environment and command line; as a zombie, its state and no
    command; this process's owner; a file kept open read anew."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TJ_HOST": "yes"}
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)", "a \t b", "x" * 99], env=env
    )
    try:
        assert child.pid in procfs.pids()
        assert procfs.ppid(child.pid) == os.getpid()
        assert procfs.stat_fields(child.pid)[1] == str(os.getpid()).encode()
        # (seen in CI: a child just started may show a start one clock tick past /proc/uptime)
        assert procfs.start_ticks(os.getpid()) <= procfs.start_ticks(child.pid) <= procfs.ticks_now() + 1
        assert b"\0TJ_HOST=yes\0" in procfs.environ(child.pid)
        words = f"{sys.executable} -c import time; time.sleep(30) a b {'x' * 99}"  # white space folded
        assert procfs.command(child.pid) == words[:77] + "..."  # at most 80 characters
    finally:
        child.kill()
    deadline = time.monotonic() + 10
    while procfs.stat_fields(child.pid)[0] != b"Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert procfs.stat_fields(child.pid)[0] == b"Z"  # killed, not yet waited for
    assert procfs.command(child.pid) == ""
    child.wait(10)
    assert procfs.environ(child.pid) == b""  # gone
    with pytest.raises(OSError):
        procfs.command(child.pid)
    assert procfs.uid(os.getpid()) == os.geteuid()
    kept = tmp_path / "kept"
    kept.write_bytes(b"first")
    fd = os.open(kept, os.O_RDONLY)
    try:
        assert procfs.reread(fd) == b"first"
        kept.write_bytes(b"second, longer")
        assert procfs.reread(fd) == b"second, longer"
    finally:
        os.close(fd)
