"""The worker's connection to the cluster: registration, liveness, requests to servers.

Requests are queued by priority and sent by the reactor thread (higher priority first
among those waiting); each returns a :class:`~pskv.cluster.requests.Pending` that the
caller waits on with a timeout. A server or the scheduler found dead fails every
request waiting on it with :class:`~pskv.errors.NodeFailedError`.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from typing import Any

import zmq

from pskv.cluster import Membership, NodeInfo, Pending, RequestTracker
from pskv.config import ClusterConfig
from pskv.errors import OperationTimeoutError, ProtocolError, TransportError
from pskv.protocol import ArraySpec, Command, Header, Role, decode, encode, node_id
from pskv.transport import IO_THREADS, Reactor

__all__ = ["WorkerClient"]

log = logging.getLogger("pskv.worker")


class WorkerClient:
    """One worker's network side.

    Args:
        cluster: the cluster contract.
        context: ZeroMQ context (a new one by default).
    """

    def __init__(self, cluster: ClusterConfig, context: zmq.Context[Any] | None = None) -> None:
        self._cluster = cluster
        self._own_context = context is None
        self._ctx = zmq.Context(io_threads=IO_THREADS) if context is None else context
        self._stop_lock = threading.Lock()
        self.tracker = RequestTracker()
        self._reactor = Reactor(self._ctx, "pskv-worker", on_failure=self._on_reactor_failure)
        self.membership = Membership(cluster, self._reactor, self.tracker, Role.WORKER)
        self._servers: list[int] = []  # dealer socket id per server rank
        self._queue: list[tuple[int, int, int, list[Any]]] = []  # (-priority, seq, server, frames)
        self._queue_lock = threading.Lock()
        self._seq = itertools.count()
        self.info: NodeInfo | None = None

    # -- life cycle ---------------------------------------------------------------------
    def connect(self) -> NodeInfo:
        """Register with the scheduler and connect to every server.

        Raises:
            OperationTimeoutError: the cluster did not assemble within the startup timeout.
        """
        self._reactor.start()
        info = self.membership.register(self._cluster.rank)
        connected = threading.Event()

        def connect_all() -> None:
            self._servers = [self._reactor.connect_dealer(addr, self._on_reply) for addr in info.servers]
            connected.set()

        self._reactor.call_soon(connect_all)
        if not connected.wait(self._cluster.startup_timeout):
            raise OperationTimeoutError("could not connect to the servers")
        self.info = info
        return info

    def close(self) -> None:
        """Stop the reactor and release the sockets (idempotent)."""
        self.tracker.fail_all(TransportError("the worker's connection was closed"))
        self._reactor.stop()
        with self._stop_lock:  # run() and an outside stop() may both get here
            if self._own_context:
                self._own_context = False
                self._ctx.term()

    def _on_reactor_failure(self, exc: BaseException) -> None:
        self.tracker.fail_all(TransportError(f"the worker's network thread failed: {exc!r}"))

    @property
    def node_id(self) -> int:
        """This worker's node id."""
        assert self.info is not None
        return self.info.node_id

    # -- requests -----------------------------------------------------------------------
    def request(self, server: int, command: Command, arrays: tuple[ArraySpec, ...] = (),
                data: list[Any] | None = None, body: str = "", priority: int = 0, what: str = "") -> Pending:
        """Queue a request to server ``server`` (rank); returns its pending reply.

        ``data`` buffers must stay unchanged until the reply arrives.

        Raises:
            NodeFailedError: that server is already known dead.
        """
        pending = self.tracker.new(node_id(Role.SERVER, server), what or command.name.lower())
        frames = encode(Header(command, pending.request, self.node_id, arrays, priority, body), data or [])
        with self._queue_lock:
            heapq.heappush(self._queue, (-priority, next(self._seq), server, frames))
        self._reactor.call_soon(self._flush)
        return pending

    def _flush(self) -> None:
        while True:
            with self._queue_lock:
                if not self._queue:
                    return
                _, _, server, frames = heapq.heappop(self._queue)
            self._reactor.send_dealer(self._servers[server], frames)

    def _on_reply(self, frames: list[zmq.Frame]) -> None:
        try:
            header, buffers = decode(frames)
        except ProtocolError as exc:
            log.error("worker: malformed reply dropped: %s", exc)
            return
        if not self.tracker.complete(header, buffers):
            log.warning("worker: reply to unknown request %d dropped", header.request)
