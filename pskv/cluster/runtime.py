"""``NodeRuntime``: what every node process runs its networking on.

The scheduler, each server and each worker's client own the same three things: a
ZeroMQ context (their own, or one borrowed — tests run a whole cluster on one), a
:class:`~pskv.transport.Reactor` thread that owns the sockets, and (servers and
workers) a :class:`~pskv.cluster.requests.RequestTracker` of requests awaiting replies.
This class builds them and stops them once, in the one safe order: fail what still
waits (nobody waits forever on a stopped node), stop the reactor, then terminate an
owned context — also when ``stop`` is reached twice (a node's ``run`` ends while
another thread stops it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import zmq

from pskv.cluster.requests import RequestTracker
from pskv.errors import TransportError
from pskv.transport import Reactor

__all__ = ["NodeRuntime"]


class NodeRuntime:
    """A node's context, reactor and (optional) request tracker, stopped once.

    Args:
        name: the reactor thread's name (``pskv-server``, ...).
        context: a ZeroMQ context to borrow; None makes one this runtime owns.
        io_threads: ZeroMQ I/O threads of an owned context.
        tracker: the node's request tracker, failed when the network thread fails or
            the node stops.
        describe: the node's name for messages (``"server 0"``, ``"the worker"``);
            called when needed (a server learns its rank late).
    """

    def __init__(self, name: str, context: zmq.Context[Any] | None = None, io_threads: int = 1,
                 tracker: RequestTracker[Any] | None = None, describe: Callable[[], str] = lambda: "the node") -> None:
        self._own_context = context is None
        self.context: zmq.Context[Any] = zmq.Context(io_threads=io_threads) if context is None else context
        self.tracker = tracker
        self._describe = describe
        self._stop_lock = threading.Lock()
        self.reactor = Reactor(self.context, name, on_failure=self._on_reactor_failure)

    def _on_reactor_failure(self, exc: BaseException) -> None:
        if self.tracker is not None:
            self.tracker.fail_all(TransportError(f"{self._describe()}'s network thread failed: {exc!r}"))

    def stop(self, reason: str = "") -> None:
        """Fail waiting requests (with ``reason``), stop the reactor, release an owned context (idempotent)."""
        if self.tracker is not None:
            self.tracker.fail_all(TransportError(reason or f"{self._describe()} stopped"))
        self.reactor.stop()
        with self._stop_lock:  # a node's run() and an outside stop() may both get here
            if self._own_context:
                self._own_context = False
                self.context.term()
