"""ZeroMQ messages as frames: bounded receive, cheap send, an oversized message dropped in steps,
the send-only socket any thread may use, and a slow peer's backlog.

The pieces of :mod:`pskv.transport.reactor` that handle one socket's messages and need
no reactor: the reactor polls, these read and write.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

import zmq

from pskv.errors import ProtocolError, TransportError
from pskv.transport.bounds import DEFAULT_BOUNDS, Bounds, check_size

__all__ = ["SOCKET_BUFFER_BYTES", "ZERO_COPY_BYTES", "Discarding", "Sender", "recv_frames", "send_frames"]

# Kernel socket buffers for every data socket. The OS default (~200 KB on loopback)
# throttles large messages; 8 MiB measured 1.5x the throughput of 100 MB messages here.
SOCKET_BUFFER_BYTES = 8 << 20

# Frames from this size up are sent without a copy; smaller ones are copied (cheaper than
# ZeroMQ's zero-copy bookkeeping, as pyzmq itself decides).
ZERO_COPY_BYTES = zmq.COPY_THRESHOLD
# Plain ints: combining pyzmq's enum flags (e.g. EVENTS & POLLIN) runs Python-level enum code.
_SNDMORE, _NOBLOCK = int(zmq.SNDMORE), int(zmq.NOBLOCK)


def send_frames(sock: zmq.Socket[Any], frames: list[Any], first_flags: int = 0) -> None:
    """``sock.send_multipart(frames)``, for less: one ``send`` per frame, big ones not copied.

    pyzmq's ``send_multipart`` checks and wraps every frame first, which costs more than
    the send itself for the small messages of a parameter server. ``first_flags``
    (``NOBLOCK``) apply to the first frame only: ZeroMQ refuses a message whole at its
    first frame (``zmq.Again``: the peer's queue is full) and never part-way through.
    """
    last = len(frames) - 1
    for i, f in enumerate(frames):
        big = isinstance(f, zmq.Frame) or (isinstance(f, memoryview) and f.nbytes >= ZERO_COPY_BYTES)
        sock.send(f, (_SNDMORE if i < last else 0) | (first_flags if i == 0 else 0), copy=not big)


def recv_frames(sock: zmq.Socket[Any], bounds: Bounds = DEFAULT_BOUNDS, drain: bool = True) -> list[zmq.Frame]:
    """``sock.recv_multipart(zmq.NOBLOCK, copy=False)``, for less (a message must be waiting).

    Frames and bytes are counted as they are read: past ``bounds.max_frames`` frames or
    ``bounds.max_message_bytes`` bytes the frames read are let go and the rest of the
    message is dropped one frame at a time, without building a list — here (``drain``),
    or by the caller in steps (:meth:`Discarding.step`), so that a reactor's timers run
    meanwhile.

    Raises:
        Discarding: the message broke a bound (a :class:`~pskv.errors.ProtocolError`);
            with ``drain`` it was read to its end.
    """
    frame = sock.recv(_NOBLOCK, copy=False)
    frames = [frame]
    size = len(frame)
    max_frames, max_bytes = bounds.max_frames, bounds.max_message_bytes
    while frame.more:
        if len(frames) >= max_frames or size > max_bytes:
            over = Discarding(bytes(frames[0].buffer[:40]), len(frames), size, frame, bounds)
            frames.clear()
            if drain:
                over.step(sock)
            raise over
        frame = sock.recv(copy=False)
        frames.append(frame)
        size += len(frame)
    if size > max_bytes:
        raise Discarding(bytes(frames[0].buffer[:40]), len(frames), size, frame, bounds)
    return frames


class Discarding(ProtocolError):
    """A message over the bounds being dropped: what was counted, and whether frames of it are left."""

    def __init__(self, head: bytes, count: int, size: int, last: zmq.Frame, bounds: Bounds) -> None:
        super().__init__()
        self.head, self.count, self.size, self._last, self._bounds = head, count, size, last, bounds

    @property
    def done(self) -> bool:
        """True once the message's last frame was read."""
        return not self._last.more

    def step(self, sock: zmq.Socket[Any], limit: int | None = None) -> bool:
        """Read and drop up to ``limit`` (None: all) more frames of the message; True once it ended.

        The fastest way pyzmq offers (measured: faster than ``recv_into`` or checking
        ``RCVMORE``): ~1.5 us per frame, so 2 million empty frames cost ~3 s.
        """
        recv, last, n = sock.recv, self._last, 0
        while last.more and (limit is None or n < limit):
            last = recv(copy=False)
            n += 1
        self._last, self.count = last, self.count + n
        return not last.more

    def __str__(self) -> str:
        return (f"a message of {self.count} frames, {self.size}+ bytes (first frame {self.head!r}), over "
                f"PSKV_MAX_FRAMES={self._bounds.max_frames} or PSKV_MAX_MESSAGE_BYTES="
                f"{self._bounds.max_message_bytes}: discarded")


class Sender:
    """A send-only DEALER socket that any thread may use (made by :meth:`Reactor.connect_sender`).

    ZeroMQ sockets are not thread-safe, but may be used by several threads one at a time
    with a memory barrier in between: the lock is both. Nothing ever polls or reads the
    socket, and its send queue is unbounded, so a send never blocks on the peer.
    """

    __slots__ = ("_sock", "_lock", "_name", "_max_bytes")

    def __init__(self, sock: zmq.Socket[Any], name: str, max_message_bytes: int = DEFAULT_BOUNDS.max_message_bytes
                 ) -> None:
        self._sock: zmq.Socket[Any] | None = sock
        self._lock = threading.Lock()
        self._name = name
        self._max_bytes = max_message_bytes

    def send(self, frames: list[Any]) -> None:
        """Send one message (frames are not copied: keep their buffers unchanged until answered).

        Raises:
            TransportError: the sender was closed (its reactor stopped).
            InvalidArgumentError: the message is bigger than the services take
                (``PSKV_MAX_MESSAGE_BYTES``): they would drop it, or its connection.
        """
        check_size(frames, self._max_bytes, self._name)
        with self._lock:
            if self._sock is None:
                raise TransportError(f"{self._name} is stopped")
            send_frames(self._sock, frames)

    def close(self) -> None:
        """Close the socket (idempotent); later sends raise TransportError."""
        with self._lock:
            if self._sock is not None:
                self._sock.close(0)
                self._sock = None


class Backlog:
    """Messages for one peer that ZeroMQ's queue to it (``SEND_HWM`` messages) had no room for, oldest first."""

    __slots__ = ("sock", "prefix", "messages", "bytes", "progress")

    def __init__(self, sock: zmq.Socket[Any], prefix: list[bytes], now: float) -> None:
        self.sock = sock
        self.prefix = prefix  # a ROUTER peer's identity frame; nothing for a DEALER
        self.messages: collections.deque[tuple[list[Any], int]] = collections.deque()
        self.bytes = 0
        self.progress = now  # when the peer last took a message (or the backlog began)

    def add(self, frames: list[Any]) -> None:
        # small frames are copied now, as ZeroMQ would have copied them at once
        kept = [bytes(f) if isinstance(f, memoryview) and f.nbytes < ZERO_COPY_BYTES else f for f in frames]
        size = sum(f.nbytes if isinstance(f, memoryview) else len(f) for f in kept)
        self.messages.append((kept, size))
        self.bytes += size

    def flush(self, now: float) -> None:
        """Send what the peer takes now (never waits).

        Raises:
            zmq.ZMQError: the peer is gone (``EHOSTUNREACH``) or the socket failed.
        """
        while self.messages:
            frames, size = self.messages[0]
            try:
                send_frames(self.sock, [*self.prefix, *frames], _NOBLOCK)
            except zmq.Again:
                return
            self.messages.popleft()
            self.bytes -= size
            self.progress = now
