"""Unix-domain packet sockets between nodes of one host: the local message path.

Through ZeroMQ, every message crosses two extra threads (the sender's and the
receiver's I/O threads, each woken through its mailbox) besides the kernel; for the
small control messages of co-located workers and servers — whose array data already
travels through shared memory — that is most of the cost of a round trip (measured on a
2-core VM: ~100-150 us of CPU per side per round trip through ZeroMQ, ~60-90 us through
a plain ``SOCK_SEQPACKET`` socket). So a server also listens on such a socket in its
shared-memory directory, and workers on its host send their requests there and get
their replies on the same connection.

A ``SOCK_SEQPACKET`` socket keeps message boundaries and order. A message (a list of
frames, as for ZeroMQ) travels as one or more packets; each packet starts with one flag
byte (``1``: more packets of this message follow), and the message itself is a table —
the frame count and every frame's length, little-endian — followed by the frames. Any
thread may send (a lock keeps one message's packets together); one thread (the
reactor) receives.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["LocalConnection", "PACKET_BYTES", "local_path", "listen"]

# Payload bytes per packet; a longer message spans several packets. Bounded by the
# socket buffers (set to twice this), which the kernel may cap (net.core.wmem_max).
PACKET_BYTES = 1 << 20
_BUFFER_BYTES = 2 * PACKET_BYTES
_MORE, _LAST = b"\x01", b"\x00"
_COUNT = struct.Struct("<I")
_MAX_BUFFERS = 256  # frames gathered by one sendmsg (the kernel takes at most IOV_MAX = 1024)


def local_path(directory: str) -> str:
    """The socket a server listens on in its shared-memory directory ``directory``."""
    return os.path.join(directory, "node.sock")


def _socket() -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, _BUFFER_BYTES)
    return sock


def listen(path: str) -> socket.socket:
    """A non-blocking listening socket at ``path``.

    Raises:
        OSError: the path cannot be bound (e.g. too long for a Unix socket).
    """
    sock = _socket()
    try:
        sock.bind(path)
        sock.listen(64)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def _packet_limit(sock: socket.socket) -> int:
    """The payload per packet this socket can take (its send buffer may be capped)."""
    granted = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)  # Linux reports twice the grant
    return max(4096, min(PACKET_BYTES, granted // 4))


class LocalConnection:
    """One end of a connected local socket: whole messages out (any thread) and in (one thread).

    Args:
        sock: the connected socket.
        name: for error messages.
        send_timeout: seconds a send may wait while the peer's buffer is full; then the
            connection is closed (a message may be half sent) and the send fails.
    """

    __slots__ = ("_sock", "_lock", "name", "_limit", "_buffer", "_partial", "fd", "_timeout")

    def __init__(self, sock: socket.socket, name: str, send_timeout: float = 60.0) -> None:
        # Blocking at the OS level, sends bounded by SO_SNDTIMEO (a Python-level timeout would
        # also make the non-blocking reads wait); reads pass MSG_DONTWAIT.
        sock.setblocking(True)
        whole = int(send_timeout)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                        struct.pack("ll", whole, int((send_timeout - whole) * 1e6)))
        self._timeout = send_timeout
        self._sock: socket.socket | None = sock
        self._lock = threading.Lock()
        self.name = name
        self._limit = _packet_limit(sock)
        self._buffer = bytearray(PACKET_BYTES + 1)  # one packet (of any peer: theirs may be bigger)
        self._partial: bytearray | None = None  # the packets so far of a multi-packet message
        self.fd = sock.fileno()

    @classmethod
    def connect(cls, path: str, name: str, send_timeout: float = 60.0) -> LocalConnection:
        """Connect to the listening socket at ``path``.

        Raises:
            OSError: nobody listens there.
        """
        sock = _socket()
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            raise
        return cls(sock, name, send_timeout)

    def send(self, frames: Sequence[Any]) -> None:
        """Send one message (frames: bytes-like; copied into the socket before this returns).

        Raises:
            ConnectionError: the peer is gone, the connection was closed, or the peer took
                no data for ``send_timeout`` seconds (the connection is closed then).
        """
        lengths = [memoryview(f).nbytes for f in frames]
        table = _COUNT.pack(len(lengths)) + struct.pack(f"<{len(lengths)}Q", *lengths)
        total = len(table) + sum(lengths)
        if len(frames) > _MAX_BUFFERS:  # more than one system call may gather: one buffer (a copy)
            frames = [b"".join(frames)]
        with self._lock:
            sock = self._sock
            if sock is None:
                raise ConnectionError(f"{self.name} is closed")
            try:
                self._send(sock, table, frames, total)
            except BlockingIOError:  # SO_SNDTIMEO passed
                sock.close()
                self._sock = None
                raise ConnectionError(f"{self.name}: the peer took nothing for {self._timeout} s") from None

    def _send(self, sock: socket.socket, table: bytes, frames: Sequence[Any], total: int) -> None:
        if total <= self._limit:  # the usual case: one packet, one system call
            sock.sendmsg([_LAST, table, *frames])
            return
        packet: list[Any] = []
        room = self._limit
        for buf in [table, *frames]:
            view = memoryview(buf).cast("B")
            while view.nbytes:
                if not room:
                    sock.sendmsg([_MORE, *packet])
                    packet, room = [], self._limit
                part = view[:room]
                packet.append(part)
                room -= part.nbytes
                view = view[part.nbytes:]
        sock.sendmsg([_LAST, *packet])

    def receive(self) -> list[memoryview] | None:
        """Read one packet; the message's frames once it is whole.

        Returns:
            The frames, or None while a multi-packet message is incomplete.

        Raises:
            BlockingIOError: no packet is waiting.
            EOFError: the peer closed the connection.
            ConnectionError: the connection failed.
        """
        sock = self._sock
        if sock is None:
            raise EOFError(f"{self.name} is closed")
        n = sock.recv_into(self._buffer, 0, socket.MSG_DONTWAIT)  # raises BlockingIOError if none
        if n == 0:
            raise EOFError(f"{self.name}: the peer closed the connection")
        more = self._buffer[0] == 1
        if self._partial is not None or more:
            if self._partial is None:
                self._partial = bytearray()
            self._partial += memoryview(self._buffer)[1:n]
            if more:
                return None
            payload = self._partial
            self._partial = None
        else:
            payload = bytearray(memoryview(self._buffer)[1:n])  # writable, as ZeroMQ frames are
        return _frames(payload)

    def close(self) -> None:
        """Close the socket (idempotent); later sends raise ConnectionError."""
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


def _frames(payload: bytearray) -> list[memoryview]:
    (count,) = _COUNT.unpack_from(payload, 0)
    offset = _COUNT.size + 8 * count
    if count > 1_000_000 or offset > len(payload):
        raise ConnectionError(f"malformed local message: {count} frames in {len(payload)} bytes")
    lengths = struct.unpack_from(f"<{count}Q", payload, _COUNT.size)
    view = memoryview(payload)
    frames = []
    for n in lengths:
        frames.append(view[offset: offset + n])
        offset += n
    if offset != len(payload):
        raise ConnectionError(f"malformed local message: frames of {offset} bytes in {len(payload)}")
    return frames
