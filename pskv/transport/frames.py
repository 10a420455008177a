"""ZeroMQ messages as frames: bounded receive, cheap send, an oversized message dropped in steps,
the send-only socket any thread may use, and a slow peer's backlog.

The pieces of :mod:`pskv.transport.reactor` that handle one socket's messages and need
no reactor: the reactor polls, these read and write.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

from pskv.errors import ProtocolError, TransportError
from pskv.transport.bounds import DEFAULT_BOUNDS, SEND_HWM, Bounds, check_size

if TYPE_CHECKING:
    from pskv.transport.security import CurveSecurity

__all__ = ["SOCKET_BUFFER_BYTES", "STRANGER_BOUNDS", "ZERO_COPY_BYTES", "Discarding", "Sender", "dealer_socket",
           "recv_frames", "recv_routed", "router_socket", "send_frames"]

# Kernel socket buffers for every data socket. The OS default (~200 KB on loopback)
# throttles large messages; 8 MiB measured 1.5x the throughput of 100 MB messages here.
SOCKET_BUFFER_BYTES = 8 << 20

# Frames from this size up are sent without a copy; smaller ones are copied (cheaper than
# ZeroMQ's zero-copy bookkeeping, as pyzmq itself decides).
ZERO_COPY_BYTES = zmq.COPY_THRESHOLD
# Plain ints: combining pyzmq's enum flags (e.g. EVENTS & POLLIN) runs Python-level enum code.
_SNDMORE, _NOBLOCK = int(zmq.SNDMORE), int(zmq.NOBLOCK)
# What one message of a peer not trusted yet may be (a ROUTER's peer before its HELLO or
# REGISTER): the same 64 KiB as a data connection's opening message, and a few frames (a
# routing identity, a header, a body); its replies are bounded like anyone's.
STRANGER_BOUNDS = Bounds(64 << 10, 8, DEFAULT_BOUNDS.send_queue_bytes, DEFAULT_BOUNDS.slow_peer_timeout)


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
    return _rest(sock, sock.recv(_NOBLOCK, copy=False), bounds, drain)


def recv_routed(sock: zmq.Socket[Any], bounds: Bounds, drain: bool, trusted: Callable[[bytes], bool]
                ) -> list[zmq.Frame]:
    """:func:`recv_frames` of a ROUTER socket whose peers are trusted or strangers: a message
    whose routing identity (its first frame) ``trusted`` refuses gets :data:`STRANGER_BOUNDS`,
    so one message of a peer that has not proven itself costs a handful of frames, not
    ``bounds`` (the rest of a bigger one is discarded in steps, like an oversized one)."""
    first = sock.recv(_NOBLOCK, copy=False)
    return _rest(sock, first, bounds if trusted(first.bytes) else STRANGER_BOUNDS, drain)


def _rest(sock: zmq.Socket[Any], frame: zmq.Frame, bounds: Bounds, drain: bool) -> list[zmq.Frame]:
    """The message whose first frame is ``frame``, read to its end within ``bounds`` (see :func:`recv_frames`)."""
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
        if self._bounds is STRANGER_BOUNDS:
            return (f"a message of {self.count} frames, {self.size}+ bytes from a peer not trusted yet (routing "
                    f"identity {self.head!r}), over {STRANGER_BOUNDS.max_frames} frames or "
                    f"{STRANGER_BOUNDS.max_message_bytes} bytes: discarded")
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


def router_socket(ctx: zmq.Context[Any], address: str, bounds: Bounds, security: CurveSecurity | None
                  ) -> tuple[zmq.Socket[Any], str]:
    """A service's ROUTER socket bound to ``address`` (port 0: one the OS picks), with
    ``bounds`` per peer (a frame over the message limit is refused by ZeroMQ before it is
    allocated, and its peer disconnected; a peer's send queue holds ``SEND_HWM`` messages)
    and, with ``security`` (its ZAP handler started), a CURVE server.

    Returns:
        ``(socket, the bound address)``.

    Raises:
        TransportError: the address cannot be bound.
    """
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(zmq.RCVBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to a vanished peer raises, not drops
    # A peer that reconnects (its TCP connection was reset) under its fixed routing
    # identity takes over the old route instead of being refused as a duplicate.
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    sock.setsockopt(zmq.MAXMSGSIZE, bounds.max_message_bytes)
    sock.setsockopt(zmq.SNDHWM, SEND_HWM)
    if security is not None:
        security.server(sock)
    try:
        if address.startswith("tcp://") and address.endswith(":0"):
            port = sock.bind_to_random_port(address[: -len(":0")])
            address = f"{address[: -len(':0')]}:{port}"
        else:
            sock.bind(address)
    except zmq.ZMQError as exc:
        sock.close(0)
        raise TransportError(f"cannot bind {address}: {exc}") from None
    return sock, address


def dealer_socket(ctx: zmq.Context[Any], address: str, identity: bytes | None, security: CurveSecurity | None,
                  bounds: Bounds = DEFAULT_BOUNDS) -> zmq.Socket[Any]:
    """A DEALER socket connected to a service at ``address`` under routing ``identity``
    (None: ZeroMQ's own), a CURVE client with ``security`` (not for ``inproc://``).

    As a ROUTER's (:func:`router_socket`), a frame over ``bounds.max_message_bytes`` is refused by ZeroMQ
    before it is allocated (and the connection dropped): whoever answers at ``address`` may be no service of
    the job, and a reply of more bytes would be discarded once read anyway (:func:`recv_frames`)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(zmq.RCVBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(zmq.MAXMSGSIZE, bounds.max_message_bytes)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    if security is not None and not address.startswith("inproc://"):
        security.client(sock)
    sock.connect(address)
    return sock
