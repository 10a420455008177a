"""The worker's connection to the cluster: registration, liveness, requests to servers.

Requests are sent from the calling thread — no hand-off to the reactor thread; requests
queued while another thread is sending go out by priority (higher first). Per server:

* on the same host (shared memory on): one local connection
  (:mod:`pskv.transport.unix`, a Unix-domain packet socket in the server's
  shared-memory directory) carries the requests and their replies — no ZeroMQ I/O
  threads on the way, which roughly halves the cost of a small message; it opens with a
  ``HELLO`` carrying this worker's token (the server binds it to this worker only then);
* otherwise ZeroMQ opens the session: requests leave on a send-only socket (a
  :class:`~pskv.transport.reactor.Sender`) and replies arrive on a DEALER the reactor
  polls; the server learns that pairing, and that the sockets are this worker's (its
  token from the scheduler), from the ``HELLO`` sent when connecting. If its answer
  offers a data port (``PSKV_DATA_CHANNEL=tcp``, no CURVE), a plain TCP connection
  (:mod:`pskv.transport.stream`) opened with its own ``HELLO`` then carries the
  requests and their replies, as a local connection does; one that fails is opened
  again under the same tag and the unanswered requests sent again (the server answers
  a repeat without applying it twice). The ZeroMQ session stays, for pulls that
  overtake (:meth:`WorkerClient.request`).

Each request returns a :class:`~pskv.cluster.requests.Pending` that the caller waits on
with a timeout, or that completes callbacks. A request made with a timeout fails with
:class:`~pskv.errors.OperationTimeoutError` once it passed (checked every
``EXPIRY_INTERVAL`` s on the reactor). A server or the scheduler found dead fails every
request waiting on it with :class:`~pskv.errors.NodeFailedError`.

*Quiet* requests (non-blocking pushes) get no reply when they succeed; the client tells
:class:`~pskv.worker.quiet.QuietPushes` (``client.quiet``) what it sent and which replies
came, and that confirms them. Server replacement (``PSKV_SERVER_RECOVERY``):
:meth:`WorkerClient.reconnect` switches the connection and sends first what the owner's
:class:`~pskv.worker.replay.ReplayLog` gives it. Key-value requests are built by
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
from pskv.errors import KVStoreError, NodeFailedError, OperationTimeoutError, ProtocolError, TransportError
from pskv.metrics import STALL_AFTER, NodeCounters
from pskv.protocol import (
    SCHEDULER_ID,
    TX_PREFIX,
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
from pskv.protocol.bodies import Counters, Hello, HelloReply, Rejoin, Rejoined
from pskv.transport import IO_THREADS
from pskv.transport.frames import Sender
from pskv.transport.shm import host_id
from pskv.transport.stream import StreamConnection, tag_of
from pskv.transport.unix import LocalConnection, local_path
from pskv.worker.quiet import QuietPushes

__all__ = ["WorkerClient", "WorkerRequest"]

# Routing identity prefix of a worker's reply socket: fixed, so the server's route to it
# (from HELLO) survives a reconnect after a reset connection.
RX_PREFIX = b"pskv-rx-"

log = logging.getLogger("pskv.worker")

# How often the reactor fails requests whose timeout passed (seconds).
EXPIRY_INTERVAL = 0.1
# A lost data connection is opened again this often (seconds) until it is back or its server is dead.
RESTREAM_INTERVAL = 0.5


class Channel(Protocol):
    """Where requests to one server leave: a ZeroMQ sender, a local socket, or an in-process channel."""

    def send(self, frames: list[Any]) -> None: ...

    def close(self) -> None: ...


class WorkerRequest(Pending):
    """A request to a server, with what the worker's send queue records about it.

    Sent on a local connection, its waiter reads the replies itself
    (:meth:`WorkerClient._read_local`) instead of waiting for the reactor thread to.
    """

    __slots__ = ("quiet", "sent", "epoch", "local", "overtook", "reader")

    def __init__(self, request: int, node: int, what: str,
                 callback: Callable[[Pending], None] | None = None, timeout: float | None = None) -> None:
        super().__init__(request, node, what, callback, timeout)
        self.quiet = False  # answered only on failure: a later reply from the server confirms it
        self.sent: int | None = None  # the per-server sequence number of the message, once sent
        self.epoch: int | None = None  # which incarnation of the server it was sent to (None: not sent yet)
        self.local: WorkerClient | None = None  # sent on a local connection of this client
        self.overtook = False  # sent on the reply connection, ahead of the request connection's queue
        self.reader: LocalConnection | StreamConnection | None = None  # where its reply comes, if not the server's usual

    def wait(self, timeout: float | None) -> Header:
        """Wait for the reply (see :meth:`Pending.wait`); on a local connection, read it in this thread."""
        client = self.local
        if client is not None and not self._done:
            deadline = math.inf if timeout is None else time.monotonic() + timeout
            client._read_local(self, deadline)
            if timeout is not None:
                timeout = max(0.0, deadline - time.monotonic())
        return super().wait(timeout)

    def background(self) -> None:
        """Nobody in this thread waits for the reply now: make sure it is read (by the reactor)."""
        client = self.local
        if client is not None and not self.quiet and not self._done:
            client._attend(self.node)


def _answered(pending: WorkerRequest) -> bool:
    return not pending.quiet


class WorkerClient:
    """One worker's network side.

    Args:
        cluster: the cluster contract.
        context: ZeroMQ context (a new one by default).
    """

    def __init__(self, cluster: ClusterConfig, context: zmq.Context[Any] | None = None,
                 on_server_replaced: Callable[[int], None] | None = None) -> None:
        self._cluster = cluster
        self._on_server_replaced = on_server_replaced
        self.tracker: RequestTracker[WorkerRequest] = RequestTracker(WorkerRequest)
        self._runtime = NodeRuntime("pskv-worker", context, IO_THREADS, self.tracker, lambda: "the worker", cluster)
        self._reactor = self._runtime.reactor
        self.counters = NodeCounters()  # what pskv top shows of this worker (KVWorker counts its calls)
        self.membership = Membership(cluster, self._reactor, self.tracker, Role.WORKER, on_dead=self._on_node_dead,
                                     on_servers=self._on_servers_replaced, metrics=self._metrics)
        self._servers: list[int | None] = []  # polled dealer socket id per server rank (replies arrive there)
        self._senders: list[Channel] = []  # where requests to each server rank leave
        self._queue: list[tuple[float, int, int, list[Any], WorkerRequest]] = []  # (-priority, seq, server, frames, pending)
        self._queue_lock = threading.Lock()
        self._send_lock = threading.Lock()  # held by the thread emptying the queue
        self._sent: list[itertools.count[int]] = []  # per server: sequence numbers of the messages sent there
        self._epoch: list[int] = []  # per server: replacements so far (PSKV_SERVER_RECOVERY)
        # servers being replaced or reconnected: their requests wait in the queue (a count per
        # server: a lost data connection and a replacement may overlap)
        self._paused: collections.Counter[int] = collections.Counter()
        self.quiet = QuietPushes(self.tracker, self._sync)  # quiet requests sent, not yet confirmed
        self._seq = itertools.count()
        self._tx = os.urandom(8).hex()  # names this worker's send-only sockets (HELLO) and data connections
        self._stream_ports: dict[int, int] = {}  # server rank -> its data port, while a data connection is used
        self._lanes: dict[int, StreamConnection] = {}  # server rank -> its data connection for overtaking pulls
        self.info: NodeInfo | None = None
        # a replacement process (REJOIN): per (server key, offset), pushes of this rank that arrived
        self.landed: dict[tuple[int, int], int] = {}
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
        info = self.membership.register(self._cluster.rank)
        connected = threading.Event()

        paths = [self._local_path(s, info) for s in range(len(info.servers))]

        def connect_all() -> None:
            for server, address in enumerate(info.servers):
                self._senders.append(self._connect(server, address, paths[server]))
            self._sent = [itertools.count(1) for _ in info.servers]
            self._epoch = [0] * len(info.servers)
            connected.set()

        self._reactor.call_soon(connect_all)
        if not connected.wait(self._cluster.startup_timeout):
            raise OperationTimeoutError("could not connect to the servers")
        self.info = info
        answers = self._hello_all(info, self._cluster.startup_timeout)
        for server, answer in enumerate(answers):
            self._open_stream(server, answer, self._cluster.startup_timeout)
        if info.recovery:  # a replacement of a dead worker: each server says which pushes of this rank arrived
            self.rejoin(len(info.servers), self._cluster.startup_timeout)
        return info

    def _hello_all(self, info: NodeInfo, timeout: float) -> list[Header]:
        """Open every connection with ``HELLO`` carrying this worker's token, before any request.

        The server binds the connection to this worker only then (:mod:`pskv.server.senders`);
        over ZeroMQ it also learns where this worker's replies go.

        Returns:
            Every server's answer, by rank.

        Raises:
            OperationTimeoutError: a server did not answer within ``timeout``.
            RemoteError: a server refused (a wrong token).
        """
        hellos = []
        for server, sid in enumerate(self._servers):
            pending = self.tracker.new(node_id(Role.SERVER, server), "hello")
            tx = self._tx if sid is not None else ""  # a local connection carries its replies itself
            frames = encode(Header(Command.HELLO, pending.request, info.node_id, body=Hello(tx, info.token).encode()))
            if sid is None:
                self._senders[server].send(frames)
            else:
                self._reactor.call_soon(partial(self._reactor.send_dealer, sid, frames))
            hellos.append(pending)
        answers = []
        for pending in hellos:
            try:
                answers.append(pending.wait(timeout))
            except OperationTimeoutError:
                raise OperationTimeoutError(f"could not connect to the servers: {pending.what} to "
                                            f"{node_name(pending.node)} got no answer") from None
        return answers

    # -- data connections (pskv.transport.stream) ---------------------------------------------
    def _open_stream(self, server: int, answer: Header, timeout: float) -> None:
        """Send requests to ``server`` on a data connection from now on, if its HELLO answer offers one.

        A data port that cannot be reached leaves the ZeroMQ session in use (logged).
        Call before requests go to ``server`` (connecting, or a replacement server).
        """
        if self._cluster.data_channel != "tcp" or self._servers[server] is None:
            return
        try:
            port = HelloReply.parse(answer).stream
        except ProtocolError as exc:
            log.warning("worker: server %d's HELLO answer is malformed, using ZeroMQ: %s", server, exc)
            return
        if not port:
            return
        try:
            requests, overtaking = self._streams(server, port, timeout)
        except (OSError, OperationTimeoutError, KVStoreError) as exc:
            log.warning("worker: server %d's data port %d is unusable, using ZeroMQ: %s", server, port, exc)
            return
        with self._send_lock:
            self._senders[server] = requests
            self._lanes[server] = overtaking
        self._stream_ports[server] = port

    def _streams(self, server: int, port: int, timeout: float) -> tuple[StreamConnection, StreamConnection]:
        """The two data connections to ``server``: lane 0 for requests in order, lane 1 for pulls that overtake.

        Raises:
            as :meth:`_stream`.
        """
        requests = self._stream(server, port, 0, timeout)
        try:
            return requests, self._stream(server, port, 1, timeout)
        except BaseException:
            self._close_stream(requests)
            raise

    def _stream(self, server: int, port: int, lane: int, timeout: float) -> StreamConnection:
        """A data connection to ``server`` that its HELLO opened (polled by the reactor).

        Raises:
            OSError: no connection.
            OperationTimeoutError, RemoteError, NodeFailedError: no answer to the HELLO, or a refusal.
        """
        assert self.info is not None
        address = self.membership.info.servers[server] if self.membership.info else self.info.servers[server]
        host = address.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
        conn = StreamConnection.connect(host, port, tag_of(self._tx, lane),
                                        f"worker data connection to server {server} (lane {lane})",
                                        min(timeout, 10.0), self._reactor.bounds, on_pending=self._reactor.wake)
        adopted = threading.Event()

        def adopt() -> None:
            self._reactor.adopt_stream(conn, self._on_reply, partial(self._stream_lost, server, conn))
            adopted.set()
        try:
            self._reactor.call_soon(adopt)
            if not adopted.wait(timeout):
                raise OperationTimeoutError(f"the worker's reactor took no data connection to server {server}")
            hello = self.tracker.new(node_id(Role.SERVER, server), "hello", timeout=timeout)
            conn.send(encode(Header(Command.HELLO, hello.request, self.info.node_id,
                                    body=Hello("", self.info.token).encode())))
            hello.wait(timeout)
        except BaseException:
            self._close_stream(conn)
            raise
        return conn

    def _close_stream(self, conn: StreamConnection) -> None:
        try:
            self._reactor.call_soon(partial(self._reactor.close_connection, conn))
        except TransportError:  # the reactor stopped: it closed everything
            conn.close()

    def _stream_lost(self, server: int, conn: StreamConnection) -> None:
        """Reactor callback: a data connection to ``server`` failed. Both are opened again (another thread)."""
        lanes = (self._senders[server], self._lanes.get(server))
        if conn not in lanes or self._reactor.stopped:
            return  # replaced already (a replacement server, or the other lane failed first), or closing
        log.warning("worker: data connection to server %d lost; opening it again", server)
        with self._send_lock:
            self._lanes.pop(server, None)
        for other in lanes:
            if other is not conn and isinstance(other, StreamConnection):
                self._reactor.close_connection(other)  # its requests are sent again with the others
        with self._queue_lock:
            self._paused[server] += 1  # requests wait in the queue until it is back
        threading.Thread(target=self._restream, args=(server, lanes[0]), daemon=True,
                         name=f"pskv-worker-restream-{server}").start()

    def _restream(self, server: int, lost: StreamConnection) -> None:
        """Open the data connection to ``server`` again, then send every unanswered request again.

        Tries every :data:`RESTREAM_INTERVAL` s while the server lives; requests fail
        meanwhile only by their own timeouts or the server's death (NodeFailedError).
        """
        node, epoch = node_id(Role.SERVER, server), self._epoch[server]
        try:  # until it is back, the worker closes, the server is dead or replaced (reconnect takes over)
            while not self._reactor.stopped and node not in self.membership.dead() and self._epoch[server] == epoch:
                try:
                    requests, overtaking = self._streams(server, self._stream_ports[server], 5.0)
                except (OSError, KVStoreError) as exc:
                    log.info("worker: data connection to server %d not back yet: %s", server, exc)
                    time.sleep(RESTREAM_INTERVAL)
                    continue
                with self._send_lock:
                    if self._senders[server] is not lost and self._lanes.get(server) is not lost:  # replaced
                        self._close_stream(requests)
                        self._close_stream(overtaking)
                        return
                    self._senders[server] = requests
                    self._lanes[server] = overtaking
                log.warning("worker: data connection to server %d is back", server)
                self._resend_outstanding(server)
                return
        finally:
            with self._queue_lock:
                self._resume(server)
            self._flush()

    def rejoin(self, num_servers: int, timeout: float) -> None:
        """A replacement process: ``REJOIN`` every server; :attr:`landed` gets their counts of this rank's pushes.

        Raises:
            OperationTimeoutError, RemoteError, NodeFailedError: a server did not answer.
            ProtocolError: an answer is malformed.
        """
        body = Rejoin(self.info.token if self.info is not None else "").encode()
        pendings = [self.request(s, Command.REJOIN, what="rejoin", timeout=timeout, body=body)
                    for s in range(num_servers)]
        for pending in pendings:
            for key, offset, count in Rejoined.parse(pending.wait(timeout)).counts:
                self.landed[(key, offset)] = count

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
        self._senders = list(channels)
        self._servers = [None] * len(self._senders)
        self._sent = [itertools.count(1) for _ in self._senders]
        self._epoch = [0] * len(self._senders)
        self._hello_all(info, self._cluster.startup_timeout)

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
        """How requests reach each server, by rank: ``"local"`` (a Unix socket: the server is on
        this host), ``"tcp"`` (a data connection), ``"zmq"``, or ``"in-process"`` (tests)."""
        kinds = {LocalConnection: "local", StreamConnection: "tcp", Sender: "zmq"}
        return [kinds.get(type(c), "in-process") for c in self._senders]

    def _local_path(self, server: int, info: NodeInfo) -> str | None:
        """The local socket of ``server`` if it runs on this host (and shared memory is on)."""
        shm = info.server_shm[server] if server < len(info.server_shm) else None
        if not self._cluster.uses_shm or not shm or shm.get("host") != host_id():
            return None
        return local_path(shm["dir"])

    def _connect(self, server: int, address: str, path: str | None) -> Sender | LocalConnection:
        """The request channel to ``server`` (on the reactor thread): its local socket, else ZeroMQ.

        Over ZeroMQ, requests leave on a send-only socket and replies arrive on a polled
        DEALER (``self._servers``; None for local connections, which carry both ways).
        """
        if path is not None:
            try:
                conn = self._reactor.connect_local(path, self._on_reply, self._cluster.request_timeout)
                self._servers.append(None)
                return conn
            except OSError as exc:  # e.g. another mount namespace: ZeroMQ then
                log.info("worker: server %d's local socket %s is unusable, using %s: %s", server, path, address, exc)
        sid = self._reactor.connect_dealer(address, self._on_reply, identity=RX_PREFIX + self._tx.encode())
        self._servers.append(sid)
        sender = self._reactor.connect_sender(address, TX_PREFIX + self._tx.encode())
        self._watch(server, sid, sender)
        return sender

    # -- reset connections -------------------------------------------------------------------
    def _watch(self, server: int, sid: int, sender: Sender) -> None:
        """Resend what a reset connection to ``server`` may have lost, once both sockets are back.

        ZeroMQ reconnects a reset TCP connection by itself (same routing identities, so the
        server's routes stay valid), but messages in flight in the dead connection are
        gone. When the reply socket and the request socket are both connected again, every
        request still waiting for its answer (unconfirmed quiet pushes included) is sent
        again under its request id; the server answers a repeat without applying it twice.
        """
        down: set[str] = set()
        state = {"was_down": False}

        def on_change(which: str, up: bool) -> None:
            if not up:
                if not down:
                    log.warning("worker: connection to server %d lost; waiting for ZeroMQ to reconnect", server)
                down.add(which)
                state["was_down"] = True
                return
            down.discard(which)
            if not down and state["was_down"]:
                state["was_down"] = False
                self._resend_outstanding(server)

        self._reactor.watch_connection(sid, lambda up: on_change("rx", up))
        self._reactor.watch_connection(sender, lambda up: on_change("tx", up))

    def _resend_outstanding(self, server: int) -> None:
        node = node_id(Role.SERVER, server)
        waiting = [(p, p.frames) for p in self.tracker.outstanding_to(node) if p.frames is not None and p.sent is not None]
        log.warning("worker: reconnected to server %d; sending %d unanswered request(s) again", server, len(waiting))
        self._queue_first(server, waiting)
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

    # -- server replacement (PSKV_SERVER_RECOVERY) ------------------------------------------
    def _on_servers_replaced(self, ranks: list[int]) -> None:
        """Membership callback (reactor thread): the owner reconnects and replays, off this thread."""
        if self._on_server_replaced is None:
            return
        for rank in ranks:
            log.warning("worker: server %d was replaced; reconnecting to %s", rank,
                        self.membership.info.servers[rank] if self.membership.info else "?")
            threading.Thread(target=self._on_server_replaced, args=(rank,), daemon=True,
                             name=f"pskv-worker-recover-{rank}").start()

    def reconnect(self, server: int, timeout: float,
                  replay: Callable[[int], list[tuple[WorkerRequest, list[Any]]]]) -> None:
        """Switch to the replacement of server ``server`` (its address from the membership).

        Requests to it wait meanwhile. After the new process answered HELLO, ``replay(epoch)``
        gives the messages to send it first, in order — each ``(pending, frames)``, the
        pending completed by the reply — typically every push since the checkpoint it
        loaded (those sent to an older incarnation: ``pending.epoch < epoch``), then the
        outstanding pulls; then the waiting requests go out.

        Raises:
            OperationTimeoutError: no connection or no HELLO answer within ``timeout``.
        """
        info = self.membership.info
        assert info is not None and self.info is not None
        address = info.servers[server]
        swapped = threading.Event()
        with self._queue_lock:
            self._paused[server] += 1

        def swap() -> None:
            old_sid, old_sender = self._servers[server], self._senders[server]
            sid = self._reactor.connect_dealer(address, self._on_reply, identity=RX_PREFIX + self._tx.encode())
            sender = self._reactor.connect_sender(address, TX_PREFIX + self._tx.encode())
            with self._send_lock:
                self._servers[server] = sid
                self._senders[server] = sender
                old_lane = self._lanes.pop(server, None)
                self._sent[server] = itertools.count(1)
                self._epoch[server] += 1
            self.quiet.forget(node_id(Role.SERVER, server))  # they are sent again, answered
            if old_sid is not None:
                self._reactor.close_dealer(old_sid)
            if isinstance(old_sender, Sender):
                self._reactor.unwatch(old_sender)
            if old_lane is not None:
                self._reactor.close_connection(old_lane)
            if isinstance(old_sender, (StreamConnection, LocalConnection)):
                self._reactor.close_connection(old_sender)  # not polled any more, not opened again
            else:
                old_sender.close()
            self._watch(server, sid, sender)
            swapped.set()

        try:
            self._reactor.call_soon(swap)
            if not swapped.wait(timeout):
                raise OperationTimeoutError(f"could not reconnect to server {server} within {timeout} s")
            self.info = info
            hello = self.tracker.new(node_id(Role.SERVER, server), "hello", timeout=timeout)
            frames = encode(Header(Command.HELLO, hello.request, info.node_id,
                                   body=Hello(self._tx, self.info.token).encode()))
            sid = self._servers[server]
            assert sid is not None
            self._reactor.call_soon(partial(self._reactor.send_dealer, sid, frames))
            self._open_stream(server, hello.wait(timeout), timeout)
            with self._send_lock:  # nothing goes to this server while the replay is queued
                messages = replay(self._epoch[server])
                for pending, _ in messages:
                    pending.quiet = False  # answered now: its old confirmation queue is gone
                self._queue_first(server, messages)
        finally:
            with self._queue_lock:
                self._resume(server)
            self._flush()

    def _resume(self, server: int) -> None:
        """One reason to hold ``server``'s requests is over (the queue lock is held)."""
        self._paused[server] -= 1
        if self._paused[server] <= 0:
            del self._paused[server]

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
        pending = self.tracker.new(node_id(Role.SERVER, server), what or command.name.lower(),
                                   timeout=None if quiet else timeout)
        pending.quiet = quiet
        pending.local = self if self._local_conn(server) is not None else None
        if quiet:
            flags |= Flag.QUIET
        frames = encode(Header(command, pending.request, self.node_id, arrays, priority, body, flags), data or [])
        pending.frames = frames  # sent again after a reset connection, or to a replacement server
        if overtake and not quiet and self._overtake(server, frames, pending):
            return pending
        self._queue_and_send(-priority, server, frames, pending)
        return pending

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
            lane = self._lanes.get(server)
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

    def _sync(self, node: int, timeout: float | None, on_done: Callable[[Pending], None]) -> WorkerRequest:
        """Queue a ``SYNC`` to server ``node`` after everything queued now (for :class:`QuietPushes`)."""
        _, server = node_role_rank(node)
        sync = self.tracker.new(node, "sync", timeout=timeout)
        sync.local = self if self._local_conn(server) is not None else None
        sync.add_done_callback(on_done)
        frames = encode(Header(Command.SYNC, sync.request, self.node_id))
        self._queue_and_send(math.inf, server, frames, sync)  # after everything queued
        sync.background()  # completes callbacks: its reply must be read without a waiter
        return sync

    # -- replies read by the waiting thread (local connections) -----------------------------
    def _local_conn(self, server: int) -> LocalConnection | StreamConnection | None:
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
        for conn in (self._local_conn(server), self._lanes.get(server)):
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

