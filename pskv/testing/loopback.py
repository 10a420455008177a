"""A distributed store whose servers live in the same process, reached by function calls.

``loopback_store('dist_sync', num_servers=2)`` returns a real
:class:`~pskv.kvstore.dist.DistStore` — the real worker layer
(:class:`~pskv.worker.KVWorker`, :class:`~pskv.worker.client.WorkerClient`: request ids,
priorities, quiet pushes, reply checks) and real servers
(:class:`~pskv.server.core.ServerCore`: decode, dispatch, the shard's rules, ERROR
replies) — with neither a socket, a scheduler nor a network thread between them: the
client's channel to each server is a call into that server's core, and every message is
encoded to bytes and decoded again as on the wire. One worker (a job of one): barriers
are immediate and no node can die. Store semantics are testable this way in
milliseconds (the contract suite runs on it); what needs several workers or processes
uses :class:`~pskv.testing.InProcessCluster` or ``pskv launch``.

Threads: the store's engine may send from its worker threads. Messages are queued, and
whichever thread finds the queue idle handles them all — servers and replies — one at a
time, so each server sees one message at a time, as on its reactor thread.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from pskv.cluster import NodeInfo
from pskv.config import ClusterConfig, Config
from pskv.kvstore.dist import DistStore
from pskv.kvstore.types import StoreType
from pskv.protocol import Role, node_id
from pskv.protocol.bodies import DIGEST_CHARS, Met, node_token
from pskv.server.core import ServerCore
from pskv.worker import KVWorker
from pskv.worker.client import WorkerClient

__all__ = ["LoopbackNetwork", "loopback_store"]

T = TypeVar("T")
_WORKER = b"loopback-worker"  # the routing identity the servers see


class LoopbackNetwork:
    """The in-process "wire" between one worker's client and the servers' cores.

    As the scheduler would, it makes the job's secret (or takes ``secret``: a replacement
    worker of the same job) and gives the servers the secret and the worker its token, so
    the worker's connections are bound by the same proof as over sockets
    (:mod:`pskv.server.senders`): the client opens each with ``HELLO``.

    Args:
        cluster: the cluster contract (one worker).
        secret: the job's secret, hex (a new random one by default).
    """

    def __init__(self, cluster: ClusterConfig, secret: str | None = None) -> None:
        self.secret = secret or os.urandom(DIGEST_CHARS // 2).hex()
        self.client = WorkerClient(cluster)
        self.cores = [ServerCore(cluster, self._to_worker, _constant(node_id(Role.SERVER, r)), _constant(f"server {r}"),
                                 _constant(r), _constant(self.secret)) for r in range(cluster.num_servers)]
        self._queue: deque[tuple[int, list[bytes]]] = deque()  # (server rank, or -1 for the worker; frames)
        self._lock = threading.Lock()
        self._draining = False
        worker = node_id(Role.WORKER, 0)
        info = NodeInfo(worker, 0, tuple(f"loopback:{r}" for r in range(cluster.num_servers)),
                        cluster.num_servers, 1, (None,) * cluster.num_servers, False,
                        token=node_token(self.secret, worker))
        self.client.connect_in_process(info, [_Channel(self, r) for r in range(cluster.num_servers)], _OneWorker())

    def post(self, target: int, frames: list[Any]) -> None:
        """Queue a message (copied to bytes, as the wire would) and handle the queue unless a thread does."""
        with self._lock:
            self._queue.append((target, [bytes(memoryview(f).cast("B")) for f in frames]))
            if self._draining:
                return
            self._draining = True
        self._drain()

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._draining = False
                    return
                target, frames = self._queue.popleft()
            if target < 0:
                self.client.deliver(frames)
            else:
                self.cores[target].handle(_WORKER, frames)

    def _to_worker(self, identity: bytes, frames: list[Any]) -> None:
        self.post(-1, frames)


def _constant(value: T) -> Callable[[], T]:
    """A function returning ``value`` (a server's fixed id, name or rank)."""
    return lambda: value


class _Channel:
    """The client's request channel to one server: a message onto the loopback queue."""

    def __init__(self, network: LoopbackNetwork, server: int) -> None:
        self._network = network
        self._server = server

    def send(self, frames: list[Any]) -> None:
        self._network.post(self._server, frames)

    def close(self) -> None:
        return None


class _OneWorker:
    """The scheduler's part for a job of one worker: every barrier is complete, nobody dies."""

    def barrier(self, group: int, timeout: float, name: str = "", **meeting: Any) -> Met:
        return Met(meeting.get("result", ""))  # the one worker is rank 0: its own result, its own failure

    def num_dead_node(self, group: int, timeout: float) -> int:
        return 0

    def shutdown(self, wait: bool, timeout: float | None) -> None:
        return None


def loopback_store(name: str = "dist_sync", num_servers: int = 1, config: Config | None = None,
                   **settings: Any) -> DistStore:
    """A ``dist_*`` store of one worker over ``num_servers`` in-process servers (no sockets).

    Args:
        name: a distributed store type (``dist_sync``, ``dist_async``, ...).
        num_servers: servers the keys are spread over.
        config: the store's local settings.
        **settings: further :class:`~pskv.config.ClusterConfig` fields (``bigarray_bound``, ...).
    """
    store_type = StoreType.parse(name)
    cluster = ClusterConfig(num_servers=num_servers, num_workers=1, role="worker", root_uri="127.0.0.1",
                            root_port=1, shm=0, heartbeat_interval=0, **settings)
    network = LoopbackNetwork(cluster)
    worker = KVWorker(cluster, sync=store_type.sync, client=network.client)
    return DistStore(name, config, cluster, worker=worker)
