"""The connections a reactor polls itself, outside ZeroMQ: local and TCP data connections.

Besides its ZeroMQ sockets, a node's reactor (:mod:`pskv.transport.reactor`) polls plain
sockets of two kinds, which behave alike (:class:`PolledConnection`):

* Unix-domain local connections between nodes of one host (:mod:`pskv.transport.unix`):
  a service accepts them at a path (:meth:`PolledConnections.bind_local`), a client
  connects one (:meth:`PolledConnections.connect_local`);
* plain TCP data connections between hosts (:mod:`pskv.transport.stream`): a service
  accepts them on a port (:meth:`PolledConnections.bind_stream`) — at most
  :data:`MAX_STREAMS` of the job's members, and apart from them a pool of at most
  :data:`MAX_STRANGERS` connections not trusted yet, which must authenticate in time
  (:meth:`PolledConnections.close_unopened`) — and a client hands over the one it
  connected (:meth:`PolledConnections.adopt_stream`).

On the service side an accepted connection looks like a ROUTER peer: its messages reach
the ROUTER's handler under an identity starting with :data:`LOCAL_PREFIX`, and the
reactor's ``send_router`` answers it on its connection (:meth:`PolledConnections.send`).
Replies never wait for a peer that reads nothing: they queue on the connection (bounded)
and leave when it is writable (:meth:`PolledConnections.flush`); a peer that takes none
for ``PSKV_SLOW_PEER_TIMEOUT`` seconds is dropped.

On the client side, a thread waiting for a reply may read its connection itself
(:meth:`PolledConnections.read_local`) while the reactor leaves it out of its poll
(:meth:`PolledConnections.poll_clients`): one thread woken per reply instead of two.

Everything here runs on the reactor thread, but for :meth:`PolledConnections.read_local`
(a waiting thread). The reactor owns the poller and the table of descriptor handlers;
this class adds its descriptors to both and runs when the poll says they are ready.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import zmq

from pskv.errors import ProtocolError, TransportError
from pskv.transport.bounds import Bounds
from pskv.transport.sealed import NO_KEYS, Keys
from pskv.transport.security import RefusalLog
from pskv.transport.stream import StreamConnection, listen_tcp
from pskv.transport.unix import LocalConnection, listen

if TYPE_CHECKING:  # the reactor hands its handlers in; only their types are needed here
    from pskv.transport.reactor import DealerHandler, RouterHandler

__all__ = ["LOCAL_PREFIX", "MAX_STRANGERS", "MAX_STREAMS", "PolledConnection", "PolledConnections"]

log = logging.getLogger("pskv.transport")

# Identities of a ROUTER's local connections (bind_local). A ZeroMQ peer may choose any
# routing identity: one with this prefix is dropped, so it cannot speak on a local
# connection's binding (pskv.server.senders).
LOCAL_PREFIX = b"\x00local-"


_POLLIN, _POLLOUT = int(zmq.POLLIN), int(zmq.POLLOUT)
# Packets read from one local connection in one turn of the reactor.
_LOCAL_BATCH = 16
# A thread reading its replies itself (read_local) checks whether its request ended
# otherwise (a timeout, a dead peer) at least this often (seconds).
_READ_SLICE = 0.05
# Data connections (bind_stream) of the job's members a service keeps open at most (more are
# closed as they come, logged), and apart from them, connections not trusted yet (a stranger's
# cost: docs/security.md): a new one past this many closes the oldest of them, never a member's.
MAX_STREAMS = 4096
MAX_STRANGERS = 64


class PolledConnection(Protocol):
    """A connection the reactor polls itself, outside ZeroMQ: a local one (:class:`LocalConnection`) or a TCP
    data connection (:class:`StreamConnection`).

    Whole messages leave from any thread (:meth:`send`; what the peer cannot take yet may
    queue, :attr:`pending`, until :meth:`flush`) and arrive on the one thread holding
    :attr:`reading`: the reactor, or a thread waiting for its reply (:meth:`PolledConnections.read_local`).
    """

    name: str  # for logs and error messages
    fd: int  # the socket's descriptor, as polled
    reading: threading.Lock  # held by the one thread that receives and hands the messages on, in order
    claimed: bool  # a thread waiting for a reply reads it: the reactor leaves it out of its poll
    polled: bool  # in the reactor's poll set for reading (changed by the reactor thread only)

    def send(self, frames: Sequence[Any]) -> None:
        """Send one message, or queue what the peer cannot take yet. Raises ConnectionError once closed."""

    @property
    def pending(self) -> bool:
        """True while queued bytes wait for the peer (call :meth:`flush` when the socket is writable)."""

    def flush(self) -> bool:
        """Send queued bytes while the socket takes them (never waits); True once the queue is empty.

        Raises ConnectionError if the connection failed (it is closed).
        """

    def overdue(self, now: float) -> bool:
        """True if the peer took none of the queue for the bounds' slow-peer timeout."""

    def receive(self, wait: float | None = None) -> list[memoryview] | None:
        """Read what has come (waiting up to ``wait`` s, None: not at all); a whole message's frames, or None.

        Raises BlockingIOError if nothing came, EOFError, ConnectionError or ProtocolError
        if the connection ended or failed (the owner drops it).
        """

    @property
    def closed(self) -> bool:
        """True once the connection was closed."""

    def close(self) -> None:
        """Close it (idempotent)."""


class PolledConnections:
    """A reactor's local and data connections: accepted, connected, read, written and dropped.

    Args:
        poller: the reactor's poller; connections and listeners are registered on it.
        fd_handlers: the reactor's table of raw descriptors it polls with its sockets and
            the function each runs when readable.
        name: the reactor's name, used in logs and connection names.
        bounds: what one peer may cost the node (:mod:`pskv.transport.bounds`).
        ids: the reactor's counter of ids; accepted local connections take theirs from it.
        call_soon: the reactor's thread-safe ``call_soon`` (raises ``TransportError`` once
            stopped): a waiting thread hands a failed connection to the reactor with it.
        keys: how data connections are sealed (:mod:`pskv.transport.sealed`): the cluster
            key's, or none.

    :attr:`peers`, :attr:`writable` and :attr:`clients` stay the same objects (the
    reactor's loop checks them each turn); they are only cleared, by :meth:`close`.
    """

    def __init__(self, poller: zmq.Poller, fd_handlers: dict[int, Callable[[], None]], name: str,
                 bounds: Bounds, ids: Iterator[int], call_soon: Callable[[Callable[[], None]], None],
                 keys: Keys = NO_KEYS) -> None:
        self._poller = poller
        self._fd_handlers = fd_handlers
        self._name = name
        self._bounds = bounds
        self._ids = ids
        self._call_soon = call_soon
        self.keys = keys
        self.writable: dict[int, PolledConnection] = {}  # service connections with queued replies, by descriptor
        self._listeners: list[socket.socket] = []
        self.connections: dict[int, tuple[PolledConnection, bytes | None]] = {}  # by descriptor
        self.peers: dict[bytes, PolledConnection] = {}  # accepted connections by identity
        self.clients: list[PolledConnection] = []  # connect_local's, adopt_stream's: a waiting thread may read them
        self._masks: dict[int, int] = {}  # poll flags of client connections, where not POLLIN
        self._opening: dict[int, StreamConnection] = {}  # accepted data connections not trusted yet, oldest first
        self._trusts: Callable[[bytes], bool] | None = None  # bind_stream's ``trusted``
        self._on_lost: dict[int, Callable[[], None]] = {}  # client data connections: called once dropped
        self._refused = RefusalLog(log, limit=16)

    # -- a service's connections -----------------------------------------------------------
    def bind_local(self, path: str, handler: RouterHandler) -> None:
        """Also accept local connections at ``path`` for a ROUTER whose handler is ``handler``.

        Their messages reach ``handler`` with identities of their own, and
        :meth:`send` answers them on their connection.

        Raises:
            TransportError: the path cannot be bound.
        """
        self._listen(path, listen, lambda listener: self._accept(listener, handler))

    def _listen(self, where: str, make: Callable[[str], socket.socket],
                accept: Callable[[socket.socket], None]) -> socket.socket:
        """Listen at ``where`` (``make(where)``) and poll it; ``accept(listener)`` takes what comes.

        Raises:
            TransportError: ``where`` cannot be bound.
        """
        try:
            listener = make(where)
        except OSError as exc:
            raise TransportError(f"cannot listen on {where}: {exc}") from None
        self._listeners.append(listener)
        self._fd_handlers[listener.fileno()] = lambda: accept(listener)
        self._poller.register(listener.fileno(), zmq.POLLIN)
        return listener

    def _accept(self, listener: socket.socket, handler: RouterHandler) -> None:
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        identity = LOCAL_PREFIX + b"%d" % next(self._ids)
        # Replies never wait for a peer that reads nothing: they queue on the connection
        # (bounded, see send) and leave when it is writable.
        conn = LocalConnection(sock, f"{self._name} local connection", bounds=self._bounds, queued=True)
        self.peers[identity] = conn

        deliver = partial(handler, identity)

        def on_packet() -> None:
            self._receive(conn, deliver)  # type: ignore[arg-type]
        self._watch(conn, on_packet, identity)

    def bind_stream(self, host: str, handler: RouterHandler, trusted: Callable[[bytes], bool] | None = None) -> int:
        """Also accept TCP data connections (:mod:`pskv.transport.stream`) on ``host`` for ``handler``'s ROUTER.

        As for :meth:`bind_local`, their messages reach the ROUTER's handler — under the
        identity their preamble names, from their first message on — and
        :meth:`send` answers them on their connection. A connection is a *stranger* until
        ``trusted(identity)`` holds after one of its messages (the server: a HELLO with
        the worker's token bound it; None: its first message is enough): till then its
        messages are bounded by :data:`~pskv.transport.stream.OPENING_BYTES` and read into
        buffers that grow as they arrive, it has ``timeout`` seconds to become trusted
        (:meth:`close_unopened`, which the caller runs every second), and it takes one of
        :data:`MAX_STRANGERS` places (a new stranger past them closes the oldest), not one
        of the :data:`MAX_STREAMS` of members. Returns the port.

        Raises:
            TransportError: the address cannot be bound.
        """
        self._trusts = trusted
        listener = self._listen(host, listen_tcp, lambda listener: self._accept_stream(listener, handler))
        return int(listener.getsockname()[1])

    def _accept_stream(self, listener: socket.socket, handler: RouterHandler) -> None:
        try:
            sock, peer = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # e.g. out of descriptors: the peer retries
            self._refused.error("accept", f"{self._name}: cannot accept a data connection: {exc}")
            return
        where = f"{peer[0]}:{peer[1]}"
        if len(self.connections) - len(self._opening) >= MAX_STREAMS:
            sock.close()
            self._refused.error("full", f"{self._name}: closed a data connection from {where}: "
                                        f"{MAX_STREAMS} (the most) are open")
            return
        if len(self._opening) >= MAX_STRANGERS:  # the oldest stranger makes room: members' places are never taken
            oldest = next(iter(self._opening.values()))
            self._refused.error("full", f"{self._name}: closed {oldest.name}: {MAX_STRANGERS} connections "
                                        "not trusted yet (the most), it is the oldest")
            self.drop(oldest)
        name = f"{self._name} data connection from {where}"
        conn = StreamConnection(sock, name, self._bounds, queue_limit=self._bounds.send_queue_bytes, accepted=True,
                                stranger=True, seal=self.keys.channel(name))
        self._opening[conn.fd] = conn
        identity = b""

        def deliver(frames: list[memoryview]) -> None:
            nonlocal identity
            if not identity:  # its first message: the connection speaks under its tag from now on
                assert conn.tag is not None
                identity = LOCAL_PREFIX + b"tcp-" + conn.tag
                old = self.peers.get(identity)
                if old is not None:  # the same worker connecting again (a reset): this one takes over
                    log.info("%s: %s replaces the older connection of %r", self._name, conn.name, identity)
                    self.drop(old)
                self.peers[identity] = conn
                self.connections[conn.fd] = (conn, identity)
                conn.vouch = partial(self._check_trust, conn, identity)  # a HELLO handled late trusts it then
            handler(identity, frames)  # type: ignore[arg-type]
            if not conn.trusted and not conn.closed:
                self._check_trust(conn, identity)

        def on_packet() -> None:
            self._receive(conn, deliver)
        self._watch(conn, on_packet, None)

    def _check_trust(self, conn: StreamConnection, identity: bytes | None) -> bool:
        """Trust a stranger's connection if its owner does now (a member's place from now on); True if so."""
        if identity is None or (self._trusts is not None and not self._trusts(identity)):
            return False
        conn.trust()
        self._opening.pop(conn.fd, None)
        return True

    def close_unopened(self, timeout: float) -> None:
        """Close the data connections that were not trusted within ``timeout`` seconds
        (:data:`~pskv.transport.stream.OPENING_TIMEOUT`, the reactor's).

        The owner is asked once more first: a HELLO that came before the server registered
        is checked later, when the connection may have nothing more to say."""
        now = time.monotonic()
        for conn in [c for c in self._opening.values() if now - c.opened > timeout]:
            entry = self.connections.get(conn.fd)
            if self._check_trust(conn, entry[1] if entry is not None else None):
                continue
            self._refused.error("unopened", f"{self._name}: closed {conn.name}: not authenticated in "
                                            f"{timeout:g} s")
            self.drop(conn)

    def send(self, conn: PolledConnection, frames: list[Any]) -> bool:
        """Send ``frames`` to the accepted connection ``conn`` (the reactor's ``send_router``); never waits.

        What the socket does not take now queues on the connection, which is then polled
        for writing; a peer past its queue's bound, or gone, is dropped (logged).

        Returns:
            False if the peer is gone or dropped (the message is dropped), True otherwise.
        """
        try:
            conn.send(frames)
        except ConnectionError as exc:  # the peer is gone (its end is closed), or dropped as too slow
            log.warning("%s: local peer dropped: %s", self._name, exc)
            self.drop(conn)
            return False
        if conn.pending and conn.fd not in self.writable:
            self.writable[conn.fd] = conn
            self._poller.register(conn.fd, _POLLIN | _POLLOUT)
        return True

    def flush(self, fd: int) -> None:
        """A connection with queued messages is writable: send what it takes."""
        conn = self.writable.get(fd)
        if conn is None:  # a client's connection: polled for writing while its queue is not empty (poll_clients)
            entry = self.connections.get(fd)
            if entry is not None:
                try:
                    entry[0].flush()
                except ConnectionError as exc:
                    log.warning("%s: %s", self._name, exc)
                    self.drop(entry[0])
            return
        try:
            done = conn.flush()
        except ConnectionError as exc:  # the peer is gone
            log.warning("%s: local peer dropped: %s", self._name, exc)
            self.drop(conn)
            return
        if done:
            del self.writable[fd]
            self._poller.register(fd, _POLLIN)

    def drop_overdue(self, now: float) -> None:
        """Drop the connections whose peer took none of its queued replies for ``PSKV_SLOW_PEER_TIMEOUT`` s."""
        for conn in list(self.writable.values()):
            if conn.overdue(now):
                log.warning("%s: %s: the peer took none of its replies for %g s: dropped", self._name, conn.name,
                            self._bounds.slow_peer_timeout)
                self.drop(conn)

    # -- a client's connections ------------------------------------------------------------
    def adopt_stream(self, conn: StreamConnection, handler: DealerHandler, on_lost: Callable[[], None]) -> None:
        """Poll a client's data connection (:meth:`StreamConnection.connect`) as :meth:`connect_local` does.

        ``handler(frames)`` gets what the service sends back; a thread waiting for a reply
        may read it itself (:meth:`read_local`). The connection's sends never wait: make it
        with ``on_pending=reactor.wake`` so the reactor writes what the socket did not take.
        ``on_lost()`` is called (reactor thread) once the connection failed and was dropped.
        Call on the reactor thread.
        """
        def on_packet() -> None:
            if not conn.reading.acquire(blocking=False):
                return  # a thread waiting for a reply reads it now (read_local)
            try:
                self._receive(conn, handler)  # type: ignore[arg-type]
            finally:
                conn.reading.release()
        self._watch(conn, on_packet, None)
        self.clients.append(conn)
        self._on_lost[conn.fd] = on_lost

    def connect_local(self, path: str, handler: DealerHandler, send_timeout: float = 60.0) -> LocalConnection:
        """Connect to a service's local socket; ``handler(frames)`` gets what it sends back.

        The connection's :meth:`~LocalConnection.send` may be called from any thread and
        waits at most ``send_timeout`` seconds for a service that takes nothing.
        Call before the reactor starts or on the reactor thread.

        Raises:
            OSError: nobody listens at ``path``.
        """
        conn = LocalConnection.connect(path, f"{self._name} local connection to {path}", send_timeout, self._bounds)

        def on_packet() -> None:
            if not conn.reading.acquire(blocking=False):
                return  # a thread waiting for a reply reads it now (read_local)
            try:  # handled under the lock: replies reach the handler in the order they came
                self._receive(conn, handler)  # type: ignore[arg-type]
            finally:
                conn.reading.release()
        self._watch(conn, on_packet, None)
        self.clients.append(conn)
        return conn

    def read_local(self, conn: PolledConnection, handler: DealerHandler, done: Callable[[], bool],
                   deadline: float) -> None:
        """Read ``conn``'s packets in the calling thread, handing each message to ``handler``, until ``done()``.

        For a thread about to wait for a reply on a client's local connection (made by
        :meth:`connect_local`): it is woken by the reply itself, instead of the reactor
        being woken, reading it and waking the thread. Meanwhile the reactor leaves the
        connection out of its poll (from its next turn); it takes it back when the
        caller is done — the caller calls the reactor's ``wake`` if replies are due that
        nobody else will read (the reactor's timers turn it at least every 0.1 s anyway).

        Returns at once if another thread reads the connection now, when ``done()``
        holds, once ``deadline`` (``time.monotonic()``) passed (checked every
        ``_READ_SLICE`` s: it may be passed by that much), or if the connection failed
        (the reactor drops it, as if it had read the failure itself). Checks ``done()``
        at least every ``_READ_SLICE`` s (a request failed by a timeout or a dead peer
        completes without a packet). Never call it on the reactor thread.
        """
        if not conn.reading.acquire(blocking=False):
            return
        conn.claimed = True
        failure: BaseException | None = None
        try:
            while not done():
                try:
                    frames = conn.receive(wait=_READ_SLICE)  # one system call, woken by the packet
                except (BlockingIOError, InterruptedError):
                    if time.monotonic() >= deadline:
                        return
                    continue
                except (EOFError, OSError, ProtocolError) as exc:
                    failure = exc
                    return
                if frames is not None:
                    handler(frames)  # type: ignore[arg-type]
        finally:
            conn.claimed = False
            conn.reading.release()
            if failure is not None:
                try:
                    self._call_soon(lambda: self._failed(conn, failure))
                except TransportError:
                    pass  # stopped: the connection is closed with the reactor

    def poll_clients(self) -> None:
        """Leave client connections that a waiting thread reads out of the poll for reading, take the others
        back; poll those with queued bytes for writing."""
        for conn in self.clients:
            if conn.fd not in self.connections:
                continue
            mask = (0 if conn.claimed else _POLLIN) | (_POLLOUT if conn.pending else 0)
            if mask != self._masks.get(conn.fd, _POLLIN):
                if mask:
                    self._poller.register(conn.fd, mask)
                else:
                    self._poller.unregister(conn.fd)
                self._masks[conn.fd] = mask
            conn.polled = not conn.claimed

    # -- either side -----------------------------------------------------------------------
    def _failed(self, conn: PolledConnection, exc: BaseException) -> None:
        """``conn`` failed (``exc`` from its receive; reactor thread): dropped, its peer is gone."""
        if self.connections.get(conn.fd, (None, None))[0] is not conn:  # dropped already (its number may be reused)
            return
        if isinstance(exc, ProtocolError):  # a malformed or oversized packet: nothing after it can be framed
            log.warning("%s: closed a local connection: %s", self._name, exc)
        elif isinstance(exc, EOFError):  # an orderly close (a worker leaving): not worth a line at the end of every job
            log.debug("%s: %s", self._name, exc)
        else:
            log.info("%s: %s", self._name, exc)
        self.drop(conn)

    def _watch(self, conn: PolledConnection, on_packet: Callable[[], None], identity: bytes | None) -> None:
        self.connections[conn.fd] = (conn, identity)
        self._fd_handlers[conn.fd] = on_packet
        self._poller.register(conn.fd, zmq.POLLIN)

    def _receive(self, conn: PolledConnection, handle: Callable[[list[memoryview]], None]) -> None:
        """Hand the messages waiting on ``conn`` to ``handle``, in order; a closed or failed connection is dropped.

        At most ``_LOCAL_BATCH`` packets a turn (the reactor's other work gets its turn):
        a worker's push and the pull right behind it are handled on one wake-up.
        """
        for _ in range(_LOCAL_BATCH):
            try:
                frames = conn.receive()
            except (BlockingIOError, InterruptedError):
                return
            except (EOFError, OSError, ProtocolError) as exc:
                self._failed(conn, exc)
                return
            if frames is not None:
                handle(frames)
                if conn.closed:  # the handler dropped it
                    return

    def close_connection(self, conn: PolledConnection) -> None:
        """Stop polling ``conn`` and close it, without calling its ``on_lost`` (reactor thread)."""
        self._on_lost.pop(conn.fd, None)
        self.drop(conn)

    def drop(self, conn: PolledConnection) -> None:
        """Stop polling ``conn``, close it and call its ``on_lost`` if it has one (reactor thread)."""
        entry = self.connections.get(conn.fd)
        if entry is None or entry[0] is not conn:  # dropped already (its descriptor may be reused)
            conn.close()
            return
        del self.connections[conn.fd]
        identity = entry[1]
        if conn in self.clients:
            self.clients.remove(conn)
        self._fd_handlers.pop(conn.fd, None)
        self.writable.pop(conn.fd, None)
        self._masks.pop(conn.fd, None)
        self._opening.pop(conn.fd, None)
        if identity is not None and self.peers.get(identity) is conn:
            del self.peers[identity]
        try:
            self._poller.unregister(conn.fd)
        except KeyError:
            pass
        conn.close()
        on_lost = self._on_lost.pop(conn.fd, None)
        if on_lost is not None:
            on_lost()

    def close(self) -> None:
        """Close every connection and listener, calling no ``on_lost`` (the reactor stops)."""
        for conn, _ in list(self.connections.values()):
            conn.close()
        for listener in self._listeners:
            listener.close()
        self.connections.clear()
        self.clients.clear()
        self._masks.clear()
        self._opening.clear()
        self._on_lost.clear()
        self.peers.clear()
        self.writable.clear()
