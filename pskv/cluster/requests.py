"""Request tracking: match replies to requests, wait with timeouts, fail on dead peers.

Every outgoing request gets an id and a :class:`Pending` record naming the node it went
to. The reactor thread completes records as replies arrive; callers wait on them with a
timeout, or register callbacks (:meth:`Pending.add_done_callback`) that run when the
record completes. A request may carry a deadline: :meth:`RequestTracker.expire` (run
periodically by the owner's reactor) fails it with
:class:`~pskv.errors.OperationTimeoutError` once that passes, so nothing relying on
callbacks waits forever either. When a node is declared dead, every record waiting on
it fails with :class:`~pskv.errors.NodeFailedError` — so no caller waits forever on a
dead peer.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

from pskv.errors import (
    CollectiveMismatchError,
    MembershipChangedError,
    NodeFailedError,
    OperationTimeoutError,
    RemoteError,
)
from pskv.protocol import Command, Header, node_name
from pskv.protocol.bodies import ErrorReply

__all__ = ["Pending", "RequestTracker"]


# Guards the hand-over between waiters / add_done_callback and completion (held for a few instructions).
_CALLBACKS_LOCK = threading.Lock()


class Pending:
    """One outstanding request."""

    __slots__ = ("request", "node", "what", "_done", "_waiter", "header", "buffers", "error", "callback", "frames",
                 "_callbacks", "deadline", "timeout")

    def __init__(self, request: int, node: int, what: str,
                 callback: Callable[[Pending], None] | None = None, timeout: float | None = None) -> None:
        self.request = request
        self.node = node
        self.what = what
        self._done = False
        # A lock held until completion, made when someone waits first (most requests of a
        # pipelined worker are never waited on, and a lock is much cheaper than an Event).
        self._waiter: threading.Lock | None = None
        self.header: Header | None = None
        self.buffers: list[Any] = []
        self.error: BaseException | None = None
        self.callback = callback
        self._callbacks: list[Callable[[Pending], None]] = []
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.frames: list[Any] | None = None  # the message, kept to send it again (reset connection, new server)

    def done(self) -> bool:
        """True once the reply (or a failure) arrived."""
        return self._done

    def wait(self, timeout: float | None, stated: float | None = None) -> Header:
        """Wait for the reply.

        ``stated``: the timeout the caller was given, named in the error (``timeout`` may be
        what is left of it, after a wait of the caller's own).

        Raises:
            OperationTimeoutError: no reply within ``timeout`` seconds (names the request and the timeout).
            NodeFailedError: the peer died.
            RemoteError: the peer answered with an error.
        """
        if not self._done:
            with _CALLBACKS_LOCK:
                waiter = None
                if not self._done:
                    waiter = self._waiter
                    if waiter is None:
                        waiter = self._waiter = threading.Lock()
                        waiter.acquire()
            if waiter is not None:
                if not waiter.acquire(True, -1 if timeout is None else max(0.0, timeout)):
                    raise OperationTimeoutError(
                        f"{self.what} to {node_name(self.node)} got no reply within "
                        f"{timeout if stated is None else stated} s"
                    )
                waiter.release()  # the next waiter, if any
        if self.error is not None:
            raise self.error
        assert self.header is not None
        return self.header

    def add_done_callback(self, fn: Callable[[Pending], None]) -> None:
        """Call ``fn(self)`` once the reply (or a failure) arrived — at once if it already has.

        ``fn`` runs on the thread that completes the request (usually the reactor's), so it
        must be quick and must not block or raise.
        """
        with _CALLBACKS_LOCK:
            if not self._done:
                self._callbacks.append(fn)
                return
        fn(self)

    def _finish(self) -> None:
        with _CALLBACKS_LOCK:
            self._done = True
            waiter = self._waiter
            callbacks, self._callbacks = self._callbacks, []
        if waiter is not None:
            waiter.release()
        if self.callback is not None:
            self.callback(self)
        for fn in callbacks:
            fn(self)


P = TypeVar("P", bound=Pending)


class RequestTracker(Generic[P]):
    """Thread-safe table of outstanding requests.

    Args:
        kind: the record class of its requests: :class:`Pending`, or a subclass with
            what its owner tracks besides (the worker's send queue does).
    """

    @overload
    def __init__(self: RequestTracker[Pending]) -> None: ...

    @overload
    def __init__(self, kind: type[P]) -> None: ...

    def __init__(self, kind: type[Any] = Pending) -> None:
        self._kind = kind
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._pending: dict[int, P] = {}
        self._failed_nodes: dict[int, str] = {}
        self._closed: BaseException | None = None

    def new(self, node: int, what: str, callback: Callable[[Pending], None] | None = None,
            timeout: float | None = None) -> P:
        """Register a request to ``node``; fails at once if the node is known dead.

        With ``timeout``, :meth:`expire` fails the request once that many seconds passed
        without a reply.

        Raises:
            NodeFailedError: ``node`` was already declared dead.
        """
        with self._lock:
            if self._closed is not None:
                raise self._closed
            if node in self._failed_nodes:
                raise NodeFailedError(node_name(node), self._failed_nodes[node])
            p: P = self._kind(next(self._ids), node, what, callback, timeout)
            self._pending[p.request] = p
            return p

    def outstanding_to(self, node: int) -> list[P]:
        """The requests to ``node`` still waiting for their replies, oldest first."""
        with self._lock:
            return sorted((p for p in self._pending.values() if p.node == node), key=lambda p: p.request)

    def any_to(self, node: int, which: Callable[[P], bool]) -> bool:
        """True if a request to ``node`` for which ``which(request)`` holds still waits for its reply."""
        with self._lock:
            return any(p.node == node and which(p) for p in self._pending.values())

    def complete(self, header: Header, buffers: list[Any]) -> bool:
        """Deliver a reply; returns False for an unknown (late or duplicate) request id."""
        p = self.take(header.request)
        if p is None:
            return False
        self.deliver(p, header, buffers)
        return True

    def take(self, request: int) -> P | None:
        """Remove and return the outstanding request ``request`` (None if unknown); :meth:`deliver` it next."""
        with self._lock:
            return self._pending.pop(request, None)

    def resolve(self, p: Pending, header: Header, error: BaseException | None = None) -> None:
        """Complete ``p`` without a reply of its own (``header`` stands for it), or fail it with ``error``.

        Does nothing if ``p`` is no longer outstanding (it completed or failed already).
        """
        with self._lock:
            if self._pending.pop(p.request, None) is None:
                return
        p.header = header
        p.error = error
        p._finish()

    @staticmethod
    def deliver(p: Pending, header: Header, buffers: list[Any]) -> None:
        """Complete ``p`` (taken with :meth:`take`) with its reply."""
        p.header = header
        p.buffers = buffers
        if header.command is Command.ERROR:
            kind, message, node = ErrorReply.parse(header)
            if kind == "NodeFailedError":
                p.error = NodeFailedError(node or node_name(p.node), message)
            elif kind == "MembershipChangedError":  # an elastic job's voided work (server.commits, server.members)
                p.error = MembershipChangedError(message)
            elif kind == "CollectiveMismatchError":  # a sync round failed on mismatched step counts (server.steps)
                p.error = CollectiveMismatchError(message)
            else:
                p.error = RemoteError(node_name(p.node), kind, message)
        p._finish()

    def revive_node(self, node: int) -> None:
        """``node`` is alive again (a replacement process): new requests to it are allowed."""
        with self._lock:
            self._failed_nodes.pop(node, None)

    def fail_node(self, node: int, detail: str) -> None:
        """Fail every request waiting on ``node`` and every later one to it."""
        with self._lock:
            self._failed_nodes.setdefault(node, detail)
            victims = [p for p in self._pending.values() if p.node == node]
            for p in victims:
                del self._pending[p.request]
        for p in victims:
            p.error = NodeFailedError(node_name(node), detail)
            p._finish()

    def fail_all(self, error: BaseException) -> None:
        """Fail every outstanding request, and every later one, with ``error``."""
        with self._lock:
            self._closed = error
            victims = list(self._pending.values())
            self._pending.clear()
        for p in victims:
            p.error = error
            p._finish()

    def expire(self, now: float | None = None) -> int:
        """Fail every request whose deadline has passed; returns how many."""
        now = time.monotonic() if now is None else now
        with self._lock:
            victims = [p for p in self._pending.values() if p.deadline is not None and p.deadline <= now]
            for p in victims:
                del self._pending[p.request]
        for p in victims:
            p.error = OperationTimeoutError(f"{p.what} to {node_name(p.node)} got no reply within {p.timeout} s")
            p._finish()
        return len(victims)

    def outstanding(self) -> list[P]:
        """The requests still waiting (a snapshot)."""
        with self._lock:
            return list(self._pending.values())
