"""The worker's connection to the cluster: registration, liveness, requests to servers.

Requests are sent from the calling thread — no hand-off to the reactor thread; requests
queued while another thread is sending go out by priority (higher first), each on the
connection to its server that :class:`~pskv.worker.lanes.Lanes` chose: a local one, a TCP
data connection (both carry the replies too, read by the waiting thread itself:
:meth:`WorkerClient._read_local`), or ZeroMQ.

Each request returns a :class:`~pskv.cluster.requests.Pending` that the caller waits on
with a timeout, or that completes callbacks. A request made with a timeout fails with
:class:`~pskv.errors.OperationTimeoutError` once it passed (checked every
``EXPIRY_INTERVAL`` s on the reactor). A server or the scheduler found dead fails every
request waiting on it with :class:`~pskv.errors.NodeFailedError`.

*Quiet* requests (non-blocking pushes) get no reply when they succeed; the client tells
:class:`~pskv.worker.quiet.QuietPushes` (``client.quiet``) what it sent and which replies
came, and that confirms them. A reset ZeroMQ connection and a replaced server
(``PSKV_SERVER_RECOVERY``) are :class:`~pskv.worker.replacement.ServerReplacement`'s
(``client.replacement``). Key-value requests are built by
:class:`~pskv.worker.kv_worker.KVWorker`, which owns this client.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol

import zmq

from pskv.cluster import Membership, NodeInfo, Pending, RequestTracker
from pskv.cluster.runtime import NodeRuntime
from pskv.config import ClusterConfig
from pskv.errors import NodeFailedError, ProtocolError
from pskv.metrics import STALL_AFTER, NodeCounters
from pskv.protocol import (
    SCHEDULER_ID,
    ArraySpec,
    Command,
    Flag,
    Header,
    Role,
    decode,
    encode,
    node_id,
    node_name,
    node_role_rank,
)
from pskv.protocol.bodies import Counters
from pskv.transport import IO_THREADS
from pskv.transport.polled import PolledConnection
from pskv.transport.stream import StreamConnection
from pskv.transport.unix import LocalConnection
from pskv.worker.elastic import WorkerView
from pskv.worker.fold import HeldPushes
from pskv.worker.lanes import Lanes
from pskv.worker.pacing import Pacing
from pskv.worker.quiet import QuietPushes
from pskv.worker.replacement import ServerReplacement, WorkerRejoin
from pskv.worker.requests import WorkerRequest

__all__ = ["WorkerClient", "WorkerRequest"]

log = logging.getLogger("pskv.worker")

# How often the reactor fails requests whose timeout passed (seconds).
EXPIRY_INTERVAL = 0.1


class Channel(Protocol):
    """Where requests to one server leave: a ZeroMQ sender, a local socket, or an in-process channel."""

    def send(self, frames: list[Any]) -> None: ...

    def close(self) -> None: ...


def _answered(pending: WorkerRequest) -> bool:
    return not pending.quiet


class WorkerClient:
    """One worker's network side.

    Args:
        cluster: the cluster contract.
        context: ZeroMQ context (a new one by default).
        on_server_replaced: given a replaced server's rank (see :class:`ServerReplacement`).
    """

    def __init__(self, cluster: ClusterConfig, context: zmq.Context[Any] | None = None,
                 on_server_replaced: Callable[[int], None] | None = None) -> None:
        self._cluster = cluster
        self.tracker: RequestTracker[WorkerRequest] = RequestTracker(WorkerRequest)
        self._runtime = NodeRuntime("pskv-worker", context, IO_THREADS, self.tracker, lambda: "the worker", cluster)
        self._reactor = self._runtime.reactor
        self.counters = NodeCounters()  # what pskv top shows of this worker (KVWorker counts its calls)
        self.lanes = Lanes(self)  # chooses, opens and opens again the connections to each server
        self.replacement = ServerReplacement(self, on_server_replaced)  # a reset connection, a replaced server
        self.view_epoch = 0  # an elastic job's adopted view, on every request's header (self.views; else 0: not sent)
        self.views = WorkerView(self)  # an elastic job's view: epoch, rank, size (pskv.worker.elastic)
        self.membership = Membership(cluster, self._reactor, self.tracker, Role.WORKER, on_dead=self._on_node_dead,
                                     on_servers=self.replacement.replaced, metrics=self._metrics,
                                     on_view=self.views.arrived if cluster.elastic else None)
        # per server rank (set by self.lanes): its polled DEALER's id (ZeroMQ replies), where its requests leave
        self._servers: list[int | None] = []
        self._senders: list[Channel] = []
        self._queue: list[tuple[float, int, int, list[Any], WorkerRequest]] = []  # (-priority, seq, server, frames, pending)
        self._queue_lock = threading.Lock()
        self._send_lock = threading.Lock()  # held by the thread emptying the queue
        self._sent: list[itertools.count[int]] = []  # per server: sequence numbers of the messages sent there
        self._epoch: list[int] = []  # per server: replacements so far (PSKV_SERVER_RECOVERY)
        # servers being replaced or reconnected: their requests wait in the queue (_hold, _release)
        self._paused: collections.Counter[int] = collections.Counter()
        self.quiet = QuietPushes(self.tracker, self._sync)  # quiet requests sent, not yet confirmed
        self.held = HeldPushes(self)  # quiet pushes held for the pull behind them (KVWorker's)
        self.pacing = Pacing(self, cluster.window)  # a call's unanswered messages per server, between hosts
        self._seq = itertools.count()
        self._tx = os.urandom(8).hex()  # names this worker's send-only sockets (HELLO) and data connections
        self.info: NodeInfo | None = None
        self.rejoin = WorkerRejoin(self)  # a replacement of a dead worker: its rank's pushes that arrived (REJOIN)
        self._reactor.add_timer(EXPIRY_INTERVAL, self._expire)

    # -- life cycle ---------------------------------------------------------------------
    def connect(self) -> NodeInfo:
        """Register with the scheduler and connect to every server.

        Raises:
            OperationTimeoutError: the cluster did not assemble within the startup timeout.
        """
        if self.info is not None:  # connected already (connect_in_process)
            return self.info
        self._reactor.start()
        info = self.views.admitted(self.membership.register(self._cluster.rank))  # elastic: the view's rank
        self._sent = [itertools.count(1) for _ in info.servers]
        self._epoch = [0] * len(info.servers)
        self.lanes.open(info, self._cluster.startup_timeout)
        if info.recovery:  # a replacement of a dead worker: each server says which pushes of this rank arrived
            self.rejoin(len(info.servers), self._cluster.startup_timeout)
        return info

    def connect_in_process(self, info: NodeInfo, channels: Sequence[Channel], membership: Any) -> None:
        """Talk to servers of this process through ``channels`` (one per server rank), without sockets.

        For :mod:`pskv.testing.loopback`: no scheduler and no socket is used; each
        channel's ``send(frames)`` hands a request to a server in this process, whose
        replies come back through :meth:`deliver`. ``membership`` stands in for the
        scheduler's (``barrier``, ``num_dead_node``, ``shutdown``). Everything else —
        request ids, priorities, quiet pushes, timeouts — is this client's own.
        """
        self.info = info
        self.membership = membership
        self._sent = [itertools.count(1) for _ in channels]
        self._epoch = [0] * len(channels)
        self.lanes.in_process(channels, self._cluster.startup_timeout)

    def _metrics(self) -> Counters:
        """This worker's metrics now (reactor thread): its requests without a reply are its queue,
        those sent more than :data:`~pskv.metrics.STALL_AFTER` s ago its stalls."""
        waiting = [p for p in self.tracker.outstanding() if p.what != "heartbeat"]
        stale = time.monotonic() - STALL_AFTER  # sent before this: stalled (a request's deadline is sent + timeout)
        stalled = collections.Counter(p.node for p in waiting if p.deadline is not None and p.timeout is not None
                                      and p.deadline - p.timeout < stale)  # the scheduler's: a barrier
        return self.counters.report(len(waiting), sum(stalled.values()),
                                    stalled.most_common(1)[0][0] if stalled else 0)

    def deliver(self, frames: Sequence[Any]) -> None:
        """A reply arrived (from a channel of :meth:`connect_in_process`; sockets call it themselves)."""
        self._on_reply(frames)

    def channels(self) -> list[str]:
        """How requests reach each server, by rank (:meth:`Lanes.kinds`)."""
        return self.lanes.kinds()

    # -- a server's connection replaced (self.lanes, self.replacement) ----------------------
    def _hold(self, server: int) -> None:
        """Requests to ``server`` wait in the queue until :meth:`_release` (its connection is being replaced)."""
        with self._queue_lock:
            self._paused[server] += 1  # a count: a lost data connection and a replacement may overlap

    def _release(self, server: int) -> None:
        """One reason to hold ``server``'s requests is over: if it was the last, they go out."""
        with self._queue_lock:
            self._paused[server] -= 1
            if self._paused[server] <= 0:
                del self._paused[server]
        self._flush()

    def _queue_first(self, server: int, messages: list[tuple[WorkerRequest, list[Any]]]) -> None:
        """Queue ``messages`` to ``server`` ahead of everything else, in their order (sent again:
        each ``(pending, frames)`` is answered under the pending's request id)."""
        with self._queue_lock:
            for pending, frames in messages:
                heapq.heappush(self._queue, (-math.inf, next(self._seq), server, frames, pending))

    def close(self) -> None:
        """Stop the reactor and release the sockets (idempotent)."""
        self._runtime.stop("the worker's connection was closed")

    def _expire(self) -> None:
        self.tracker.expire()

    def _on_node_dead(self, nid: int) -> None:
        """Membership callback (reactor thread): a dead scheduler fails everything.

        A worker learns of a server's death only from the scheduler's heartbeat replies,
        so without the scheduler a request to a server that is gone or cut off would wait
        for its full request timeout (servers stop too when they lose the scheduler).
        Every outstanding request, and every later one, fails with NodeFailedError naming
        the scheduler.
        """
        if nid != SCHEDULER_ID:
            return  # its requests were failed by the membership already
        timeout = self._cluster.heartbeat_timeout
        self.tracker.fail_all(NodeFailedError(
            node_name(SCHEDULER_ID),
            f"no answer for {timeout:.1f} s; without it this worker cannot tell whether the servers live, "
            "so no request can be waited for",
        ))

    @property
    def node_id(self) -> int:
        """This worker's node id."""
        assert self.info is not None
        return self.info.node_id

    # -- requests -----------------------------------------------------------------------
    def request(self, server: int, command: Command, arrays: tuple[ArraySpec, ...] = (),
                data: list[Any] | None = None, body: str = "", priority: int = 0, what: str = "",
                timeout: float | None = None, quiet: bool = False, flags: int = 0,
                overtake: bool = False) -> WorkerRequest:
        """Queue a request to server ``server`` (rank); returns its pending reply.

        ``data`` buffers must stay unchanged until the reply arrives. With ``timeout``
        the request fails with OperationTimeoutError if no reply came in that many
        seconds (also for callers that never wait on it). A ``quiet`` request (sent
        with :attr:`Flag.QUIET`, so the server answers only a failure) completes when a
        later reply from the server confirms it (:meth:`QuietPushes.confirm`); it has no
        timeout of its own. ``flags``: further :class:`Flag` bits (SHM, SUMMED, ...).
        ``overtake`` (a pull): send it on a connection of its own — the server's second
        data connection (lane 1), else the ZeroMQ reply connection — when no quiet request
        to the server awaits confirmation, so it passes the megabytes of pushes the request
        connection still carries (the server holds a pull until the pushes it names
        arrive, and answers each piece as its round completes); its reply then confirms
        nothing.

        Raises:
            NodeFailedError: that server is already known dead.
        """
        pending = self.prepare(server, command, arrays, data, body, priority, what, timeout, quiet, flags)
        frames: list[Any] = pending.frames  # type: ignore[assignment]  # set by prepare
        if overtake and not quiet and self._overtake(server, frames, pending):
            return pending
        self._queue_and_send(-priority, server, frames, pending)
        return pending

    def prepare(self, server: int, command: Command, arrays: tuple[ArraySpec, ...] = (),
                data: list[Any] | None = None, body: str = "", priority: int = 0, what: str = "",
                timeout: float | None = None, quiet: bool = False, flags: int = 0) -> WorkerRequest:
        """The request :meth:`request` would send, encoded and awaited but not sent: :meth:`submit` sends it
        (:mod:`pskv.worker.pacing` holds some a while)."""
        pending = self.tracker.new(node_id(Role.SERVER, server), what or command.name.lower(),
                                   timeout=None if quiet else timeout)
        pending.quiet = quiet
        pending.local = self if self._local_conn(server) is not None else None
        if quiet:
            flags |= Flag.QUIET
        pending.frames = encode(Header(command, pending.request, self.node_id, arrays, priority, body, flags,
                                       self.view_epoch), data or [])  # kept: sent again after a reset, or to a replacement
        return pending

    def submit(self, server: int, priority: int, pending: WorkerRequest) -> None:
        """Send (or queue) a request made with :meth:`prepare`."""
        assert pending.frames is not None
        self._queue_and_send(-priority, server, pending.frames, pending)

    def _overtake(self, server: int, frames: list[Any], pending: WorkerRequest) -> bool:
        """Send ``pending`` on ``server``'s reply connection (see :meth:`request`); False: not possible."""
        sid = self._servers[server] if 0 <= server < len(self._servers) else None
        if sid is None:
            return False
        with self._send_lock:  # as _send_one: numbered, and never to a server being replaced
            if server in self._paused or self.quiet.waiting(pending.node):
                return False
            pending.sent = next(self._sent[server])  # sent again after a reset, like any request
            pending.epoch = self._epoch[server]
            pending.overtook = True
            lane = self.lanes.overtaking.get(server)
            if lane is None:
                pending.local = None  # its reply comes through ZeroMQ: the reactor reads it
                self._reactor.call_soon(partial(self._reactor.send_dealer, sid, frames))
                return True
            pending.reader = lane  # its waiter reads the reply there
            try:
                lane.send(frames)
            except ConnectionError as exc:  # sent again once the data connections are back
                log.warning("worker: request to server %d not sent: %s", server, exc)
        return True

    def _queue_and_send(self, key: float, server: int, frames: list[Any], pending: WorkerRequest) -> None:
        if self.held.held:  # a push held for a pull leaves before anything else to its server (pskv.worker.fold)
            self.held.release(server)
        self.enqueue(key, server, frames, pending)

    def enqueue(self, key: float, server: int, frames: list[Any], pending: WorkerRequest) -> None:
        """Send ``pending`` now or queue it (order ``key``); a held push (:class:`HeldPushes`, which sends them here)
        is left where it is."""
        if not self._queue and self._send_lock.acquire(blocking=False):
            try:  # nothing queued and nobody sending: no order to keep, straight out
                direct = not self._queue and server not in self._paused  # paused before a swap of its sender
                if direct:
                    self._send_one(server, frames, pending)
            finally:
                self._send_lock.release()
            if direct:
                if self._queue:  # queued by another thread while this one held the send lock
                    self._flush()
                return
        with self._queue_lock:
            heapq.heappush(self._queue, (key, next(self._seq), server, frames, pending))
        self._flush()

    def _sync(self, node: int, timeout: float | None, on_done: Callable[[Pending], None], body: str = "") -> WorkerRequest:
        """Queue a ``SYNC`` to server ``node`` after everything queued now (:class:`QuietPushes`; with a
        :class:`~pskv.protocol.bodies.Meeting` body, :meth:`WorkerControl.barrier`'s mark)."""
        _, server = node_role_rank(node)
        sync = self.tracker.new(node, "sync", timeout=timeout)
        sync.local = self if self._local_conn(server) is not None else None
        sync.add_done_callback(on_done)
        frames = encode(Header(Command.SYNC, sync.request, self.node_id, body=body, epoch=self.view_epoch))
        self._queue_and_send(math.inf, server, frames, sync)  # after everything queued
        sync.background()  # completes callbacks: its reply must be read without a waiter
        return sync

    # -- replies read by the waiting thread (local connections) -----------------------------
    def _local_conn(self, server: int) -> PolledConnection | None:
        """The local or data connection that carries requests to server ``server`` and their replies, if any."""
        conn = self._senders[server] if 0 <= server < len(self._senders) else None
        return conn if type(conn) is LocalConnection or type(conn) is StreamConnection else None

    def _read_local(self, pending: WorkerRequest, deadline: float) -> None:
        """Read the replies of ``pending``'s local connection in this thread until it is done (or ``deadline``).

        Every reply read is handled as the reactor would (:meth:`_on_reply`), in order.
        Returns early if another thread reads the connection (that one hands this reply
        on) or on the reactor thread (which reads it anyway).
        """
        server = node_role_rank(pending.node)[1]
        conn = pending.reader if pending.reader is not None else self._local_conn(server)
        if conn is None or self._reactor.on_reactor_thread():
            return
        self._reactor.read_local(conn, self._on_reply, pending.done, deadline)
        self._attend(pending.node)

    def _attend(self, node: int) -> None:
        """If answers from ``node`` are due that no thread reads now, have the reactor poll its connection.

        Quiet pushes do not count: their (error) answers wait for the next reader, or the
        reactor's next timer turn (at most ``EXPIRY_INTERVAL``).
        """
        server = node_role_rank(node)[1]
        for conn in (self._local_conn(server), self.lanes.overtaking.get(server)):
            if conn is not None and not conn.claimed and not conn.polled and self.tracker.any_to(node, _answered):
                self._reactor.wake()
                return

    def _flush(self) -> None:
        """Send queued requests, highest priority first, from this thread.

        If another thread is sending, it sends ours too: it looks at the queue again
        after letting go of the send lock.
        """
        while self._send_lock.acquire(blocking=False):
            held: list[tuple[float, int, int, list[Any], WorkerRequest]] = []
            try:
                while True:
                    with self._queue_lock:
                        if not self._queue:
                            break
                        item = heapq.heappop(self._queue)
                    _, _, server, frames, pending = item
                    if server in self._paused:  # being replaced: sent after the replay
                        held.append(item)
                        continue
                    self._send_one(server, frames, pending)
            finally:
                if held:
                    with self._queue_lock:
                        for item in held:
                            heapq.heappush(self._queue, item)
                self._send_lock.release()
            with self._queue_lock:
                if len(self._queue) == len(held):  # nothing new, or only held requests
                    return

    def _send_one(self, server: int, frames: list[Any], pending: WorkerRequest) -> None:
        """Send one request (the send lock is held), numbered in its server's order."""
        pending.sent = next(self._sent[server])
        pending.epoch = self._epoch[server]
        if pending.quiet:
            self.quiet.sent(pending)
        try:
            self._senders[server].send(frames)
        except ConnectionError as exc:  # a local connection whose server is gone: as ZeroMQ does
            # with a vanished peer, the request waits (membership declares the server
            # dead and fails it with NodeFailedError, or its timeout passes)
            log.warning("worker: request to server %d not sent: %s", server, exc)

    def _on_reply(self, frames: Sequence[Any]) -> None:
        try:
            header, buffers = decode(frames)
        except ProtocolError as exc:
            log.error("worker: malformed reply dropped: %s", exc)
            return
        pending = self.tracker.take(header.request)
        if pending is None:
            log.warning("worker: reply to unknown request %d dropped", header.request)
            return
        if pending.sent is not None and not pending.overtook:
            self.quiet.settle(pending.node, pending.sent)  # before this reply's own completion
        self.tracker.deliver(pending, header, buffers)

