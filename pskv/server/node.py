"""The server node: registers with the scheduler, then serves its shard until the job ends.

All work happens on the reactor thread: requests are decoded and validated there
(:mod:`pskv.protocol.codec`), applied to the :class:`~pskv.server.shard.ServerShard`,
and answered — at once, or later for pulls that wait for a sync round. A request that
fails validation gets an ``ERROR`` reply naming the problem; the server keeps serving
everyone else.

The node is the hub: it owns the sockets, the scheduler membership and the life cycle,
and hands every message to its :class:`~pskv.server.core.ServerCore` (decode, sender
check, repeats, dispatch, ERROR replies — no I/O). The pieces live beside it, each a
small class with its own state that receives what it needs (the shard, a way to reply):

* :mod:`pskv.server.handlers` — the data commands (INIT, PUSH, PULL, ...), with
  :mod:`pskv.server.gather` assembling pull replies;
* :mod:`pskv.server.control` — mode, optimizer, controllers, saved states, checkpoints;
* :mod:`pskv.server.dedup` — what a repeated request gets;
* :mod:`pskv.server.liveness` — dead and replaceable workers, stalled rounds;
* :mod:`pskv.server.checkpointing` — the shard in and out of a checkpoint.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import zmq

from pskv.cluster import Membership, RequestTracker
from pskv.cluster.runtime import NodeRuntime
from pskv.config import ClusterConfig
from pskv.errors import TransportError
from pskv.protocol import Role
from pskv.protocol.bodies import View
from pskv.server.controllers import import_modules
from pskv.server.core import ServerCore
from pskv.server.liveness import StallReport
from pskv.timeline import open_timeline
from pskv.transport import IO_THREADS
from pskv.transport.addresses import bind_host
from pskv.transport.shm import ShmDirectory, host_id, job_prefix
from pskv.transport.unix import local_path

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
        self._rank = -1
        self._tracker = RequestTracker()
        self._runtime = NodeRuntime("pskv-server", context, IO_THREADS, self._tracker, self._get_name, cluster)
        self._reactor = self._runtime.reactor
        self._shm_dir = ShmDirectory(f"{job_prefix(cluster.job_id)}server-") if cluster.uses_shm else None
        shm_info = {"dir": self._shm_dir.path, "host": host_id()} if self._shm_dir else None
        self._core = ServerCore(cluster, self._send, self._node_id, self._get_name, self._get_rank, self._secret,
                                self._shm_dir.create if self._shm_dir is not None else None,
                                self._reactor.call_soon, self._ask_view)
        # a connection not bound to a worker yet may send a HELLO or REJOIN: bigger messages are dropped
        self._sid, self.address = self._reactor.bind_router(f"tcp://{bind_host(cluster)}:0", self._on_message,
                                                            self._core.senders.bound)
        if self._shm_dir is not None:
            try:  # workers on this host send their requests here (see WorkerClient.connect)
                self._reactor.bind_local(self._sid, local_path(self._shm_dir.path))
            except TransportError as exc:
                log.info("no local socket, workers on this host use TCP: %s", exc)
        if cluster.data_channel == "tcp":
            try:  # workers on other hosts send their requests here (see pskv/worker/lanes.py, Lanes.open_data)
                # a stranger's connection is trusted once bound to a worker; sealed in a keyed job
                self._core.data.stream_port = self._reactor.bind_stream(self._sid, bind_host(cluster),
                                                                        self._core.senders.bound)
            except TransportError as exc:
                log.warning("no data port, workers on other hosts use ZeroMQ: %s", exc)
        self._shard = self._core.shard
        dead = self._core.dead
        fixed = not cluster.elastic  # an elastic job's departures are views (ServerCore.adopt), never dead workers
        self._membership = Membership(cluster, self._reactor, self._tracker, Role.SERVER, self.address,
                                      on_dead=dead.on_node_dead if fixed else None, shm=shm_info,
                                      on_alive=dead.on_node_alive, on_left=dead.on_node_left if fixed else None,
                                      metrics=self._core.metrics,
                                      mismatch=self._core.data.steps.take_report,
                                      on_view=self._on_view if cluster.elastic else None)
        self._core.data.steps.on_report = self._membership.report_now
        if cluster.recovery_timeout > 0:
            self._reactor.add_timer(max(0.05, min(1.0, cluster.recovery_timeout / 4)), dead.check_recovery)
        if cluster.stall_report > 0:
            stalls = StallReport(self._shard, cluster.num_workers, cluster.stall_report, self._get_name,
                                 self._core.key_names)
            self._reactor.add_timer(min(cluster.stall_report / 4, 5.0), stalls.report)

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
            InvalidArgumentError: a module of ``server_modules`` cannot be imported.
        """
        try:
            self._prepare()
            self._reactor.start()
            info = self._membership.register(self._cluster.server_rank)
            self._rank = info.rank
            self._core.trace(open_timeline(self._cluster.timeline, "server", self._rank, self._cluster.restart_count,
                                           info.recovery))
            if info.view is not None:  # an elastic job's: the view it was admitted in, before any worker's message
                self._reactor.call_soon(functools.partial(self._core.adopt, info.view))
            self._reactor.call_soon(self._core.registered)  # workers' HELLOs that came first: checked now
            if info.recovery:  # a replacement in a running job: the workers go on numbering their pushes
                self._reactor.call_soon(self._core.checkpoints.apply_saved_counts)
            port = self._core.data.stream_port
            log.info("%s serving on %s%s", self.name, self.address, f" (data port {port})" if port else "")
            # Wait for the end of the job. This wait has no deadline of its own: a job may
            # run for days. It ends with NodeFailedError when the scheduler dies (the
            # heartbeats notice within PS_HEARTBEAT_TIMEOUT).
            self._membership.shutdown(wait=True, timeout=None)
        finally:
            self.stop()

    def _prepare(self) -> None:
        """What comes before registering: the controllers' modules, the checkpoint to resume from.
        A failure here is reported to the scheduler before it is raised: the nodes waiting to
        register learn why at once, not at the startup timeout."""
        try:
            if self._cluster.server_modules:
                import_modules(self._cluster.server_modules)
            if self._cluster.resume_from:
                self._core.checkpoints.restore(self._cluster.resume_from)
        except Exception as exc:
            self._reactor.start()
            self._membership.report_failure(self._cluster.server_rank, exc)
            raise

    def stop(self) -> None:
        """Stop serving and release the sockets (idempotent); unblocks :meth:`run`."""
        self._runtime.stop()
        self._core.observer.close()
        if self._shm_dir is not None:
            self._shm_dir.remove()

    # -- wiring -------------------------------------------------------------------------
    def _on_message(self, identity: bytes, frames: list[zmq.Frame]) -> None:
        self._core.handle(identity, frames)

    def _on_view(self, view: View) -> None:
        """An elastic job's newer view (reactor thread): the shard adopts it, then the node's requests carry it."""
        self._core.adopt(view)
        self._membership.adopt(view)

    def _ask_view(self) -> None:
        self._membership.ask_view()

    def _send(self, identity: bytes, frames: list[Any]) -> None:
        self._reactor.send_router(self._sid, identity, frames)

    def _node_id(self) -> int:
        return self._membership.node_id

    def _secret(self) -> str:
        """The job's secret (from the registration reply; ``""`` before it)."""
        info = self._membership.info
        return info.secret if info is not None else ""
