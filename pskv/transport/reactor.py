"""The reactor: one thread that owns a node's ZeroMQ sockets and runs its handlers.

ZeroMQ sockets must not be shared between threads, so every socket of a node lives on
its reactor thread. Other threads hand work to it with :meth:`Reactor.call_soon`
(thread-safe; wakes the reactor through a pipe). Handlers and timers run on
the reactor thread and must not block.

Socket patterns (as in ps-lite's ZMQ van):

* a *service* (scheduler, server) binds one ROUTER socket; every message it receives
  comes with the sender's routing identity, and replies go back to that identity;
* a *client* connects one DEALER socket per service it talks to;
* a *sender* (:meth:`Reactor.connect_sender`) is a send-only DEALER that any thread may
  use (its lock serialises them; nobody polls it): a worker sends its requests from the
  calling thread — no hand-off to the reactor — and the service routes the replies to
  the worker's polled DEALER instead (see ``HELLO`` in :mod:`pskv.protocol.messages`);
* besides, the reactor polls plain sockets outside ZeroMQ — Unix-domain connections
  between nodes of one host (:meth:`Reactor.bind_local`, :meth:`Reactor.connect_local`)
  and TCP data connections between hosts (:meth:`Reactor.bind_stream`,
  :meth:`Reactor.adopt_stream`). A service's connections look like ROUTER peers to its
  handler; a client's carries its requests (sent from any thread) and its replies, which
  a waiting thread may read itself (:meth:`Reactor.read_local`). That part lives in
  :mod:`pskv.transport.polled`; the reactor delegates to it and runs it on its thread.

Addresses are ZeroMQ endpoints: ``tcp://127.0.0.1:0`` (port chosen by the OS — the
real address is returned), ``ipc://...`` or ``inproc://...`` (one process).
"""

from __future__ import annotations

import collections
import itertools
import logging
import struct
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, cast

import zmq

from pskv.errors import OperationTimeoutError, TransportError
from pskv.transport.bounds import DEFAULT_BOUNDS, Bounds
from pskv.transport.frames import (
    Backlog,
    Discarding,
    Sender,
    dealer_socket,
    recv_frames,
    recv_routed,
    router_socket,
    send_frames,
)
from pskv.transport.polled import LOCAL_PREFIX, PolledConnection, PolledConnections
from pskv.transport.sealed import NO_KEYS, Keys
from pskv.transport.security import CurveSecurity, RefusalLog
from pskv.transport.stream import OPENING_TIMEOUT, StreamConnection
from pskv.transport.unix import LocalConnection
from pskv.transport.waits import Poller, Timers, WakePipe

__all__ = ["IO_THREADS", "Reactor", "RouterHandler", "DealerHandler"]

log = logging.getLogger("pskv.transport")

# ZeroMQ I/O threads per data node (server, worker): they move the bytes, outside the GIL.
IO_THREADS = 2

RouterHandler = Callable[[bytes, list[zmq.Frame]], None]  # (peer identity, frames)
DealerHandler = Callable[[list[zmq.Frame]], None]

# Plain ints: combining pyzmq's enum flags (e.g. EVENTS & POLLIN) runs Python-level enum code.
_NOBLOCK, _POLLIN, _EVENTS = int(zmq.NOBLOCK), int(zmq.POLLIN), int(zmq.EVENTS)
_POLLOUT = int(zmq.POLLOUT)
# While replies wait for a peer whose ZeroMQ queue is full, the reactor retries this often (ms).
_BACKLOG_RETRY_MS = 5
# All slow peers together may hold this many times PSKV_SEND_QUEUE_BYTES in the reactor's queues.
BACKLOG_PEERS = 4
# Frames of an oversized message dropped between two turns of the reactor's other work (~50 ms).
_DISCARD_STEP = 30_000


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
        self._discarding: dict[zmq.Socket[Any], Discarding] = {}  # sockets in the middle of an oversized message
        self._security = security
        self._on_failure = on_failure
        self._name = name
        self._identity = identity
        self._poller = Poller()  # quick turns while every ZeroMQ socket is settled (pskv.transport.waits)
        self._settled = False  # every ZeroMQ socket drained, none used since: a quick turn may wait
        self._handlers: dict[zmq.Socket[Any], Callable[[list[zmq.Frame]], None]] = {}
        self._readers: dict[zmq.Socket[Any], Callable[[zmq.Socket[Any], Bounds, bool], list[zmq.Frame]]] = {}
        self._routers: dict[int, zmq.Socket[Any]] = {}
        self._dealers: dict[int, zmq.Socket[Any]] = {}
        self._senders: list[Sender] = []
        self._router_handlers: dict[int, RouterHandler] = {}
        self._fd_handlers: dict[int, Callable[[], None]] = {}  # raw descriptors polled with the sockets
        self._ids = itertools.count(1)
        self._polled = PolledConnections(self._poller, self._fd_handlers, name, bounds, self._ids, self.call_soon,
                                         security.data_keys if security is not None else NO_KEYS)
        # Its tables, the same objects: the loop checks them each turn, send_router looks peers up (tests read them).
        self._local_peers = self._polled.peers
        self._writable = self._polled.writable
        self._client_locals = self._polled.clients
        self._locals = self._polled.connections
        self._calls: collections.deque[Callable[[], None]] = collections.deque()
        self._timers = Timers()
        self._waker = WakePipe()
        self._poller.register(self._waker.fd, zmq.POLLIN)
        self._stopping = False
        self._monitors: dict[int, zmq.Socket[Any]] = {}  # socket-event monitors (watch_connection)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # -- set-up (before start, or on the reactor thread) ------------------------------
    def bind_router(self, address: str, handler: RouterHandler, trusted: Callable[[bytes], bool] | None = None
                    ) -> tuple[int, str]:
        """Bind a ROUTER socket; ``handler(identity, frames)`` gets every message.

        With ``trusted``, a message from a routing identity it refuses (a peer that has not
        proven itself yet) is held to :data:`~pskv.transport.frames.STRANGER_BOUNDS`, and the
        rest of a bigger one is discarded in steps between the reactor's other work: a
        stranger's message never keeps the node's heartbeats or its members waiting.

        Returns:
            ``(socket id, the bound address)``; with port 0 the address names the real port.

        Raises:
            TransportError: the address cannot be bound.
        """
        secure = self._security is not None and not address.startswith("inproc://")
        if secure:
            assert self._security is not None
            self._security.start(self._ctx)  # the ZAP handler answers before the first peer can connect
        sock, address = router_socket(self._ctx, address, self._bounds, self._security if secure else None)

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
        if trusted is not None:
            self._readers[sock] = partial(recv_routed, trusted=trusted)
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

    # -- connections polled outside ZeroMQ (pskv.transport.polled) ------------------------
    def bind_local(self, sid: int, path: str) -> None:
        """Also accept local connections at ``path`` for ROUTER ``sid`` (:meth:`PolledConnections.bind_local`).

        Raises:
            TransportError: the path cannot be bound.
        """
        self._polled.bind_local(path, self._router_handlers[sid])

    def bind_stream(self, sid: int, host: str, trusted: Callable[[bytes], bool] | None = None) -> int:
        """Also accept TCP data connections on ``host`` for ROUTER ``sid`` (:meth:`PolledConnections.bind_stream`).

        Returns the port; connections not ``trusted`` (an identity) in time are closed every second.

        Raises:
            TransportError: the address cannot be bound.
        """
        port = self._polled.bind_stream(host, self._router_handlers[sid], trusted)
        # OPENING_TIMEOUT is read each time from this module's name for it (a test shortens it here).
        self.add_timer(1.0, lambda: self._polled.close_unopened(OPENING_TIMEOUT))
        return port

    def adopt_stream(self, conn: StreamConnection, handler: DealerHandler, on_lost: Callable[[], None]) -> None:
        """Poll a client's data connection, ``on_lost()`` once it is dropped (:meth:`PolledConnections.adopt_stream`).

        Call on the reactor thread.
        """
        self._polled.adopt_stream(conn, handler, on_lost)

    def connect_local(self, path: str, handler: DealerHandler, send_timeout: float = 60.0) -> LocalConnection:
        """Connect to a service's local socket; ``handler(frames)`` gets what it sends back.

        See :meth:`PolledConnections.connect_local`. Call before :meth:`start` or on the
        reactor thread.

        Raises:
            OSError: nobody listens at ``path``.
        """
        return self._polled.connect_local(path, handler, send_timeout)

    def read_local(self, conn: PolledConnection, handler: DealerHandler, done: Callable[[], bool],
                   deadline: float) -> None:
        """Read a client connection's replies in the calling thread until ``done()`` or ``deadline``.

        See :meth:`PolledConnections.read_local`; the caller calls :meth:`wake` if replies
        are due that nobody else will read. Never call it on the reactor thread.
        """
        self._polled.read_local(conn, handler, done, deadline)

    def close_connection(self, conn: PolledConnection) -> None:
        """Stop polling ``conn`` and close it, without calling its ``on_lost`` (reactor thread)."""
        self._polled.close_connection(conn)

    def _drop_local(self, conn: PolledConnection) -> None:
        """Stop polling ``conn``, close it, call its ``on_lost`` (reactor thread; tests drop a peer with it)."""
        self._polled.drop(conn)

    def connect_dealer(self, address: str, handler: DealerHandler, identity: bytes | None = None) -> int:
        """Connect a DEALER socket to a service; ``handler(frames)`` gets its replies.

        A fixed ``identity`` keeps the service's route to this socket valid across a
        reconnect (ZeroMQ reconnects a reset connection by itself).

        Returns:
            the socket id used with :meth:`send_dealer`.
        """
        sock = dealer_socket(self._ctx, address, self._identity if identity is None else identity,
                             self._security, self._bounds)
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
        sock = dealer_socket(self._ctx, address, self._identity if identity is None else identity,
                             self._security, self._bounds)
        sock.setsockopt(zmq.SNDHWM, 0)  # never block a caller: requests are bounded by their callers
        sender = Sender(sock, f"{self._name} sender", self._bounds.max_message_bytes)
        self._senders.append(sender)
        return sender

    def add_timer(self, interval: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the reactor thread every ``interval`` seconds."""
        self._timers.add(interval, callback)

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
            return self._polled.send(conn, frames)
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
        self._settled = False  # a send may take the socket's mailbox news: the next turn asks every socket
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
        if self._backlogs:
            self._settled = False  # sends, as _send_zmq
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
        self._polled.drop_overdue(now)

    # -- cross-thread -------------------------------------------------------------------
    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the reactor thread as soon as possible (thread-safe).

        Raises:
            TransportError: the reactor is stopped.
        """
        if self._stopping:
            raise TransportError(f"{self._name} is stopped")
        self._calls.append(fn)
        self._waker.wake()

    def wake(self) -> None:
        """Make the reactor take a turn (thread-safe; e.g. to poll a connection a waiting thread let go)."""
        self._waker.wake()

    @property
    def bounds(self) -> Bounds:
        """What one peer may cost this node."""
        return self._bounds

    @property
    def data_keys(self) -> Keys:
        """How this node's data connections are sealed (:mod:`pskv.transport.sealed`)."""
        return self._polled.keys

    @property
    def stopped(self) -> bool:
        """True once the reactor stops (or stopped)."""
        return self._stopping

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
            self._waker.wake()
        if self._thread is not threading.current_thread():
            try:
                self._thread.join(timeout)
            except RuntimeError:  # start() was cut short (a signal handler raised in it): no loop to wait for
                return
            if self._thread.is_alive():
                raise OperationTimeoutError(f"{self._name} did not stop within {timeout} s")

    @property
    def error(self) -> BaseException | None:
        """The exception that ended the reactor thread, if any."""
        return self._error

    def _run(self) -> None:
        """The reactor thread: :meth:`_loop` until stopped; an exception that ends it goes to the owner."""
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - handed to the owner; the node fails loudly
            self._error = exc
            log.exception("%s: reactor thread failed", self._name)
            if self._on_failure is not None:
                self._on_failure(exc)
        finally:
            self._stopping = True
            self._close_sockets()

    def _loop(self) -> None:
        """Turn until stopped: timers, one poll, the calls handed over, every ready socket and descriptor.
        The hot loop of every node: rare branches are methods, the per-turn work stays inline."""
        while not self._stopping:
            timeout_ms = self._timers.run_due()
            if self._backlogs:  # ROUTER peers have no writability to poll: retry soon
                timeout_ms = min(timeout_ms, _BACKLOG_RETRY_MS)
            if self._discarding:
                timeout_ms = self._discard_some(timeout_ms)
            if self._client_locals:
                self._polled.poll_clients()
            events = self._wait(timeout_ms)
            if self._waker.fd in events:
                self._waker.drain()
            while self._calls:
                self._calls.popleft()()
            # what is ready, not every socket (usually one): a handler closed meanwhile is skipped
            handlers, fd_handlers = self._handlers, self._fd_handlers
            for key, flags in events.items():
                handler = handlers.get(key)
                if handler is not None:
                    if key not in self._discarding:
                        self._drain(key, handler)
                    continue
                on_ready = fd_handlers.get(key)
                if on_ready is None:
                    continue
                if flags & _POLLOUT:
                    self._polled.flush(key)
                if flags & ~_POLLOUT and key in fd_handlers:
                    on_ready()
            if self._backlogs or self._writable:
                self._flush_backlogs()

    def _wait(self, timeout_ms: int) -> dict[Any, int]:
        """The turn's wait: every ready socket and descriptor with its events.

        A quick wait — one ``poll`` of the plain descriptors and of the ZeroMQ sockets' mailbox
        descriptors — while every ZeroMQ socket is settled (its input drained, nothing done with
        it since: :attr:`_settled`); else, and when a mailbox has news, ``zmq_poll`` of everything.
        """
        poller = self._poller
        if self._settled and not poller.changed and not self._backlogs and not self._discarding:
            events = poller.quick_wait(timeout_ms)
            if events is not None:
                return events
            timeout_ms = 0  # a ZeroMQ socket has news: ask them all, now
        poller.changed = False
        self._settled = True  # zmq_poll asks every ZeroMQ socket; the turn unsettles one it leaves undrained or uses
        return dict(poller.poll(timeout_ms))

    def _drain(self, sock: zmq.Socket[Any], handler: Callable[[list[zmq.Frame]], None]) -> None:
        """Handle the messages waiting on ``sock`` (the poll said at least one is)."""
        bounds, read = self._bounds, self._readers.get(sock, recv_frames)
        # Then asks the socket whether more are waiting instead of reading until zmq.Again:
        # raising that exception costs more than the check.
        for i in range(256):  # bounded, so timers and other sockets get their turn
            if i and not cast(int, sock.getsockopt(_EVENTS)) & _POLLIN:
                return
            try:
                frames = read(sock, bounds, False)
            except zmq.Again:
                return
            except Discarding as over:
                if not over.done:  # the rest is dropped in steps between the reactor's other work
                    self._discarding[sock] = over
                    return
                log.warning("%s: %s", self._name, over)
                continue
            handler(frames)
        self._settled = False  # more may wait: the next turn asks every socket

    def _discard_some(self, timeout_ms: int) -> int:
        """Drop the next frames of oversized messages being discarded; log each one that ended. Returns the
        poll's timeout: ``timeout_ms``, or 0 while some are still being discarded."""
        self._settled = False  # read from a ZeroMQ socket after the poll
        for sock, over in list(self._discarding.items()):
            if over.step(sock, _DISCARD_STEP):
                del self._discarding[sock]
                log.warning("%s: %s", self._name, over)
        return 0 if self._discarding else timeout_ms

    def _close_sockets(self) -> None:
        for sender in self._senders:
            sender.close()
        self._polled.close()
        self._backlogs.clear()
        self._discarding.clear()
        self._fd_handlers.clear()
        for sock in [*self._monitors.values(), *self._routers.values(), *self._dealers.values()]:
            sock.close(0)
        self._monitors.clear()
        self._waker.close()
        self._routers.clear()
        self._dealers.clear()
        self._handlers.clear()
