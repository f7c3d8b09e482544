"""A network's listening TCP sockets through Linux's sock_diag netlink interface.

``/proc/net/tcp`` and ``tcp6`` are made by walking the kernel's TCP hash tables, which every
network namespace shares: 3.4 ms a read on this 2-core machine even for a job's network of two
sockets (benchmarks/README.md). A sock_diag request for listening sockets only walks the table of
listening ones: tens of microseconds. The socket answers for the network it was made in, so one
made inside a job's network (``engines/local/netns.py``) tells that network's listeners to a
process outside it.
"""

from __future__ import annotations

import errno
import socket
import struct

from torchjob.host.tcp import Listener

NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_LISTEN = 10
_HEADER = struct.Struct("=LHHLL")  # struct nlmsghdr: length, type, flags, sequence, port id
# struct inet_diag_req_v2: family, protocol, extensions, pad, states; then an all-zero socket id
_REQUEST = struct.Struct("=BBBxL48x")
# struct inet_diag_msg: family, state, timer, retransmits, the socket id (source port first, big
# endian), then expires, read and write queues, uid, inode
_MESSAGE = struct.Struct("=BBBB2s46xLLLLL")
TIMEOUT = 1.0  # seconds an answer may take; then the caller is told the tables cannot be read


def open_socket() -> socket.socket:
    """A sock_diag socket for the network of the calling thread. Raises OSError."""
    return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)


def listeners(sock: socket.socket) -> list[Listener]:
    """Every listening TCP socket (IPv4 and IPv6) of ``sock``'s network. Raises OSError."""
    found: list[Listener] = []
    sock.settimeout(TIMEOUT)
    for sequence, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
        body = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 1 << _TCP_LISTEN)
        flags = _NLM_F_REQUEST | _NLM_F_DUMP
        sock.send(_HEADER.pack(_HEADER.size + len(body), _SOCK_DIAG_BY_FAMILY, flags, sequence, 0) + body)
        found += _answer(sock, sequence)
    return found


def _answer(sock: socket.socket, sequence: int) -> list[Listener]:
    found: list[Listener] = []
    while True:
        data = sock.recv(65536)
        at = 0
        while at + _HEADER.size <= len(data):
            length, kind, _, seq, _ = _HEADER.unpack_from(data, at)
            if length < _HEADER.size:
                raise OSError("a malformed sock_diag answer")
            if seq == sequence:
                if kind == _NLMSG_DONE:
                    return found
                if kind == _NLMSG_ERROR:
                    code = -struct.unpack_from("=i", data, at + _HEADER.size)[0]
                    raise OSError(code, f"sock_diag: {errno.errorcode.get(code, code)}")
                if kind == _SOCK_DIAG_BY_FAMILY and length >= _HEADER.size + _MESSAGE.size:
                    _, state, _, _, port, _, _, _, uid, inode = _MESSAGE.unpack_from(data, at + _HEADER.size)
                    if state == _TCP_LISTEN:
                        found.append(Listener(int.from_bytes(port, "big"), uid, inode))
            at += (length + 3) & ~3
