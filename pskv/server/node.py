"""The server node: registers with the scheduler, then serves its shard until the job ends.

All work happens on the reactor thread: requests are decoded and validated there
(:mod:`pskv.protocol.codec`), applied to the :class:`~pskv.server.shard.ServerShard`,
and answered — at once, or later for pulls that wait for a sync round. A request that
fails validation gets an ``ERROR`` reply naming the problem; the server keeps serving
everyone else.

The node is the hub: it owns the sockets and the life cycle, and dispatches each
request to one handler. The pieces live beside it, each a small class with its own
state that receives what it needs (the shard, a way to reply):

* :mod:`pskv.server.handlers` — the data commands (INIT, PUSH, PULL, ...), with
  :mod:`pskv.server.gather` assembling pull replies;
* :mod:`pskv.server.control` — mode, optimizer, controllers, saved states, checkpoints;
* :mod:`pskv.server.dedup` — what a repeated request gets;
* :mod:`pskv.server.liveness` — dead and replaceable workers, stalled rounds;
* :mod:`pskv.server.checkpointing` — the shard in and out of a checkpoint.
"""

from __future__ import annotations

import logging
from typing import Any

import zmq

from pskv.cluster import Membership, RequestTracker
from pskv.cluster.runtime import NodeRuntime
from pskv.config import ClusterConfig
from pskv.errors import KVStoreError, ProtocolError, TransportError
from pskv.protocol import Command, Header, Role, decode, node_id, node_name, node_role_rank
from pskv.protocol.replies import error_frames
from pskv.server.checkpointing import ShardCheckpoints
from pskv.server.control import ControlHandlers
from pskv.server.controllers import import_modules
from pskv.server.dedup import Dropped, Regather, Repeat, ReplyCache
from pskv.server.handlers import DataHandlers, Handler
from pskv.server.liveness import DeadWorkers, StallReport
from pskv.server.shard import ServerShard
from pskv.transport import IO_THREADS
from pskv.transport.addresses import bind_host
from pskv.transport.local import local_path
from pskv.transport.shm import ShmDirectory, host_id, job_prefix

__all__ = ["ServerNode"]

log = logging.getLogger("pskv.server")


class ServerNode:
    """One server process (or thread, in tests).

    Args:
        cluster: the cluster contract.
        context: ZeroMQ context (a new one by default).
    """

    def __init__(self, cluster: ClusterConfig, context: zmq.Context[Any] | None = None) -> None:
        self._cluster = cluster
        self._tracker = RequestTracker()
        self._runtime = NodeRuntime("pskv-server", context, IO_THREADS, self._tracker, self._get_name)
        self._reactor = self._runtime.reactor
        self._sid, self.address = self._reactor.bind_router(f"tcp://{bind_host(cluster)}:0", self._on_message)
        self._shm_dir = ShmDirectory(f"{job_prefix(cluster.job_id)}server-") if cluster.uses_shm else None
        shm_info = {"dir": self._shm_dir.path, "host": host_id()} if self._shm_dir else None
        if self._shm_dir is not None:
            try:  # workers on this host send their requests here (see WorkerClient.connect)
                self._reactor.bind_local(self._sid, local_path(self._shm_dir.path))
            except TransportError as exc:
                log.info("no local socket, workers on this host use TCP: %s", exc)
        workers = tuple(node_id(Role.WORKER, r) for r in range(cluster.num_workers))
        allocate = self._shm_dir.create if self._shm_dir is not None else None
        self._shard = ServerShard(cluster.num_workers, sync=True, allocate=allocate, workers=workers)
        self._rank = -1
        self._dead = DeadWorkers(self._shard, cluster.recovery_timeout, self._get_name)
        self._membership = Membership(cluster, self._reactor, self._tracker, Role.SERVER, self.address,
                                      on_dead=self._dead.on_node_dead, shm=shm_info,
                                      on_alive=self._dead.on_node_alive)
        if cluster.recovery_timeout > 0:
            self._reactor.add_timer(max(0.05, min(1.0, cluster.recovery_timeout / 4)), self._dead.check_recovery)
        self._replies = ReplyCache()
        self._checkpoints = ShardCheckpoints(self._shard, cluster, self._get_name)
        self._routes: dict[bytes, bytes] = {}  # a worker's send-only socket -> where its replies go (HELLO)
        self._data = DataHandlers(self._shard, self._reply, self._answer, self._node_id, self._replies, self._dead,
                                  self._routes, self._get_name)
        control = ControlHandlers(self._shard, self._checkpoints, self._reply, self._node_id, self._get_rank)
        self._handlers: dict[Command, Handler] = {**self._data.handlers(), **control.handlers()}
        if cluster.server_modules:
            import_modules(cluster.server_modules)
        if cluster.stall_report > 0:
            stalls = StallReport(self._shard, cluster.num_workers, cluster.stall_report, self._get_name)
            self._reactor.add_timer(min(cluster.stall_report / 4, 5.0), stalls.report)
        self._held: list[tuple[bytes, list[Any]]] | None = None  # value replies held while a message is handled

    @property
    def name(self) -> str:
        """``'server <rank>'``."""
        return f"server {self._rank}"

    def _get_name(self) -> str:
        return self.name

    def _get_rank(self) -> int:
        return self._rank

    # -- life cycle ---------------------------------------------------------------------
    def run(self) -> None:
        """Register, serve until every worker is done, then stop.

        Raises:
            NodeFailedError: the scheduler died.
            OperationTimeoutError: the cluster did not assemble in time.
            CheckpointError: ``resume_from`` names no usable checkpoint for this server.
        """
        try:
            if self._cluster.resume_from:
                self._checkpoints.restore(self._cluster.resume_from)
            self._reactor.start()
            info = self._membership.register(self._cluster.server_rank)
            self._rank = info.rank
            if info.recovery:  # a replacement in a running job: the workers go on numbering their pushes
                self._reactor.call_soon(self._checkpoints.apply_saved_counts)
            log.info("%s serving on %s", self.name, self.address)
            # Wait for the end of the job. This wait has no deadline of its own: a job may
            # run for days. It ends with NodeFailedError when the scheduler dies (the
            # heartbeats notice within PS_HEARTBEAT_TIMEOUT).
            self._membership.shutdown(wait=True, timeout=None)
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop serving and release the sockets (idempotent); unblocks :meth:`run`."""
        self._runtime.stop()
        if self._shm_dir is not None:
            self._shm_dir.remove()

    # -- dispatch -----------------------------------------------------------------------
    def _on_message(self, identity: bytes, frames: list[zmq.Frame]) -> None:
        try:
            header, buffers = decode(frames)
        except ProtocolError as exc:
            log.error("%s: rejected a malformed message from %r: %s", self.name, identity, exc)
            return
        handler = self._handlers.get(header.command)
        origin = identity  # the socket it came from: one process's (fixed across reconnects)
        identity = self._routes.get(identity, identity)  # from a send-only socket: answer where its HELLO came from
        self._held = []
        try:
            try:
                role, rank = node_role_rank(header.sender)
            except ValueError:
                raise ProtocolError(f"sender {header.sender} is not a node id") from None
            if role is not Role.WORKER or rank >= self._cluster.num_workers:
                raise ProtocolError(f"sender {header.sender} is not a worker of this job")
            if handler is None:
                raise ProtocolError(f"a server does not handle {header.command.name}")
            repeat = self._replies.begin(origin, header.request)
            if repeat is None:
                handler(identity, header, buffers)
            else:
                self._answer_repeat(identity, header, repeat)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an ERROR reply; the server lives on
            if not isinstance(exc, KVStoreError):
                log.exception("%s: %s failed", self.name, header.command.name)
            self._reply(identity, error_frames(header, self._node_id(), type(exc).__name__, str(exc)))
        finally:
            self._replies.end()
            held, self._held = self._held, None
            for peer, reply in held:
                self._reactor.send_router(self._sid, peer, reply)

    def _answer_repeat(self, identity: bytes, header: Header, repeat: Repeat) -> None:
        """Answer a request its sender sent again after a reset connection (see :mod:`pskv.server.dedup`)."""
        if isinstance(repeat, Dropped):
            log.debug("%s: dropped a repeat of request %d of %s (being answered)", self.name, header.request,
                      node_name(header.sender))
        elif isinstance(repeat, Regather):  # a pushpull: its rounds' values again, its pushes not applied again
            self._data.gather(identity, header, repeat.parts, shared=repeat.shared)
        else:  # a short answer: the same again
            self._reactor.send_router(self._sid, identity, repeat.frames)

    def _node_id(self) -> int:
        return self._membership.node_id

    def _reply(self, identity: bytes, frames: list[Any]) -> None:
        """Send the reply to the message being handled (at once)."""
        self._replies.answered(frames)  # kept for a repeat of the request, if short
        self._reactor.send_router(self._sid, identity, frames)

    def _answer(self, identity: bytes, frames: list[Any]) -> None:
        """Send a reply with values (pull, pushpull) — after the reply to the message being handled.

        A push that completes a round answers the pulls waiting for it; its own
        acknowledgement goes first, so a worker sees a push acknowledged before any pull
        that includes it returns.
        """
        if self._held is not None:
            self._held.append((identity, frames))
        else:
            self._reactor.send_router(self._sid, identity, frames)
