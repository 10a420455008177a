"""``NodeRuntime``: what every node process runs its networking on.

The scheduler, each server and each worker's client own the same three things: a
ZeroMQ context (their own, or one borrowed — tests run a whole cluster on one), a
:class:`~pskv.transport.Reactor` thread that owns the sockets, and (servers and
workers) a :class:`~pskv.cluster.requests.RequestTracker` of requests awaiting replies.
This class builds them and stops them once, in the one safe order: fail what still
waits (nobody waits forever on a stopped node), stop the reactor, then terminate an
owned context — also when ``stop`` is reached twice (a node's ``run`` ends while
another thread stops it). ZeroMQ's ``term`` waits, without a timeout, until every socket
of the context is closed, so it runs on a helper thread that the node waits for only
:data:`TERM_TIMEOUT` seconds: a socket left open (a bug) costs a warning naming the node,
never a node that cannot exit. Called from the reactor thread itself (a handler stopping
its node), the same helper first waits for that thread to end.

With a CURVE cluster key (``ClusterConfig.curve_key_file``, ``PSKV_CURVE_KEY_FILE``) the
key file is read first — a missing, malformed or group/world-readable file raises before
any context, thread or socket exists — and every TCP socket of the reactor
authenticates and encrypts with it (:class:`~pskv.transport.security.CurveSecurity`);
its ZAP handler stops with the runtime.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import zmq

from pskv.cluster.requests import RequestTracker
from pskv.config import ClusterConfig
from pskv.errors import TransportError
from pskv.transport import Reactor
from pskv.transport.bounds import DEFAULT_BOUNDS, Bounds
from pskv.transport.memory import keep_freed_memory
from pskv.transport.security import CurveSecurity

__all__ = ["NodeRuntime", "TERM_TIMEOUT"]

log = logging.getLogger(__name__)

TERM_TIMEOUT = 5.0
"""Seconds a stopping node waits for its context to end (all its sockets closed)."""


class NodeRuntime:
    """A node's context, reactor and (optional) request tracker, stopped once.

    Args:
        name: the reactor thread's name (``pskv-server``, ...).
        context: a ZeroMQ context to borrow; None makes one this runtime owns.
        io_threads: ZeroMQ I/O threads of an owned context (``cluster.io_threads``, if set, wins).
        tracker: the node's request tracker, failed when the network thread fails or
            the node stops.
        describe: the node's name for messages (``"server 0"``, ``"the worker"``);
            called when needed (a server learns its rank late).
        cluster: the cluster contract; its ``curve_key_file`` (if any) secures every socket,
            its message and send-queue limits bound every peer (:mod:`pskv.transport.bounds`).
        on_failure: called (on the failing thread) with the error when the network thread fails:
            a node whose main thread waits on no request (the scheduler) ends its wait there.

    Raises:
        InvalidArgumentError: the CURVE key file is missing, malformed or readable by
            other users (the message names the file); nothing was started.
    """

    def __init__(self, name: str, context: zmq.Context[Any] | None = None, io_threads: int = 1,
                 tracker: RequestTracker[Any] | None = None, describe: Callable[[], str] = lambda: "the node",
                 cluster: ClusterConfig | None = None,
                 on_failure: Callable[[TransportError], None] | None = None) -> None:
        key_file = cluster.curve_key_file if cluster is not None else ""
        self.security = CurveSecurity.from_file(key_file, name.removeprefix("pskv-")) if key_file else None
        self._own_context = context is None
        if cluster is not None:
            keep_freed_memory(cluster.keep_freed_bytes)  # message buffers reuse memory (once per process)
            if cluster.io_threads:
                io_threads = cluster.io_threads
        self.context: zmq.Context[Any] = zmq.Context(io_threads=io_threads) if context is None else context
        self.tracker = tracker
        self._describe = describe
        self._on_failure = on_failure  # told too when the network thread fails (a node that waits on no request)
        self._stop_lock = threading.Lock()
        bounds = Bounds.of(cluster) if cluster is not None else DEFAULT_BOUNDS
        self.reactor = Reactor(self.context, name, on_failure=self._on_reactor_failure, security=self.security,
                               bounds=bounds)

    def _on_reactor_failure(self, exc: BaseException) -> None:
        error = TransportError(f"{self._describe()}'s network thread failed: {exc!r}")
        if self.tracker is not None:
            self.tracker.fail_all(error)
        if self._on_failure is not None:
            self._on_failure(error)

    def stop(self, reason: str = "") -> None:
        """Fail waiting requests (with ``reason``), stop the reactor, release an owned context (idempotent)."""
        if self.tracker is not None:
            self.tracker.fail_all(TransportError(reason or f"{self._describe()} stopped"))
        self.reactor.stop()
        if self.security is not None:  # its ZAP socket must close before the context can end
            self.security.stop()
        with self._stop_lock:  # a node's run() and an outside stop() may both get here
            if self._own_context:
                self._own_context = False
                self._end_context()

    def _end_context(self) -> None:
        """``term`` the owned context on a daemon thread, waited for :data:`TERM_TIMEOUT` s at most."""
        on_reactor = self.reactor.on_reactor_thread()
        reactor_thread = threading.current_thread() if on_reactor else None

        def end() -> None:
            if reactor_thread is not None:  # its sockets close as its loop ends
                reactor_thread.join(TERM_TIMEOUT)
            self.context.term()

        ender = threading.Thread(target=end, name=f"{self._describe()}-term", daemon=True)
        ender.start()
        if on_reactor:
            return  # waiting here would wait for ourselves
        ender.join(TERM_TIMEOUT)
        if ender.is_alive():
            log.warning("%s: a socket of its ZeroMQ context was still open %.0f s after it stopped; "
                        "the context is left to the process's exit", self._describe(), TERM_TIMEOUT)
