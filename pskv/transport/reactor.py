"""The reactor: one thread that owns a node's ZeroMQ sockets and runs its handlers.

ZeroMQ sockets must not be shared between threads, so every socket of a node lives on
its reactor thread. Other threads hand work to it with :meth:`Reactor.call_soon`
(thread-safe; wakes the reactor through an inproc socket). Handlers and timers run on
the reactor thread and must not block.

Socket patterns (as in ps-lite's ZMQ van):

* a *service* (scheduler, server) binds one ROUTER socket; every message it receives
  comes with the sender's routing identity, and replies go back to that identity;
* a *client* connects one DEALER socket per service it talks to.

Addresses are ZeroMQ endpoints: ``tcp://127.0.0.1:0`` (port chosen by the OS — the
real address is returned), ``ipc://...`` or ``inproc://...`` (one process).
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from pskv.errors import OperationTimeoutError, TransportError

__all__ = ["IO_THREADS", "Reactor", "RouterHandler", "DealerHandler"]

log = logging.getLogger("pskv.transport")

# Kernel socket buffers for every data socket. The OS default (~200 KB on loopback)
# throttles large messages; 8 MiB measured 1.5x the throughput of 100 MB messages here.
SOCKET_BUFFER_BYTES = 8 << 20

# ZeroMQ I/O threads per data node (server, worker): they move the bytes, outside the GIL.
IO_THREADS = 2

RouterHandler = Callable[[bytes, list[zmq.Frame]], None]  # (peer identity, frames)
DealerHandler = Callable[[list[zmq.Frame]], None]


class Reactor:
    """Owns sockets and runs handlers, timers and queued calls on one thread.

    Args:
        context: the ZeroMQ context (one per process is usual; inproc needs a shared one).
        name: thread name, used in logs.
        identity: routing identity this node's DEALER sockets present to services.
        on_failure: called (on the dying reactor thread) if a handler or timer raised;
            the owner fails its pending work with it. The reactor stops after that.
    """

    def __init__(self, context: zmq.Context[Any], name: str, identity: bytes | None = None,
                 on_failure: Callable[[BaseException], None] | None = None) -> None:
        self._ctx = context
        self._on_failure = on_failure
        self._name = name
        self._identity = identity
        self._poller = zmq.Poller()
        self._handlers: dict[zmq.Socket[Any], Callable[[list[zmq.Frame]], None]] = {}
        self._routers: dict[int, zmq.Socket[Any]] = {}
        self._dealers: dict[int, zmq.Socket[Any]] = {}
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
        try:
            if address.startswith("tcp://") and address.endswith(":0"):
                port = sock.bind_to_random_port(address[: -len(":0")])
                address = f"{address[: -len(':0')]}:{port}"
            else:
                sock.bind(address)
        except zmq.ZMQError as exc:
            sock.close(0)
            raise TransportError(f"cannot bind {address}: {exc}") from None

        def on_frames(frames: list[zmq.Frame]) -> None:
            handler(frames[0].bytes, frames[1:])

        sid = next(self._ids)
        self._routers[sid] = sock
        self._handlers[sock] = on_frames
        self._poller.register(sock, zmq.POLLIN)
        return sid, address

    def connect_dealer(self, address: str, handler: DealerHandler) -> int:
        """Connect a DEALER socket to a service; ``handler(frames)`` gets its replies.

        Returns:
            the socket id used with :meth:`send_dealer`.
        """
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDBUF, SOCKET_BUFFER_BYTES)
        sock.setsockopt(zmq.RCVBUF, SOCKET_BUFFER_BYTES)
        if self._identity is not None:
            sock.setsockopt(zmq.IDENTITY, self._identity)
        sock.connect(address)
        sid = next(self._ids)
        self._dealers[sid] = sock
        self._handlers[sock] = handler
        self._poller.register(sock, zmq.POLLIN)
        return sid

    def add_timer(self, interval: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the reactor thread every ``interval`` seconds."""
        self._timers.append((time.monotonic() + interval, interval, callback))

    # -- sending (reactor thread only) --------------------------------------------------
    def send_router(self, sid: int, identity: bytes, frames: list[Any]) -> bool:
        """Send ``frames`` to the peer ``identity`` through ROUTER ``sid``.

        Returns:
            False if the peer is gone (the message is dropped), True otherwise.
        """
        try:
            self._routers[sid].send_multipart([identity, *frames], copy=False)
            return True
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                log.warning("%s: reply to vanished peer %r dropped", self._name, identity)
                return False
            raise

    def send_dealer(self, sid: int, frames: list[Any]) -> None:
        """Send ``frames`` through DEALER ``sid`` (queued by ZeroMQ until connected)."""
        self._dealers[sid].send_multipart(frames, copy=False)

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

    def _wake(self) -> None:
        """Interrupt the reactor's poll. Never blocks: a PUSH socket whose peer is gone (the
        reactor closed it) or full (wake-ups already pending) would block a plain send —
        which once deadlocked stop() against the closing reactor thread."""
        with self._wake_lock:
            try:
                self._wake_send.send(b"", zmq.NOBLOCK, copy=True)
            except zmq.ZMQError:
                pass  # Again: a wake-up is already pending, or the reactor is closing

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
                    if sock in events:
                        self._drain(sock, handler)
        except BaseException as exc:  # noqa: BLE001 - handed to the owner; the node fails loudly
            self._error = exc
            log.exception("%s: reactor thread failed", self._name)
            if self._on_failure is not None:
                self._on_failure(exc)
        finally:
            self._stopping = True
            self._close_sockets()

    def _drain(self, sock: zmq.Socket[Any], handler: Callable[[list[zmq.Frame]], None]) -> None:
        for _ in range(256):  # bounded, so timers and other sockets get their turn
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            handler(frames)

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
        for sock in [*self._routers.values(), *self._dealers.values(), self._wake_recv]:
            sock.close(0)
        with self._wake_lock:
            self._wake_send.close(0)
        self._routers.clear()
        self._dealers.clear()
        self._handlers.clear()
