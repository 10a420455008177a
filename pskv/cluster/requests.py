"""Request tracking: match replies to requests, wait with timeouts, fail on dead peers.

Every outgoing request gets an id and a :class:`Pending` record naming the node it went
to. The reactor thread completes records as replies arrive; callers wait on them with a
timeout. When a node is declared dead, every record waiting on it fails with
:class:`~pskv.errors.NodeFailedError` — so no caller waits forever on a dead peer.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

from pskv.errors import NodeFailedError, OperationTimeoutError, RemoteError
from pskv.protocol import Command, Header, node_name

__all__ = ["Pending", "RequestTracker"]


class Pending:
    """One outstanding request."""

    __slots__ = ("request", "node", "what", "_event", "header", "buffers", "error", "callback")

    def __init__(self, request: int, node: int, what: str,
                 callback: Callable[[Pending], None] | None = None) -> None:
        self.request = request
        self.node = node
        self.what = what
        self._event = threading.Event()
        self.header: Header | None = None
        self.buffers: list[Any] = []
        self.error: BaseException | None = None
        self.callback = callback

    def done(self) -> bool:
        """True once the reply (or a failure) arrived."""
        return self._event.is_set()

    def wait(self, timeout: float | None) -> Header:
        """Wait for the reply.

        Raises:
            OperationTimeoutError: no reply within ``timeout`` seconds (names the request).
            NodeFailedError: the peer died.
            RemoteError: the peer answered with an error.
        """
        if not self._event.wait(timeout):
            raise OperationTimeoutError(
                f"{self.what} to {node_name(self.node)} got no reply within {timeout} s"
            )
        if self.error is not None:
            raise self.error
        assert self.header is not None
        return self.header

    def _finish(self) -> None:
        self._event.set()
        if self.callback is not None:
            self.callback(self)


class RequestTracker:
    """Thread-safe table of outstanding requests."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._pending: dict[int, Pending] = {}
        self._failed_nodes: dict[int, str] = {}
        self._closed: BaseException | None = None

    def new(self, node: int, what: str, callback: Callable[[Pending], None] | None = None) -> Pending:
        """Register a request to ``node``; fails at once if the node is known dead.

        Raises:
            NodeFailedError: ``node`` was already declared dead.
        """
        with self._lock:
            if self._closed is not None:
                raise self._closed
            if node in self._failed_nodes:
                raise NodeFailedError(node_name(node), self._failed_nodes[node])
            p = Pending(next(self._ids), node, what, callback)
            self._pending[p.request] = p
            return p

    def complete(self, header: Header, buffers: list[Any]) -> bool:
        """Deliver a reply; returns False for an unknown (late or duplicate) request id."""
        with self._lock:
            p = self._pending.pop(header.request, None)
        if p is None:
            return False
        p.header = header
        p.buffers = buffers
        if header.command is Command.ERROR:
            from pskv.cluster.messages import parse_error

            kind, message, node = parse_error(header)
            if kind == "NodeFailedError":
                p.error = NodeFailedError(node or node_name(p.node), message)
            else:
                p.error = RemoteError(node_name(p.node), kind, message)
        p._finish()
        return True

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

    def outstanding(self) -> list[Pending]:
        """The requests still waiting (a snapshot)."""
        with self._lock:
            return list(self._pending.values())
