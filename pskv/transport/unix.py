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
thread may send (a lock keeps one message's packets together); one thread at a time
receives (:attr:`LocalConnection.reading`): the reactor, or — on a client's connection —
a thread waiting for a reply, which then reads the packets itself while the reactor
leaves the connection out of its poll (:meth:`pskv.transport.reactor.Reactor.read_local`):
one thread woken per reply instead of two.
"""

from __future__ import annotations

import collections
import os
import socket
import struct
import threading
import time
from collections.abc import Sequence
from typing import Any

from pskv.errors import OperationTimeoutError, ProtocolError
from pskv.transport.bounds import DEFAULT_BOUNDS, Bounds, check_size

__all__ = ["LocalConnection", "PACKET_BYTES", "local_path", "listen"]

# Payload bytes per packet; a longer message spans several packets. Bounded by the
# socket buffers (set to twice this), which the kernel may cap (net.core.wmem_max).
PACKET_BYTES = 1 << 20
_BUFFER_BYTES = 2 * PACKET_BYTES
_MORE, _LAST = b"\x01", b"\x00"
_COUNT = struct.Struct("<I")
# The frame table of a message of n frames, for the usual few (n < 8): one pack or unpack, not a format per call.
_TABLES = tuple(struct.Struct(f"<I{n}Q") for n in range(8))
_LENGTHS = tuple(struct.Struct(f"<{n}Q") for n in range(8))
_ONE_FRAME = _TABLES[1]  # the table of a message of one frame
_MAX_BUFFERS = 256  # frames gathered by one sendmsg (the kernel takes at most IOV_MAX = 1024)
CONNECT_TIMEOUT = 10.0  # seconds a connect waits at most for a listener whose backlog is full (a frozen server)


def local_path(directory: str) -> str:
    """The socket a server listens on in its shared-memory directory ``directory``."""
    return os.path.join(directory, "node.sock")


def _socket() -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, _BUFFER_BYTES)
    return sock


def _send_timeout(sock: socket.socket, seconds: float) -> None:
    """Bound the socket's blocking sends (and connect) to ``seconds`` (SO_SNDTIMEO; at least 1 us: 0 is forever)."""
    whole = int(seconds)
    micros = max(int((seconds - whole) * 1e6), 0 if whole else 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", whole, micros))


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

    Two ways of sending: a client's connection waits for a peer whose buffer is full, at
    most ``send_timeout`` seconds; a service's connection (``queued``) never waits — what
    the peer's buffer cannot take now waits in the connection's queue, sent by
    :meth:`flush` when the socket is writable; a peer whose queue passes
    ``bounds.send_queue_bytes`` is dropped (the connection closed), and so is one that
    took none of it for ``bounds.slow_peer_timeout`` seconds (:meth:`overdue`).

    Every packet received is validated before use (its flag byte, the frame table, the
    lengths against the bytes that came, ``bounds``' frame and byte limits); a bad one
    raises :class:`~pskv.errors.ProtocolError` and the owner closes the connection.

    Args:
        sock: the connected socket.
        name: for error messages.
        send_timeout: seconds a send may wait while the peer's buffer is full; then the
            connection is closed (a message may be half sent) and the send fails.
        bounds: the limits of received messages and of the send queue.
        queued: never wait to send: queue what the peer cannot take yet.
    """

    __slots__ = ("_sock", "_lock", "name", "_limit", "_buffer", "_partial", "fd", "_timeout", "_bounds", "_queued",
                 "_queue", "_queue_bytes", "_progress", "reading", "claimed", "polled", "_read_timeout", "_broken")

    def __init__(self, sock: socket.socket, name: str, send_timeout: float = 60.0, bounds: Bounds = DEFAULT_BOUNDS,
                 queued: bool = False) -> None:
        # Blocking at the OS level, sends bounded by SO_SNDTIMEO (a Python-level timeout would
        # also make the non-blocking reads wait); reads pass MSG_DONTWAIT, queued sends too.
        sock.setblocking(True)
        _send_timeout(sock, send_timeout)
        self._timeout = send_timeout
        self._sock: socket.socket | None = sock
        self._lock = threading.Lock()
        self.name = name
        self._limit = _packet_limit(sock)
        self._buffer = bytearray(PACKET_BYTES + 1)  # one packet (of any peer: theirs may be bigger)
        self._partial: bytearray | None = None  # the packets so far of a multi-packet message
        self.fd = sock.fileno()
        self._bounds = bounds
        self._queued = queued
        self._queue: collections.deque[bytes] = collections.deque()  # whole packets the peer has not taken
        self._queue_bytes = 0
        self._progress = 0.0  # monotonic time the queue last moved (or began)
        # Receiving: held by the one thread that reads packets and hands them on, in order.
        self.reading = threading.Lock()
        self.claimed = False  # a thread waiting for a reply reads it (the reactor leaves it out of its poll)
        self.polled = True  # in the reactor's poll set (changed by the reactor thread only)
        self._read_timeout: float | None = None  # SO_RCVTIMEO: how long a waiting receive blocks at most
        self._broken = False  # a send timed out: shut down; closed by the thread that polls it

    @classmethod
    def connect(cls, path: str, name: str, send_timeout: float = 60.0, bounds: Bounds = DEFAULT_BOUNDS
                ) -> LocalConnection:
        """Connect to the listening socket at ``path``, waiting at most ``send_timeout`` s (and
        :data:`CONNECT_TIMEOUT`) for a listener whose backlog is full: a frozen server accepts no
        connection, and an unbounded connect would hold the calling thread (a worker's network thread).

        Raises:
            OperationTimeoutError: the listener took no connection in time (an ``OSError`` too).
            OSError: nobody listens there.
        """
        sock = _socket()
        waited = min(send_timeout, CONNECT_TIMEOUT)
        try:
            _send_timeout(sock, waited)  # a Unix socket's connect waits for a full backlog up to SO_SNDTIMEO
            sock.connect(path)
        except BlockingIOError:  # EAGAIN: the time passed with the backlog still full
            sock.close()
            raise OperationTimeoutError(f"{name}: {path} took no connection in {waited:g} s "
                                        "(its listener accepts none: a frozen server?)") from None
        except OSError:
            sock.close()
            raise
        return cls(sock, name, send_timeout, bounds)

    def send(self, frames: Sequence[Any]) -> None:
        """Send one message (frames: bytes-like; copied into the socket, or the queue, before this returns).

        Raises:
            ConnectionError: the peer is gone, the connection was closed, the peer took
                no data for ``send_timeout`` seconds, or (``queued``) its queue passed
                its bound (the connection is closed then).
            InvalidArgumentError: the message is bigger than the peer takes
                (``PSKV_MAX_MESSAGE_BYTES``; a client's connection only).
        """
        if len(frames) == 1:  # a header alone, the usual message (parts in shared memory)
            size = memoryview(frames[0]).nbytes
            table = _ONE_FRAME.pack(1, size)
        else:
            lengths = [memoryview(f).nbytes for f in frames]
            size = sum(lengths)
            n = len(lengths)
            table = _TABLES[n].pack(n, *lengths) if n < 8 else _COUNT.pack(n) + struct.pack(f"<{n}Q", *lengths)
        if not self._queued and size > self._bounds.max_message_bytes:
            check_size(frames, self._bounds.max_message_bytes, self.name)  # raises, naming the setting
        if len(frames) > _MAX_BUFFERS:  # more than one system call may gather: one buffer (a copy)
            frames = [b"".join(frames)]
        total = len(table) + size
        with self._lock:
            sock = self._sock
            if sock is None or self._broken:
                raise ConnectionError(f"{self.name} is closed")
            try:
                if self._queued:
                    self._send_or_queue(sock, self._packets(table, frames, total))
                else:
                    for packet in self._packets(table, frames, total):
                        sock.sendmsg(packet)
            except BlockingIOError:  # SO_SNDTIMEO passed: shut down; the polling thread sees the end and closes it
                self._broken = True  # (closing here, on a sending thread, could leave a poll on a reused number)
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                raise ConnectionError(f"{self.name}: the peer took nothing for {self._timeout} s") from None

    def _packets(self, table: bytes, frames: Sequence[Any], total: int) -> list[list[Any]]:
        """The message as packets, each a list of buffers starting with its flag byte."""
        if total <= self._limit:  # the usual case: one packet, one system call
            return [[_LAST, table, *frames]]
        packets: list[list[Any]] = []
        packet: list[Any] = [_MORE]
        room = self._limit
        for buf in [table, *frames]:
            view = memoryview(buf).cast("B")
            while view.nbytes:
                if not room:
                    packets.append(packet)
                    packet, room = [_MORE], self._limit
                part = view[:room]
                packet.append(part)
                room -= part.nbytes
                view = view[part.nbytes:]
        packet[0] = _LAST
        packets.append(packet)
        return packets

    def _send_or_queue(self, sock: socket.socket, packets: list[list[Any]]) -> None:
        """Send what the peer takes now; queue the rest (copied), behind what already waits."""
        sent = 0
        if not self._queue:
            try:
                for packet in packets:
                    sock.sendmsg(packet, (), socket.MSG_DONTWAIT)
                    sent += 1
                return
            except BlockingIOError:
                self._progress = time.monotonic()
        for packet in packets[sent:]:
            data = b"".join(packet)
            self._queue.append(data)
            self._queue_bytes += len(data)
        if self._queue_bytes > self._bounds.send_queue_bytes:
            queued = self._queue_bytes
            self._close_locked()
            raise ConnectionError(f"{self.name}: the peer left {queued} bytes of replies unread, more than "
                                  f"PSKV_SEND_QUEUE_BYTES={self._bounds.send_queue_bytes}: dropped")

    @property
    def closed(self) -> bool:
        """True once the connection was closed (by either side's failure, or :meth:`close`)."""
        return self._sock is None

    @property
    def pending(self) -> bool:
        """True while queued packets wait for the peer (call :meth:`flush` when the socket is writable)."""
        return bool(self._queue)

    def flush(self) -> bool:
        """Send queued packets while the peer takes them (never waits); True once the queue is empty.

        Raises:
            ConnectionError: the connection failed (it is closed, its queue discarded).
        """
        with self._lock:
            sock = self._sock
            if sock is None:
                return True
            while self._queue:
                try:
                    sock.sendmsg([self._queue[0]], (), socket.MSG_DONTWAIT)
                except BlockingIOError:
                    return False
                except OSError as exc:
                    self._close_locked()
                    raise ConnectionError(f"{self.name}: {exc}") from None
                self._queue_bytes -= len(self._queue.popleft())
                self._progress = time.monotonic()
            return True

    def overdue(self, now: float) -> bool:
        """True if queued packets have waited, untouched by the peer, longer than the slow-peer timeout."""
        return bool(self._queue) and now - self._progress > self._bounds.slow_peer_timeout

    def receive(self, wait: float | None = None) -> list[memoryview] | None:
        """Read one packet; the message's frames once it is whole and valid.

        Args:
            wait: seconds to wait for a packet (one system call; a thread waiting for its
                reply); None: none, the packet must be there (the reactor, after its poll).

        Returns:
            The frames, or None while a multi-packet message is incomplete.

        Raises:
            BlockingIOError: no packet is waiting (came within ``wait``).
            EOFError: the peer closed the connection.
            ConnectionError: the connection failed.
            ProtocolError: the packet or the message is malformed or over a bound (the
                caller closes the connection: what follows cannot be framed).
        """
        sock = self._sock
        if sock is None:
            raise EOFError(f"{self.name} is closed")
        if wait is None:
            n = sock.recv_into(self._buffer, 0, socket.MSG_DONTWAIT)  # raises BlockingIOError if none
        else:
            if wait != self._read_timeout:  # a blocking read, bounded by SO_RCVTIMEO
                whole = int(wait)
                usec = max(int((wait - whole) * 1e6), 0 if whole else 1)  # zero would mean: without limit
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", whole, usec))
                self._read_timeout = wait
            n = sock.recv_into(self._buffer)  # raises BlockingIOError once SO_RCVTIMEO passed
        if n == 0:
            raise EOFError(f"{self.name}: the peer closed the connection")
        flag = self._buffer[0]
        if flag > 1:
            raise ProtocolError(f"{self.name}: malformed packet of {n} bytes (flag byte {flag})")
        if self._partial is not None or flag:
            if self._partial is None:
                self._partial = bytearray()
            if len(self._partial) + n - 1 > self._max_payload():
                self._partial = None
                raise ProtocolError(f"{self.name}: a message over PSKV_MAX_MESSAGE_BYTES="
                                    f"{self._bounds.max_message_bytes}")
            self._partial += memoryview(self._buffer)[1:n]
            if flag:
                return None
            payload = self._partial
            self._partial = None
        else:
            payload = bytearray(memoryview(self._buffer)[1:n])  # writable, as ZeroMQ frames are
        return _frames(payload, self._bounds, self.name)

    def _max_payload(self) -> int:
        """The most bytes a valid message's packets carry (its frame table included)."""
        return self._bounds.max_message_bytes + _COUNT.size + 8 * self._bounds.max_frames

    def close(self) -> None:
        """Close the socket (idempotent); later sends raise ConnectionError; the queue is discarded."""
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._queue.clear()
        self._queue_bytes = 0


def _frames(payload: bytearray, bounds: Bounds, name: str) -> list[memoryview]:
    """A message's frames, after checking its table against ``payload`` and ``bounds``.

    Raises:
        ProtocolError: the table is cut short, names too many frames or bytes, or its
            lengths do not add up to the bytes that came.
    """
    size = len(payload)
    if size >= _ONE_FRAME.size:  # a header alone, the usual message (parts in shared memory): one check
        count, length = _ONE_FRAME.unpack_from(payload, 0)
        if count == 1 <= bounds.max_frames and length == size - _ONE_FRAME.size and length <= bounds.max_message_bytes:
            return [memoryview(payload)[_ONE_FRAME.size:]]
    elif size < _COUNT.size:
        raise ProtocolError(f"{name}: malformed message of {size} bytes (no frame table)")
    (count,) = _COUNT.unpack_from(payload, 0)
    offset = _COUNT.size + 8 * count
    if count > bounds.max_frames or offset > size:
        raise ProtocolError(f"{name}: malformed message: {count} frames in {size} bytes "
                            f"(PSKV_MAX_FRAMES={bounds.max_frames})")
    lengths = (_LENGTHS[count].unpack_from(payload, _COUNT.size) if count < 8
               else struct.unpack_from(f"<{count}Q", payload, _COUNT.size))
    if sum(lengths) != size - offset:
        raise ProtocolError(f"{name}: malformed message: frames of {sum(lengths)} bytes in {size - offset}")
    if size - offset > bounds.max_message_bytes:
        raise ProtocolError(f"{name}: a message of {size - offset} bytes, over PSKV_MAX_MESSAGE_BYTES="
                            f"{bounds.max_message_bytes}")
    view = memoryview(payload)
    frames = []
    for n in lengths:
        frames.append(view[offset: offset + n])
        offset += n
    return frames
