"""The reactor: one thread that owns a node's ZeroMQ sockets and runs its handlers.

ZeroMQ sockets must not be shared between threads, so every socket of a node lives on
its reactor thread. Other threads hand work to it with :meth:`Reactor.call_soon`
(thread-safe; wakes the reactor through an inproc socket). Handlers and timers run on
the reactor thread and must not block.

Socket patterns (as in ps-lite's ZMQ van):

* a *service* (scheduler, server) binds one ROUTER socket; every message it receives
  comes with the sender's routing identity, and replies go back to that identity;
* a *client* connects one DEALER socket per service it talks to;
* a *sender* (:meth:`Reactor.connect_sender`) is a send-only DEALER that any thread may
  use (its lock serialises them; nobody polls it): a worker sends its requests from the
  calling thread — no hand-off to the reactor — and the service routes the replies to
  the worker's polled DEALER instead (see ``HELLO`` in :mod:`pskv.protocol.messages`);
* between nodes of one host, a service may also listen on a Unix-domain packet socket
  (:meth:`Reactor.bind_local`, :mod:`pskv.transport.unix`); its connections look like
  ROUTER peers to the handler, and a client's connection (:meth:`Reactor.connect_local`)
  carries its requests (sent from any thread) and its replies.

Addresses are ZeroMQ endpoints: ``tcp://127.0.0.1:0`` (port chosen by the OS — the
real address is returned), ``ipc://...`` or ``inproc://...`` (one process).
"""

from __future__ import annotations

import collections
import itertools
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, cast

import zmq

from pskv.errors import OperationTimeoutError, ProtocolError, TransportError
from pskv.transport.bounds import DEFAULT_BOUNDS, SEND_HWM, Bounds
from pskv.transport.frames import SOCKET_BUFFER_BYTES, Backlog, Discarding, Sender, recv_frames, send_frames
from pskv.transport.security import CurveSecurity, RefusalLog
from pskv.transport.stream import OPENING_TIMEOUT, StreamConnection, listen_tcp
from pskv.transport.unix import LocalConnection, listen

__all__ = ["IO_THREADS", "Reactor", "RouterHandler", "DealerHandler"]

log = logging.getLogger("pskv.transport")

# Identities of a ROUTER's local connections (bind_local). A ZeroMQ peer may choose any
# routing identity: one with this prefix is dropped, so it cannot speak on a local
# connection's binding (pskv.server.senders).
LOCAL_PREFIX = b"\x00local-"

# ZeroMQ I/O threads per data node (server, worker): they move the bytes, outside the GIL.
IO_THREADS = 2

RouterHandler = Callable[[bytes, list[zmq.Frame]], None]  # (peer identity, frames)
Connection = LocalConnection | StreamConnection  # a connection the reactor polls itself, outside ZeroMQ
DealerHandler = Callable[[list[zmq.Frame]], None]

# Plain ints: combining pyzmq's enum flags (e.g. EVENTS & POLLIN) runs Python-level enum code.
_NOBLOCK, _POLLIN, _EVENTS = int(zmq.NOBLOCK), int(zmq.POLLIN), int(zmq.EVENTS)
_POLLOUT = int(zmq.POLLOUT)
# While replies wait for a peer whose ZeroMQ queue is full, the reactor retries this often (ms).
_BACKLOG_RETRY_MS = 5
# All slow peers together may hold this many times PSKV_SEND_QUEUE_BYTES in the reactor's queues.
BACKLOG_PEERS = 4
# Packets read from one local connection in one turn of the reactor.
_LOCAL_BATCH = 16
# A thread reading its replies itself (Reactor.read_local) checks whether its request ended
# otherwise (a timeout, a dead peer) at least this often (seconds).
_READ_SLICE = 0.05
# Frames of an oversized message dropped between two turns of the reactor's other work (~50 ms).
_DISCARD_STEP = 30_000
# Data connections (bind_stream) a service keeps open at most, and of those at most this many
# that have not sent their first message yet; more are closed as they come, logged.
MAX_STREAMS = 4096
MAX_OPENING = 256


class Reactor:
    """Owns sockets and runs handlers, timers and queued calls on one thread.

    Args:
        context: the ZeroMQ context (one per process is usual; inproc needs a shared one).
        name: thread name, used in logs.
        identity: routing identity this node's DEALER sockets present to services.
        on_failure: called (on the dying reactor thread) if a handler or timer raised;
            the owner fails its pending work with it. The reactor stops after that.
        security: the cluster's CURVE key (None: plain TCP). Every ``tcp://`` or
            ``ipc://`` socket made here then authenticates and encrypts: ROUTERs are CURVE
            servers behind the ZAP handler, DEALERs and senders CURVE clients.
        bounds: what one peer may cost this node (:mod:`pskv.transport.bounds`): the
            size of a message received, the replies queued for a peer that reads nothing.
    """

    def __init__(self, context: zmq.Context[Any], name: str, identity: bytes | None = None,
                 on_failure: Callable[[BaseException], None] | None = None,
                 security: CurveSecurity | None = None, bounds: Bounds = DEFAULT_BOUNDS) -> None:
        self._ctx = context
        self._bounds = bounds
        self._backlogs: dict[tuple[int, bytes], Backlog] = {}  # (socket id, peer identity) -> unsent replies
        self._writable: dict[int, Connection] = {}  # service connections with queued replies, by descriptor
        self._discarding: dict[zmq.Socket[Any], Discarding] = {}  # sockets in the middle of an oversized message
        self._security = security
        self._on_failure = on_failure
        self._name = name
        self._identity = identity
        self._poller = zmq.Poller()
        self._handlers: dict[zmq.Socket[Any], Callable[[list[zmq.Frame]], None]] = {}
        self._routers: dict[int, zmq.Socket[Any]] = {}
        self._dealers: dict[int, zmq.Socket[Any]] = {}
        self._senders: list[Sender] = []
        self._router_handlers: dict[int, RouterHandler] = {}
        self._fd_handlers: dict[int, Callable[[], None]] = {}  # raw descriptors polled with the sockets
        self._listeners: list[socket.socket] = []
        self._locals: dict[int, tuple[Connection, bytes | None]] = {}  # by descriptor
        self._local_peers: dict[bytes, Connection] = {}  # accepted connections by identity
        self._client_locals: list[Connection] = []  # connect_local's, adopt_stream's: a waiting thread may read them
        self._masks: dict[int, int] = {}  # poll flags of client connections, where not POLLIN
        self._opening: dict[int, StreamConnection] = {}  # accepted data connections before their first message
        self._on_lost: dict[int, Callable[[], None]] = {}  # client data connections: called once dropped
        self._refused = RefusalLog(log, limit=16)
        self._ids = itertools.count(1)
        self._calls: collections.deque[Callable[[], None]] = collections.deque()
        self._timers: list[tuple[float, float, Callable[[], None]]] = []
        self._wake_addr = f"inproc://pskv-wake-{id(self)}"
        self._wake_recv = context.socket(zmq.PULL)
        self._wake_recv.bind(self._wake_addr)
        self._wake_send = context.socket(zmq.PUSH)
        self._wake_send.connect(self._wake_addr)
        self._wake_lock = threading.Lock()
        self._poller.register(self._wake_recv, zmq.POLLIN)
        self._stopping = False
        self._monitors: dict[int, zmq.Socket[Any]] = {}  # socket-event monitors (watch_connection)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # -- set-up (before start, or on the reactor thread) ------------------------------
    def bind_router(self, address: str, handler: RouterHandler) -> tuple[int, str]:
        """Bind a ROUTER socket; ``handler(identity, frames)`` gets every message.

        Returns:
            ``(socket id, the bound address)``; with port 0 the address names the real port.

        Raises:
            TransportError: the address cannot be bound.
        """
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDBUF, SOCKET_BUFFER_BYTES)
        sock.setsockopt(zmq.RCVBUF, SOCKET_BUFFER_BYTES)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to a vanished peer raises, not drops
        # A peer that reconnects (its TCP connection was reset) under its fixed routing
        # identity takes over the old route instead of being refused as a duplicate.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self._bound_peers(sock)
        secure = self._security is not None and not address.startswith("inproc://")
        if secure:
            assert self._security is not None
            self._security.start(self._ctx)  # the ZAP handler answers before the first peer can connect
            self._security.server(sock)
        try:
            if address.startswith("tcp://") and address.endswith(":0"):
                port = sock.bind_to_random_port(address[: -len(":0")])
                address = f"{address[: -len(':0')]}:{port}"
            else:
                sock.bind(address)
        except zmq.ZMQError as exc:
            sock.close(0)
            raise TransportError(f"cannot bind {address}: {exc}") from None

        impostors = RefusalLog(log, limit=64)  # a line per identity every 10 s at most

        def on_frames(frames: list[zmq.Frame]) -> None:
            identity = frames[0].bytes
            if identity.startswith(LOCAL_PREFIX):  # a ZeroMQ peer posing as a local connection (its binding)
                impostors.error(identity, f"{self._name}: dropped a message from a ZeroMQ peer whose routing "
                                          f"identity {identity!r} is a local connection's")
                return
            handler(identity, frames[1:])

        sid = next(self._ids)
        self._routers[sid] = sock
        self._router_handlers[sid] = handler
        self._handlers[sock] = on_frames
        self._poller.register(sock, zmq.POLLIN)
        if secure:
            self._watch_handshakes(-sid, sock, address)
        return sid, address

    def _watch_handshakes(self, key: int, sock: zmq.Socket[Any], address: str) -> None:
        """Log the peers of a CURVE server socket that fail the handshake (no key, another key)."""
        assert self._security is not None
        security = self._security
        monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                          | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        self._monitors[key] = monitor

        def on_event(frames: list[zmq.Frame]) -> None:
            event, value = struct.unpack("=hi", frames[0].bytes[:6])
            security.handshake_failed(address, event, value)

        self._handlers[monitor] = on_event
        self._poller.register(monitor, zmq.POLLIN)

    def _bound_peers(self, sock: zmq.Socket[Any]) -> None:
        """A service socket's per-peer bounds: a frame over the message limit is refused by
        ZeroMQ before it is allocated (the peer is disconnected); a peer's send queue holds
        ``SEND_HWM`` messages, then sends report ``zmq.Again`` (see :meth:`send_router`)."""
        sock.setsockopt(zmq.MAXMSGSIZE, self._bounds.max_message_bytes)
        sock.setsockopt(zmq.SNDHWM, SEND_HWM)

    def bind_local(self, sid: int, path: str) -> None:
        """Also accept local connections at ``path`` for ROUTER ``sid``.

        Their messages reach the ROUTER's handler with identities of their own, and
        :meth:`send_router` answers them on their connection.

        Raises:
            TransportError: the path cannot be bound.
        """
        try:
            listener = listen(path)
        except OSError as exc:
            raise TransportError(f"cannot listen on {path}: {exc}") from None
        handler = self._router_handlers[sid]
        self._listeners.append(listener)
        self._fd_handlers[listener.fileno()] = lambda: self._accept(listener, sid, handler)
        self._poller.register(listener.fileno(), zmq.POLLIN)

    def _accept(self, listener: socket.socket, sid: int, handler: RouterHandler) -> None:
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        identity = LOCAL_PREFIX + b"%d" % next(self._ids)
        # Replies never wait for a peer that reads nothing: they queue on the connection
        # (bounded, see send_router) and leave when it is writable.
        conn = LocalConnection(sock, f"{self._name} local connection", bounds=self._bounds, queued=True)
        self._local_peers[identity] = conn

        deliver = partial(handler, identity)

        def on_packet() -> None:
            self._receive_local(conn, deliver)  # type: ignore[arg-type]
        self._watch_local(conn, on_packet, identity)

    def bind_stream(self, sid: int, host: str) -> int:
        """Also accept TCP data connections (:mod:`pskv.transport.stream`) on ``host`` for ROUTER ``sid``.

        As for :meth:`bind_local`, their messages reach the ROUTER's handler — under the
        identity their preamble names, from their first message on — and
        :meth:`send_router` answers them on their connection. A connection that sends no
        first message within ``OPENING_TIMEOUT`` s is closed; so are connections past
        :data:`MAX_STREAMS` (or :data:`MAX_OPENING` not yet opened). Returns the port.

        Raises:
            TransportError: the address cannot be bound.
        """
        try:
            listener = listen_tcp(host)
        except OSError as exc:
            raise TransportError(f"cannot listen on {host}: {exc}") from None
        handler = self._router_handlers[sid]
        self._listeners.append(listener)
        self._fd_handlers[listener.fileno()] = lambda: self._accept_stream(listener, handler)
        self._poller.register(listener.fileno(), zmq.POLLIN)
        self.add_timer(1.0, self._close_unopened)
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
        if len(self._opening) >= MAX_OPENING or len(self._locals) >= MAX_STREAMS:
            sock.close()
            self._refused.error("full", f"{self._name}: closed a data connection from {where}: "
                                        f"{len(self._opening)} connections have not opened yet, {len(self._locals)} "
                                        f"are open (at most {MAX_OPENING} and {MAX_STREAMS})")
            return
        conn = StreamConnection(sock, f"{self._name} data connection from {where}", self._bounds,
                                queue_limit=self._bounds.send_queue_bytes, accepted=True)
        self._opening[conn.fd] = conn
        identity = b""

        def deliver(frames: list[memoryview]) -> None:
            nonlocal identity
            if not identity:  # its first message: the connection speaks under its tag from now on
                assert conn.tag is not None
                identity = LOCAL_PREFIX + b"tcp-" + conn.tag
                self._opening.pop(conn.fd, None)
                old = self._local_peers.get(identity)
                if old is not None:  # the same worker connecting again (a reset): this one takes over
                    log.info("%s: %s replaces the older connection of %r", self._name, conn.name, identity)
                    self._drop_local(old)
                self._local_peers[identity] = conn
                self._locals[conn.fd] = (conn, identity)
            handler(identity, frames)  # type: ignore[arg-type]

        def on_packet() -> None:
            self._receive_local(conn, deliver)
        self._watch_local(conn, on_packet, None)

    def _close_unopened(self) -> None:
        """Close the data connections that sent no first message in ``OPENING_TIMEOUT`` seconds."""
        now = time.monotonic()
        for conn in [c for c in self._opening.values() if now - c.opened > OPENING_TIMEOUT]:
            self._refused.error("unopened", f"{self._name}: closed {conn.name}: no first message in "
                                            f"{OPENING_TIMEOUT:g} s")
            self._drop_local(conn)

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
                self._receive_local(conn, handler)  # type: ignore[arg-type]
            finally:
                conn.reading.release()
        self._watch_local(conn, on_packet, None)
        self._client_locals.append(conn)
        self._on_lost[conn.fd] = on_lost

    def connect_local(self, path: str, handler: DealerHandler, send_timeout: float = 60.0) -> LocalConnection:
        """Connect to a service's local socket; ``handler(frames)`` gets what it sends back.

        The connection's :meth:`~LocalConnection.send` may be called from any thread and
        waits at most ``send_timeout`` seconds for a service that takes nothing.
        Call before :meth:`start` or on the reactor thread.

        Raises:
            OSError: nobody listens at ``path``.
        """
        conn = LocalConnection.connect(path, f"{self._name} local connection to {path}", send_timeout, self._bounds)

        def on_packet() -> None:
            if not conn.reading.acquire(blocking=False):
                return  # a thread waiting for a reply reads it now (read_local)
            try:  # handled under the lock: replies reach the handler in the order they came
                self._receive_local(conn, handler)  # type: ignore[arg-type]
            finally:
                conn.reading.release()
        self._watch_local(conn, on_packet, None)
        self._client_locals.append(conn)
        return conn

    def read_local(self, conn: Connection, handler: DealerHandler, done: Callable[[], bool],
                   deadline: float) -> None:
        """Read ``conn``'s packets in the calling thread, handing each message to ``handler``, until ``done()``.

        For a thread about to wait for a reply on a client's local connection (made by
        :meth:`connect_local`): it is woken by the reply itself, instead of the reactor
        being woken, reading it and waking the thread. Meanwhile the reactor leaves the
        connection out of its poll (from its next turn); it takes it back when the
        caller is done — the caller calls :meth:`wake` if replies are due that nobody
        else will read (the reactor's timers turn it at least every 0.1 s anyway).

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
                    self.call_soon(lambda: self._local_failed(conn, failure))
                except TransportError:
                    pass  # stopped: the connection is closed with the reactor

    def _local_failed(self, conn: Connection, exc: BaseException) -> None:
        """``conn`` failed (``exc`` from its receive; reactor thread): dropped, its peer is gone."""
        if self._locals.get(conn.fd, (None, None))[0] is not conn:  # dropped already (its number may be reused)
            return
        if isinstance(exc, ProtocolError):  # a malformed or oversized packet: nothing after it can be framed
            log.warning("%s: closed a local connection: %s", self._name, exc)
        elif isinstance(exc, EOFError):  # an orderly close (a worker leaving): not worth a line at the end of every job
            log.debug("%s: %s", self._name, exc)
        else:
            log.info("%s: %s", self._name, exc)
        self._drop_local(conn)

    def _poll_locals(self) -> None:
        """Leave client connections that a waiting thread reads out of the poll for reading, take the others
        back; poll those with queued bytes for writing."""
        for conn in self._client_locals:
            if conn.fd not in self._locals:
                continue
            mask = (0 if conn.claimed else _POLLIN) | (_POLLOUT if conn.pending else 0)
            if mask != self._masks.get(conn.fd, _POLLIN):
                if mask:
                    self._poller.register(conn.fd, mask)
                else:
                    self._poller.unregister(conn.fd)
                self._masks[conn.fd] = mask
            conn.polled = not conn.claimed

    def _watch_local(self, conn: Connection, on_packet: Callable[[], None], identity: bytes | None) -> None:
        self._locals[conn.fd] = (conn, identity)
        self._fd_handlers[conn.fd] = on_packet
        self._poller.register(conn.fd, zmq.POLLIN)

    def _receive_local(self, conn: Connection, handle: Callable[[list[memoryview]], None]) -> None:
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
                self._local_failed(conn, exc)
                return
            if frames is not None:
                handle(frames)
                if conn.closed:  # the handler dropped it
                    return

    def _drop_local(self, conn: Connection) -> None:
        entry = self._locals.get(conn.fd)
        if entry is None or entry[0] is not conn:  # dropped already (its descriptor may be reused)
            conn.close()
            return
        del self._locals[conn.fd]
        identity = entry[1]
        if conn in self._client_locals:
            self._client_locals.remove(conn)
        self._fd_handlers.pop(conn.fd, None)
        self._writable.pop(conn.fd, None)
        self._masks.pop(conn.fd, None)
        self._opening.pop(conn.fd, None)
        if identity is not None and self._local_peers.get(identity) is conn:
            del self._local_peers[identity]
        try:
            self._poller.unregister(conn.fd)
        except KeyError:
            pass
        conn.close()
        on_lost = self._on_lost.pop(conn.fd, None)
        if on_lost is not None:
            on_lost()

    def connect_dealer(self, address: str, handler: DealerHandler, identity: bytes | None = None) -> int:
        """Connect a DEALER socket to a service; ``handler(frames)`` gets its replies.

        A fixed ``identity`` keeps the service's route to this socket valid across a
        reconnect (ZeroMQ reconnects a reset connection by itself).

        Returns:
            the socket id used with :meth:`send_dealer`.
        """
        sock = self._dealer_socket(address, identity)
        sid = next(self._ids)
        self._dealers[sid] = sock
        self._handlers[sock] = handler
        self._poller.register(sock, zmq.POLLIN)
        return sid

    def close_dealer(self, sid: int) -> None:
        """Close a DEALER made by :meth:`connect_dealer` (on the reactor thread)."""
        self.unwatch(sid)
        sock = self._dealers.pop(sid, None)
        self._backlogs.pop((sid, b""), None)
        if sock is None:
            return
        self._discarding.pop(sock, None)
        self._handlers.pop(sock, None)
        self._poller.unregister(sock)
        sock.close(linger=0)

    def watch_connection(self, target: int | Sender, callback: Callable[[bool], None]) -> None:
        """Call ``callback(up)`` on the reactor thread when the connection of a DEALER (its
        socket id) or a :class:`Sender` goes down (False) or is back up after ZeroMQ
        reconnected it (True, once the handshake is done). On the reactor thread.
        """
        events = zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
        if isinstance(target, int):
            monitor = self._dealers[target].get_monitor_socket(events)
        else:
            with target._lock:  # other threads send on it
                if target._sock is None:
                    return
                monitor = target._sock.get_monitor_socket(events)
        self._monitors[id(target) if not isinstance(target, int) else target] = monitor

        def on_event(frames: list[zmq.Frame]) -> None:
            event = struct.unpack("=hi", frames[0].bytes[:6])[0]
            callback(event == zmq.EVENT_HANDSHAKE_SUCCEEDED)

        self._handlers[monitor] = on_event
        self._poller.register(monitor, zmq.POLLIN)

    def unwatch(self, target: int | Sender) -> None:
        """Stop :meth:`watch_connection` of ``target`` (on the reactor thread)."""
        monitor = self._monitors.pop(id(target) if not isinstance(target, int) else target, None)
        if monitor is not None:
            self._handlers.pop(monitor, None)
            self._poller.unregister(monitor)
            monitor.close(0)

    def connect_sender(self, address: str, identity: bytes | None = None) -> Sender:
        """Connect a send-only DEALER socket (routing identity ``identity``) to a service, for any thread.

        Its replies go wherever the service routes them (they are never read here).
        Call before :meth:`start` or on the reactor thread; the reactor closes it when it
        stops.
        """
        sock = self._dealer_socket(address, identity)
        sock.setsockopt(zmq.SNDHWM, 0)  # never block a caller: requests are bounded by their callers
        sender = Sender(sock, f"{self._name} sender", self._bounds.max_message_bytes)
        self._senders.append(sender)
        return sender

    def _dealer_socket(self, address: str, identity: bytes | None = None) -> zmq.Socket[Any]:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDBUF, SOCKET_BUFFER_BYTES)
        sock.setsockopt(zmq.RCVBUF, SOCKET_BUFFER_BYTES)
        identity = self._identity if identity is None else identity
        if identity is not None:
            sock.setsockopt(zmq.IDENTITY, identity)
        if self._security is not None and not address.startswith("inproc://"):
            self._security.client(sock)
        sock.connect(address)
        return sock

    def add_timer(self, interval: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the reactor thread every ``interval`` seconds."""
        self._timers.append((time.monotonic() + interval, interval, callback))

    # -- sending (reactor thread only) --------------------------------------------------
    def send_router(self, sid: int, identity: bytes, frames: list[Any]) -> bool:
        """Send ``frames`` to the peer ``identity`` through ROUTER ``sid``; never waits.

        A peer whose queue is full (it reads nothing, or slowly) gets the message queued
        in the reactor behind what already waits for it, sent when it takes more
        (``_flush_backlogs``); past ``PSKV_SEND_QUEUE_BYTES`` queued, or none taken for
        ``PSKV_SLOW_PEER_TIMEOUT`` seconds, the peer is dropped: its queue discarded,
        a warning logged (a local connection is closed too).

        Returns:
            False if the peer is gone or dropped (the message is dropped), True otherwise.
        """
        conn = self._local_peers.get(identity)
        if conn is not None:
            try:
                conn.send(frames)
            except ConnectionError as exc:  # the peer is gone (its end is closed), or dropped as too slow
                log.warning("%s: local peer dropped: %s", self._name, exc)
                self._drop_local(conn)
                return False
            if conn.pending and conn.fd not in self._writable:
                self._writable[conn.fd] = conn
                self._poller.register(conn.fd, _POLLIN | _POLLOUT)
            return True
        try:
            return self._send_zmq(sid, self._routers[sid], identity, frames)
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                log.warning("%s: reply to vanished peer %r dropped", self._name, identity)
                return False
            raise

    def send_dealer(self, sid: int, frames: list[Any]) -> None:
        """Send ``frames`` through DEALER ``sid`` (queued by ZeroMQ until connected); never waits.

        Past ZeroMQ's queue the message waits in the reactor, bounded as for
        :meth:`send_router`; what a service that takes nothing leaves queued is dropped
        the same way, logged (its requests then time out, as every request does).
        """
        self._send_zmq(sid, self._dealers[sid], None, frames)

    def _send_zmq(self, sid: int, sock: zmq.Socket[Any], identity: bytes | None, frames: list[Any]) -> bool:
        key = (sid, b"" if identity is None else identity)
        backlog = self._backlogs.get(key)
        if backlog is None:
            try:
                send_frames(sock, frames if identity is None else [identity, *frames], _NOBLOCK)
                return True
            except zmq.Again:
                backlog = self._backlogs[key] = Backlog(sock, [] if identity is None else [identity],
                                                         time.monotonic())
        backlog.add(frames)
        if backlog.bytes > self._bounds.send_queue_bytes:
            self._drop_backlog(key, f"left more than PSKV_SEND_QUEUE_BYTES={self._bounds.send_queue_bytes} bytes "
                                    "of messages unread")
            return False
        total = sum(b.bytes for b in self._backlogs.values()) if len(self._backlogs) > 1 else backlog.bytes
        if total > BACKLOG_PEERS * self._bounds.send_queue_bytes:  # many slow peers at once: the biggest goes
            biggest = max(self._backlogs, key=lambda k: self._backlogs[k].bytes)
            self._drop_backlog(biggest, f"held the most of {total} bytes queued for slow peers, more than "
                                        f"{BACKLOG_PEERS} x PSKV_SEND_QUEUE_BYTES")
            return biggest != key
        return True

    def _drop_backlog(self, key: tuple[int, bytes], why: str) -> None:
        backlog = self._backlogs.pop(key)
        peer = f"peer {key[1]!r}" if key[1] else "the service"
        log.warning("%s: %s %s: dropped it and %d queued message(s) (%d bytes)", self._name, peer, why,
                    len(backlog.messages), backlog.bytes)

    def _flush_backlogs(self) -> None:
        """Send what slow peers take now; drop those that took nothing for too long (reactor thread)."""
        now = time.monotonic()
        timeout = self._bounds.slow_peer_timeout
        for key, backlog in list(self._backlogs.items()):
            try:
                backlog.flush(now)
            except zmq.ZMQError as exc:  # EHOSTUNREACH: the peer disconnected
                self._drop_backlog(key, f"is gone ({exc})")
                continue
            if not backlog.messages:
                del self._backlogs[key]
            elif now - backlog.progress > timeout:
                self._drop_backlog(key, f"took none of its messages for {timeout:g} s")
        for conn in list(self._writable.values()):
            if conn.overdue(now):
                log.warning("%s: %s: the peer took none of its replies for %g s: dropped", self._name, conn.name,
                            timeout)
                self._drop_local(conn)

    def _flush_local(self, fd: int) -> None:
        """A connection with queued messages is writable: send what it takes."""
        conn = self._writable.get(fd)
        if conn is None:  # a client's connection: polled for writing while its queue is not empty (_poll_locals)
            entry = self._locals.get(fd)
            if entry is not None:
                try:
                    entry[0].flush()
                except ConnectionError as exc:
                    log.warning("%s: %s", self._name, exc)
                    self._drop_local(entry[0])
            return
        try:
            done = conn.flush()
        except ConnectionError as exc:  # the peer is gone
            log.warning("%s: local peer dropped: %s", self._name, exc)
            self._drop_local(conn)
            return
        if done:
            del self._writable[fd]
            self._poller.register(fd, _POLLIN)

    # -- cross-thread -------------------------------------------------------------------
    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the reactor thread as soon as possible (thread-safe).

        Raises:
            TransportError: the reactor is stopped.
        """
        if self._stopping:
            raise TransportError(f"{self._name} is stopped")
        self._calls.append(fn)
        self._wake()

    def wake(self) -> None:
        """Make the reactor take a turn (thread-safe; e.g. to poll a connection a waiting thread let go)."""
        self._wake()

    def _wake(self) -> None:
        """Interrupt the reactor's poll. Never blocks: a PUSH socket whose peer is gone (the
        reactor closed it) or full (wake-ups already pending) would block a plain send —
        which once deadlocked stop() against the closing reactor thread."""
        with self._wake_lock:
            try:
                self._wake_send.send(b"", zmq.NOBLOCK, copy=True)
            except zmq.ZMQError:
                pass  # Again: a wake-up is already pending, or the reactor is closing

    @property
    def bounds(self) -> Bounds:
        """What one peer may cost this node."""
        return self._bounds

    @property
    def stopped(self) -> bool:
        """True once the reactor stops (or stopped)."""
        return self._stopping

    def close_connection(self, conn: Connection) -> None:
        """Stop polling ``conn`` and close it, without calling its ``on_lost`` (reactor thread)."""
        self._on_lost.pop(conn.fd, None)
        self._drop_local(conn)

    def on_reactor_thread(self) -> bool:
        """True when called from the reactor thread."""
        return threading.current_thread() is self._thread

    # -- running ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the reactor thread."""
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and close every socket (idempotent).

        Raises:
            OperationTimeoutError: the thread did not stop within ``timeout``.
        """
        if self._thread is None:
            self._close_sockets()
            return
        if not self._stopping:
            self._stopping = True
            self._wake()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise OperationTimeoutError(f"{self._name} did not stop within {timeout} s")

    @property
    def error(self) -> BaseException | None:
        """The exception that ended the reactor thread, if any."""
        return self._error

    def _run(self) -> None:
        try:
            while not self._stopping:
                timeout_ms = self._run_timers()
                if self._backlogs:  # ROUTER peers have no writability to poll: retry soon
                    timeout_ms = min(timeout_ms, _BACKLOG_RETRY_MS)
                if self._discarding:
                    self._discard_some()
                    timeout_ms = 0 if self._discarding else timeout_ms
                if self._client_locals:
                    self._poll_locals()
                events = dict(self._poller.poll(timeout_ms))
                if self._wake_recv in events:
                    while True:
                        try:
                            self._wake_recv.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                while self._calls:
                    self._calls.popleft()()
                for sock, handler in list(self._handlers.items()):
                    if sock in events and sock not in self._discarding:
                        self._drain(sock, handler)
                if self._fd_handlers:
                    for fd, on_ready in list(self._fd_handlers.items()):
                        flags = events.get(fd)
                        if flags is None:
                            continue
                        if flags & _POLLOUT:
                            self._flush_local(fd)
                        if flags & ~_POLLOUT and fd in self._fd_handlers:
                            on_ready()
                if self._backlogs or self._writable:
                    self._flush_backlogs()
        except BaseException as exc:  # noqa: BLE001 - handed to the owner; the node fails loudly
            self._error = exc
            log.exception("%s: reactor thread failed", self._name)
            if self._on_failure is not None:
                self._on_failure(exc)
        finally:
            self._stopping = True
            self._close_sockets()

    def _drain(self, sock: zmq.Socket[Any], handler: Callable[[list[zmq.Frame]], None]) -> None:
        """Handle the messages waiting on ``sock`` (the poll said at least one is)."""
        bounds = self._bounds
        # Then asks the socket whether more are waiting instead of reading until zmq.Again:
        # raising that exception costs more than the check.
        for i in range(256):  # bounded, so timers and other sockets get their turn
            if i and not cast(int, sock.getsockopt(_EVENTS)) & _POLLIN:
                return
            try:
                frames = recv_frames(sock, bounds, drain=False)
            except zmq.Again:
                return
            except Discarding as over:
                if not over.done:  # the rest is dropped in steps between the reactor's other work
                    self._discarding[sock] = over
                    return
                log.warning("%s: %s", self._name, over)
                continue
            handler(frames)

    def _discard_some(self) -> None:
        """Drop the next frames of oversized messages being discarded; log each one that ended."""
        for sock, over in list(self._discarding.items()):
            if over.step(sock, _DISCARD_STEP):
                del self._discarding[sock]
                log.warning("%s: %s", self._name, over)

    def _run_timers(self) -> int:
        if not self._timers:
            return 100
        now = time.monotonic()
        nearest = now + 0.1
        for i, (due, interval, callback) in enumerate(self._timers):
            if due <= now:
                callback()
                due = now + interval
                self._timers[i] = (due, interval, callback)
            nearest = min(nearest, due)
        return max(0, int((nearest - time.monotonic()) * 1000))

    def _close_sockets(self) -> None:
        for sender in self._senders:
            sender.close()
        for conn, _ in list(self._locals.values()):
            conn.close()
        for listener in self._listeners:
            listener.close()
        self._locals.clear()
        self._client_locals.clear()
        self._masks.clear()
        self._opening.clear()
        self._on_lost.clear()
        self._local_peers.clear()
        self._writable.clear()
        self._backlogs.clear()
        self._discarding.clear()
        self._fd_handlers.clear()
        for sock in [*self._monitors.values(), *self._routers.values(), *self._dealers.values(), self._wake_recv]:
            sock.close(0)
        self._monitors.clear()
        with self._wake_lock:
            self._wake_send.close(0)
        self._routers.clear()
        self._dealers.clear()
        self._handlers.clear()
