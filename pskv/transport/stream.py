"""Plain TCP connections between a worker and a server on another host: the data channel.

ZeroMQ moves every byte through its I/O threads: a message is copied into ZeroMQ's
queue, woken across two mailboxes, written by another thread, and read the same way on
the other side. On the CPU-bound paths of a parameter server that doubles the cost
(``bench/bench_transport.py``: a plain socket carried the ResNet-50 list 2.2x faster and
a 4 KB round trip 2-2.7x faster than ZeroMQ on the same loopback). So a server also
listens on a plain TCP port and workers on other hosts send their requests there and
get their replies on the same connection; ZeroMQ stays for everything else (the
scheduler, the connection's opening). In a job with a CURVE cluster key every connection
is sealed (:mod:`pskv.transport.sealed`: a key exchange after the preamble, then each
message's table and body as AES-GCM records); without one its sealing does nothing.

The wire format, per connection:

* the connecting side first sends a *preamble*: :data:`MAGIC` and a tag of 17 ASCII
  characters (the worker's 16-hex-digit session name and a lane digit). The tag names
  the connection: a worker that reconnects after a reset presents the same tag, so the
  server's record of its requests (repeats are answered, not applied twice) carries
  over, as ZeroMQ's fixed routing identities do (sealed: another magic, and the tag is
  followed by the worker's X25519 public key, which the server answers with its own);
* then messages, each a table — the frame count (u32) and every frame's length (u64),
  little-endian — followed by the frames (sealed: the lengths and the frames are two
  records, each followed by its 16-byte tag).

Every length is checked against the node's bounds before anything is allocated for it
(:class:`~pskv.transport.bounds.Bounds`); until its first message arrived (a *stranger*:
until its owner trusts it, :meth:`StreamConnection.trust`), a connection may send
messages of :data:`OPENING_BYTES` and 8 frames at most (a ``HELLO``, which the server checks
like any other; a ZeroMQ peer not trusted yet has the same bounds). A peer's counts and
lengths never size a buffer up front beyond :data:`GROWTH` bytes: a message's table (and a
stranger's body) grows by that much as its bytes arrive, so a connection holds little more
than it has sent. Sending never waits: what the socket does not take now waits in the
connection's queue (not copied: the frames must stay unchanged until answered, as for
ZeroMQ's zero-copy sends) and leaves when the socket is writable — the reactor polls for
that (:mod:`pskv.transport.reactor`). The receiving side reads exactly one message at a
time into one buffer; its frames are views of it.

A :class:`StreamConnection` offers what :class:`~pskv.transport.unix.LocalConnection`
offers, so the reactor and the worker treat both alike: any thread sends; one thread at
a time receives (the reactor, or a thread waiting for its reply).

**Congestion control.** A job's data connections are many flows that share every link:
each worker's link carries one flow to each server, each server's link one from each
worker, and a server's merge of a partition waits for the slowest of them. BBR (v1)
does not share a bottleneck evenly between such flows: on simulated hosts whose kernel
default is BBR (``bench/bench_hosts.py``, links shaped by ``tc tbf``) one worker's flow to
a server ran 2-3 partitions (0.2-0.5 s) behind the other's in turn, so every merge waited
for it and a worker link carried both ways at once 45-70 % of the time; Gloo's ring, one
flow per link and direction, did not suffer. So a data connection whose congestion
control is :data:`AVOIDED` takes the first of :data:`INSTEAD` that the kernel lets this
process choose (``TCP_CONGESTION``; loss-based, which shares a FIFO bottleneck evenly;
reno is open to every process): in the same setup (W = 2, timeline of 64 merges) the time
merges waited for their last worker fell from 16 s to 1.5 s in all, and both setups' ratios
to Gloo rose by 0.1-0.4 (``docs/benchmarks.md``). Any other choice of the system (cubic,
DCTCP) is kept; where none can be set, the default stays.
"""

from __future__ import annotations

import collections
import itertools
import re
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pskv.errors import ProtocolError
from pskv.transport.bounds import DEFAULT_BOUNDS, Bounds, check_size
from pskv.transport.frames import SOCKET_BUFFER_BYTES, STRANGER_BOUNDS
from pskv.transport.sealed import NO_KEYS, PLAIN, PLAIN_MAGIC, Channel, Keys

__all__ = ["AVOIDED", "GROWTH", "INSTEAD", "MAGIC", "OPENING_BYTES", "OPENING_TIMEOUT", "StreamConnection",
           "choose_congestion", "listen_tcp", "tag_of"]

MAGIC = PLAIN_MAGIC
_TAG = re.compile(rb"[0-9a-f]{16}[0-9]")
TAG_BYTES = 17
# The first message on an accepted connection (a HELLO), and every one before its owner
# trusts it, may have at most this many bytes; a server closes a data connection not trusted
# within OPENING_TIMEOUT seconds of its opening (pskv.transport.polled).
OPENING_BYTES = 64 << 10
OPENING_TIMEOUT = 5.0
# ... and at most this many frames (a HELLO has one), as a ZeroMQ peer not trusted yet
_OPENING_FRAMES = STRANGER_BOUNDS.max_frames
# Bytes a peer's count or length may make a connection allocate before they arrive: a table
# longer than this (a stranger's body too) is read in pieces of it, into a buffer that grows.
GROWTH = 16 << 10
_COUNT = struct.Struct("<I")
_MAX_BUFFERS = 512  # buffers gathered by one sendmsg (the kernel takes at most IOV_MAX = 1024)
_SMALL = 1 << 16  # bodies up to this size are read into a bytearray (zero-filled), bigger ones into np.empty
# MSG_NOSIGNAL: a closed peer is an error, not SIGPIPE
_SEND_FLAGS = int(socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
_DONTWAIT = int(socket.MSG_DONTWAIT)
# Keepalive: a peer whose host vanished is noticed within ~IDLE + INTERVAL * COUNT seconds
_KEEPALIVE = (10, 5, 3)
#: congestion controls a data connection does not keep (see the module docstring) ...
AVOIDED = frozenset({b"bbr"})
#: ... and those it takes instead, the first the kernel allows this process (reno is always allowed on Linux)
INSTEAD = (b"cubic", b"reno")
_CONGESTION = getattr(socket, "TCP_CONGESTION", None)  # Linux only

_PREAMBLE, _COUNTING, _TABLE, _BODY = range(4)


def tag_of(session: str, lane: int) -> bytes:
    """The tag a worker's connection presents: its 16-hex-digit session name and a lane (0-9)."""
    tag = f"{session}{lane}".encode()
    if not _TAG.fullmatch(tag):
        raise ValueError(f"not a connection tag: session {session!r}, lane {lane}")
    return tag


def choose_congestion(sock: socket.socket) -> bytes | None:
    """Give ``sock`` a congestion control that shares links evenly (module docstring); the one in effect.

    None where the platform has no ``TCP_CONGESTION``. Never raises for a choice refused.
    """
    if _CONGESTION is None:
        return None
    current = sock.getsockopt(socket.IPPROTO_TCP, _CONGESTION, 16).rstrip(b"\0")
    if current not in AVOIDED:
        return current
    for name in INSTEAD:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, _CONGESTION, name)
            return name
        except OSError:  # not built in, or not allowed to this process (net.ipv4.tcp_allowed_congestion_control)
            continue
    return current


def _nobody() -> bool:
    """The default :attr:`StreamConnection.vouch`: no owner trusts a stranger between its messages."""
    return False


def _tune(sock: socket.socket) -> None:
    choose_congestion(sock)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a small request goes out at once
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle, interval, count = _KEEPALIVE
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)


def listen_tcp(host: str) -> socket.socket:
    """A non-blocking listening TCP socket on ``host``, port chosen by the OS.

    Raises:
        OSError: the address cannot be bound.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):  # inherited by accepted sockets before the handshake
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
        choose_congestion(sock)  # inherited too: the accepted connection's first bytes already use it
        sock.bind((host, 0))
        sock.listen(256)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class StreamConnection:
    """One end of a TCP data connection: whole messages out (any thread, never waiting) and in (one thread).

    Args:
        sock: the connected socket.
        name: for error messages and logs.
        bounds: the limits of received messages; with ``queue_limit``, of the send queue's age.
        queue_limit: bytes the send queue may hold (a service's connection: past it the
            peer is dropped); None: unbounded (a worker's requests, bounded by their callers).
        accepted: this end accepted the connection: it first reads the peer's preamble
            (:attr:`tag` is known after it), and the first message is bounded by
            :data:`OPENING_BYTES`.
        on_pending: called (from the sending thread, outside the lock) when the send
            queue stops being empty: someone must flush it when the socket is writable.
        stranger: (``accepted`` only) every message, not only the first, is bounded by
            :data:`OPENING_BYTES` and its body grows as it arrives, until :meth:`trust`.
        seal: the connection's sealing (:mod:`pskv.transport.sealed`; an accepted one agrees
            its keys when the preamble comes): :data:`~pskv.transport.sealed.PLAIN` without a key.
    """

    __slots__ = ("_sock", "_lock", "name", "fd", "_bounds", "_queue_limit", "_queue", "_queue_bytes", "_progress",
                 "_on_pending", "reading", "claimed", "polled", "_read_timeout", "_stage", "_want", "_target",
                 "_lengths", "tag", "opened", "_first", "_broken", "_stranger", "_grown", "_size",
                 "_seal", "_count", "vouch", "__weakref__")

    def __init__(self, sock: socket.socket, name: str, bounds: Bounds = DEFAULT_BOUNDS,
                 queue_limit: int | None = None, accepted: bool = False,
                 on_pending: Callable[[], None] | None = None, stranger: bool = False,
                 seal: Channel = PLAIN) -> None:
        # Blocking at the OS level (a thread waiting for its reply blocks in recv, bounded
        # by SO_RCVTIMEO); every other call passes MSG_DONTWAIT.
        sock.setblocking(True)
        _tune(sock)
        self._sock: socket.socket | None = sock
        self._lock = threading.Lock()  # sending: one message's bytes stay together, in order
        self.name = name
        self.fd = sock.fileno()
        self._bounds = bounds
        self._queue_limit = queue_limit
        self._queue: collections.deque[memoryview] = collections.deque()  # bytes the socket has not taken
        self._queue_bytes = 0
        self._progress = 0.0  # monotonic time the queue last moved (or began)
        self._on_pending = on_pending
        self._broken = False  # a send failed: shut down, closed by whoever polls it (see _break_locked)
        self.reading = threading.Lock()  # held by the one thread that reads messages and hands them on
        self.claimed = False  # a thread waiting for a reply reads it (the reactor leaves it out of its poll)
        self.polled = True  # in the reactor's poll set for reading (changed by the reactor thread only)
        self._read_timeout: float | None = None
        self.tag: bytes | None = None if accepted else b""
        self.opened = time.monotonic()
        self._first = accepted  # the first message is not in yet (bounded by OPENING_BYTES)
        self._seal = seal
        self._count = 0  # frames of the message being read
        self._target: Any = (bytearray(len(seal.magic) + TAG_BYTES + seal.hello_bytes) if accepted
                             else bytearray(_COUNT.size))
        self._stage = _PREAMBLE if accepted else _COUNTING
        self._want = memoryview(self._target)
        self._lengths: tuple[int, ...] = ()
        self._stranger = stranger and accepted
        self._grown: bytearray | None = None  # the piece read so far, while it arrives in GROWTH steps
        self._size = 0  # the bytes of that piece
        # asked (only) before a stranger's message past its first is refused: True if its owner trusts it by now
        # (a HELLO held until the server registered was handled since); it calls trust(). By default: nobody
        self.vouch: Callable[[], bool] = _nobody

    @classmethod
    def connect(cls, host: str, port: int, tag: bytes, name: str, timeout: float, bounds: Bounds = DEFAULT_BOUNDS,
                on_pending: Callable[[], None] | None = None, keys: Keys = NO_KEYS) -> StreamConnection:
        """Connect to a server's data port (waiting at most ``timeout`` s), send the preamble and,
        with a cluster key, agree the connection's keys (:mod:`pskv.transport.sealed`).

        Raises:
            OSError: the connection failed (refused, unreachable, timed out, closed by the server).
            ProtocolError: the server's key exchange is invalid.
        """
        sock = socket.create_connection((host, port), timeout=timeout)
        seal = keys.channel(name)
        try:
            sock.sendall(seal.magic + tag + seal.hello())
            answer = bytearray(seal.answer_bytes)
            view = memoryview(answer)
            while view.nbytes:  # bounded by the connection's timeout
                n = sock.recv_into(view)
                if not n:
                    raise ConnectionError(f"{name}: the server closed the connection during its opening")
                view = view[n:]
            seal.finish(tag, bytes(answer))
        except (OSError, ProtocolError):
            sock.close()
            raise
        return cls(sock, name, bounds, None, False, on_pending, seal=seal)

    # -- sending ---------------------------------------------------------------------------
    def send(self, frames: Sequence[Any]) -> None:
        """Send one message (or queue what the socket does not take now); never waits.

        Raises:
            ConnectionError: the connection is closed or failed, or (``queue_limit``) its
                queue passed the limit (the connection is closed then).
            InvalidArgumentError: the message is bigger than the peer takes
                (``PSKV_MAX_MESSAGE_BYTES``; a client's connection only).
        """
        views = [memoryview(f).cast("B") for f in frames]
        if self._queue_limit is None:
            check_size(views, self._bounds.max_message_bytes, self.name)
        table = _COUNT.pack(len(views)) + struct.pack(f"<{len(views)}Q", *(v.nbytes for v in views))
        views.insert(0, memoryview(table))
        with self._lock:
            sock = self._sock
            if sock is None or self._broken:
                raise ConnectionError(f"{self.name} is closed")
            views = self._seal.seal(views)  # in the order the messages go out: the records' nonces count up
            was_empty = not self._queue
            if was_empty:
                views = self._write(sock, views)
                if not views:
                    return
                self._progress = time.monotonic()
            for view in views:
                self._queue.append(view)
                self._queue_bytes += view.nbytes
            if self._queue_limit is not None and self._queue_bytes > self._queue_limit:
                queued = self._queue_bytes
                self._break_locked()
                raise ConnectionError(f"{self.name}: the peer left {queued} bytes unread, more than "
                                      f"PSKV_SEND_QUEUE_BYTES={self._queue_limit}: dropped")
        if was_empty and self._on_pending is not None:
            self._on_pending()

    def _write(self, sock: socket.socket, views: list[memoryview]) -> list[memoryview]:
        """Write what the socket takes now (lock held); the views not (wholly) written.

        Raises:
            ConnectionError: the connection failed (it is closed).
        """
        start = 0
        while start < len(views):
            batch = views[start:start + _MAX_BUFFERS]
            try:
                sent = sock.sendmsg(batch, (), _SEND_FLAGS)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self._break_locked()
                raise ConnectionError(f"{self.name}: {exc}") from None
            for view in batch:
                if sent >= view.nbytes:
                    sent -= view.nbytes
                    start += 1
                else:
                    views[start] = view[sent:]
                    return views[start:]
        return views[start:]

    @property
    def pending(self) -> bool:
        """True while queued bytes wait for the socket (call :meth:`flush` when it is writable)."""
        return bool(self._queue)

    def flush(self) -> bool:
        """Write queued bytes while the socket takes them (never waits); True once the queue is empty.

        Raises:
            ConnectionError: the connection failed (it is closed, its queue discarded).
        """
        with self._lock:
            sock = self._sock
            if sock is None:
                return True
            if self._broken:
                raise ConnectionError(f"{self.name} failed")
            while self._queue:
                batch = list(itertools.islice(self._queue, _MAX_BUFFERS))
                left = self._write(sock, batch)
                done = len(batch) - len(left)
                for _ in range(done):
                    self._queue_bytes -= self._queue.popleft().nbytes
                if left:
                    if left[0].nbytes != self._queue[0].nbytes:  # a view written in part
                        self._queue_bytes -= self._queue[0].nbytes - left[0].nbytes
                        self._queue[0] = left[0]
                        self._progress = time.monotonic()
                    return False
                self._progress = time.monotonic()
            return True

    def overdue(self, now: float) -> bool:
        """True if queued bytes have waited, untouched by the peer, longer than the slow-peer timeout."""
        return bool(self._queue) and now - self._progress > self._bounds.slow_peer_timeout

    # -- receiving -------------------------------------------------------------------------
    def receive(self, wait: float | None = None) -> list[memoryview] | None:
        """Read what has come; the next message's frames once it is whole and valid.

        Args:
            wait: seconds to wait for bytes (a thread waiting for its reply); None: none
                (the reactor, after its poll).

        Returns:
            The frames, or None while the message is incomplete.

        Raises:
            BlockingIOError: nothing came (within ``wait``).
            EOFError: the peer closed the connection.
            ConnectionError: the connection failed.
            ProtocolError: the preamble or a message's table is malformed or over a bound
                (the caller closes the connection: what follows cannot be framed).
        """
        sock = self._sock
        if sock is None:
            raise EOFError(f"{self.name} is closed")
        flags = _DONTWAIT
        if wait is not None:
            flags = 0
            if wait != self._read_timeout:  # a blocking read, bounded by SO_RCVTIMEO
                whole = int(wait)
                usec = max(int((wait - whole) * 1e6), 0 if whole else 1)  # zero would mean: without limit
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", whole, usec))
                self._read_timeout = wait
        got = False
        while True:
            want = self._want
            if want.nbytes:
                try:
                    n = sock.recv_into(want, want.nbytes, flags)
                except (BlockingIOError, InterruptedError):
                    if got:
                        return None
                    raise
                if n == 0:
                    raise EOFError(f"{self.name}: the peer closed the connection")
                got = True
                self._want = want[n:]
                if n < want.nbytes:
                    flags = _DONTWAIT  # take what else has come, then report progress
                    continue
            frames = self._advance()
            if frames is not None:
                return frames

    def _advance(self) -> list[memoryview] | None:
        """The current piece (preamble, count, table, body) is in: check it and set up the next."""
        if self._grown is not None and not self._gather():
            return None
        stage = self._stage
        if stage == _PREAMBLE:
            self._opened(bytes(self._target))
            return None
        if stage == _COUNTING:
            (count,) = _COUNT.unpack(self._target)
            if not 0 < count <= self._bounds.max_frames or (
                    count > _OPENING_FRAMES and (self._first or self._stranger) and not self._vouched()):
                raise ProtocolError(self._refused_count(count))
            self._count = count
            self._expect_growing(_TABLE, 8 * count + self._seal.overhead)
            return None
        if stage == _TABLE:
            lengths = struct.unpack(f"<{self._count}Q", self._seal.open_table(self._target, self._count))
            total = sum(lengths)
            most = self._bounds.max_message_bytes
            if total > (OPENING_BYTES if self._first or self._stranger else most) and not (
                    total <= most and self._vouched()):
                setting = (f"{OPENING_BYTES} bytes for a connection's first message (or any before it is trusted)"
                           if self._first or self._stranger else f"PSKV_MAX_MESSAGE_BYTES={most}")
                raise ProtocolError(f"{self.name}: a message of {total} bytes in {len(lengths)} frames, over {setting}")
            self._lengths = lengths
            size = total + self._seal.overhead
            if self._stranger:
                self._expect_growing(_BODY, size)
            else:
                self._expect(_BODY, bytearray(size) if size <= _SMALL else np.empty(size, np.uint8))
            if size:
                return None
        view = self._seal.open_body(memoryview(self._target).cast("B"))
        frames, offset = [], 0
        for n in self._lengths:
            frames.append(view[offset: offset + n])
            offset += n
        self._first = False
        self._expect(_COUNTING, bytearray(_COUNT.size))
        return frames

    def _vouched(self) -> bool:
        """True if this connection, a stranger's past its first message, is trusted now (:attr:`vouch`)."""
        if self._first or not self._stranger or not self.vouch():
            return False
        self._stranger = False
        return True

    def _refused_count(self, count: int) -> str:
        """Why a message of ``count`` frames is refused."""
        if count and (self._first or self._stranger):
            return (f"{self.name}: a message of {count} frames, over {_OPENING_FRAMES} for a connection's first "
                    "message (or any before it is trusted)")
        return f"{self.name}: a message of {count} frames (PSKV_MAX_FRAMES={self._bounds.max_frames})"

    def _opened(self, data: bytes) -> None:
        """The preamble is in: check it, take the tag, answer the key exchange if sealed.

        Raises:
            ProtocolError: not a pskv data connection (or not sealed as this end is), or an invalid key exchange.
        """
        seal = self._seal
        at = len(seal.magic)
        tag = data[at:at + TAG_BYTES]
        if not data.startswith(seal.magic) or not _TAG.fullmatch(tag):
            raise ProtocolError(f"{self.name}: {seal.refusal(data)}")
        answer = seal.accept(tag, data[at + TAG_BYTES:])
        if answer:  # the first bytes this end sends: a fresh socket's buffer takes them
            assert self._sock is not None
            try:
                sent = self._sock.send(answer, _SEND_FLAGS)
            except OSError as exc:
                raise ConnectionError(f"{self.name}: {exc}") from None
            if sent != len(answer):
                raise ConnectionError(f"{self.name}: the key exchange's answer did not fit the socket")
        self.tag = tag
        self._expect(_COUNTING, bytearray(_COUNT.size))

    def _expect(self, stage: int, target: Any) -> None:
        self._stage, self._target = stage, target
        self._want = memoryview(target).cast("B")

    def _expect_growing(self, stage: int, size: int) -> None:
        """Expect ``size`` bytes a peer announced: at once if at most GROWTH, else GROWTH at a time (:meth:`_gather`)."""
        if size <= GROWTH:
            self._expect(stage, bytearray(size))
            return
        self._grown, self._size = bytearray(), size
        self._expect(stage, bytearray(GROWTH))

    def _gather(self) -> bool:
        """A GROWTH step is in: add it to the piece; True once the piece is whole (it is the target then)."""
        grown = self._grown
        assert grown is not None
        grown += self._target
        left = self._size - len(grown)
        if left > 0:
            if len(self._target) != min(left, GROWTH):
                self._target = bytearray(min(left, GROWTH))
            self._want = memoryview(self._target)
            return False
        self._grown = None
        self._target = grown
        return True

    def trust(self) -> None:
        """The owner knows the peer now (a stranger's HELLO was accepted): its messages are bounded by the node's
        bounds from now on, and read into buffers sized up front."""
        self._stranger = False

    @property
    def trusted(self) -> bool:
        """False while the connection is a stranger's (see ``stranger``)."""
        return not self._stranger

    @property
    def opening(self) -> bool:
        """True until the first message arrived (an accepted connection)."""
        return self._first

    # -- closing ---------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """True once the connection was closed (by either side's failure, or :meth:`close`)."""
        return self._sock is None

    def close(self) -> None:
        """Close the socket (idempotent); later sends raise ConnectionError; the queue is discarded.

        A thread blocked reading it is woken (``shutdown`` first).
        """
        with self._lock:
            self._close_locked()

    def _break_locked(self) -> None:
        """A send failed (or the queue passed its bound): shut the connection down both ways, but
        leave the descriptor open — the thread that polls it (the reactor) sees the end as it
        reads, drops the connection and closes it; closing it here, from a sending thread, would
        let the poll go on watching a descriptor number the system may already reuse."""
        if not self._broken and self._sock is not None:
            self._broken = True
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._queue.clear()
        self._queue_bytes = 0

    def _close_locked(self) -> None:
        sock = self._sock
        if sock is not None:
            self._sock = None
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        self._queue.clear()
        self._queue_bytes = 0
