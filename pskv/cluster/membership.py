"""The node side of the scheduler protocol: register, heartbeats, barriers, shutdown.

Servers and workers each own one :class:`Membership`. Its heartbeat timer runs on the
node's reactor thread; every reply tells which nodes the scheduler considers dead and
how long ago each node was last heard from. Deaths are reported to the owner through
``on_dead`` (so it can fail requests waiting on that node), and a scheduler that stops
answering for longer than the heartbeat timeout is itself reported dead.

In an elastic job (:mod:`pskv.cluster.elastic`) a node also learns the membership views: the one
it was admitted in (:attr:`NodeInfo.view`), newer ones from heartbeat replies (``on_view``) and a
commit's release (:attr:`Met.view`). It stamps the epoch of the view it adopted (:meth:`Membership.adopt`)
on every request to the scheduler, so the scheduler stops sending it that view, and in its meetings.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import zmq

from pskv.cluster.attention import Attention
from pskv.cluster.requests import Pending, RequestTracker
from pskv.config import ClusterConfig
from pskv.errors import (
    CollectiveMismatchError,
    InitMismatchError,
    MembershipChangedError,
    OperationTimeoutError,
    ProtocolError,
    RemoteError,
)
from pskv.protocol import SCHEDULER_ID, Command, Role, decode, node_id, node_name, node_role_rank
from pskv.protocol.bodies import (
    MAX_AGREE,
    MAX_ITEM,
    Barrier,
    Counters,
    ErrorReply,
    Failure,
    Heartbeat,
    Liveness,
    Met,
    NodeTable,
    Register,
    ShmInfo,
    Shutdown,
    View,
)
from pskv.protocol.replies import request_frames
from pskv.transport import Reactor

__all__ = ["Membership", "NodeInfo", "METRICS_EVERY"]

log = logging.getLogger("pskv.membership")

METRICS_EVERY = 0.5  # seconds between two heartbeats that carry the node's metrics (at most)


@dataclass(frozen=True)
class NodeInfo:
    """What registration tells a node about itself and the cluster."""

    node_id: int
    rank: int
    servers: tuple[str, ...]
    num_servers: int
    num_workers: int
    server_shm: tuple[dict[str, str] | None, ...] = ()  # per server: shared-memory dir and host id
    recovery: bool = False  # this process replaces a dead worker of a running job (is_recovery)
    secret: str = field(default="", repr=False)  # a server's: the job's secret (hex), to check workers' tokens
    token: str = field(default="", repr=False)  # a worker's: its proof of identity, opening each server connection
    view: View | None = None  # an elastic job's view the node was admitted in (its rank: view.rank_of(slot))


class Membership:
    """Registers a node with the scheduler and keeps it informed of the cluster.

    Args:
        cluster: the cluster contract.
        reactor: the node's reactor (not yet started, or running).
        tracker: the node's request tracker (shared with its data requests).
        role: this node's role.
        address: the address this node serves on (servers), else "".
        on_dead: called on the reactor thread with each node id found dead.
        on_alive: called on the reactor thread with each node id that was dead and is
            no longer (a worker replaced under ``PSKV_RECOVERY_TIMEOUT``).
        on_servers: called on the reactor thread with the ranks of servers that were
            replaced (``PSKV_SERVER_RECOVERY``); :attr:`info` has their new addresses.
        on_left: called on the reactor thread with each worker's node id that left the
            job (closed its store or ended its process: not dead). A server asks at
            least every 0.2 s, so that a round waiting for such a worker fails within a
            fraction of a second.
        metrics: called on the reactor thread for this node's metrics
            (:mod:`pskv.metrics`), sent with a heartbeat at most every :data:`METRICS_EVERY`
            seconds (the scheduler answers ``pskv top`` with them).
        mismatch: a server's: called on the reactor thread before each heartbeat for a
            workers' meeting that cannot complete and why (:mod:`pskv.server.steps`), sent
            with the heartbeats until one is answered (the scheduler fails the meeting).
        on_view: an elastic job's: called on the reactor thread with each view newer than any this
            node knew, from a heartbeat reply (a commit's view may come here too, before or after the
            release that carries it); the node adopts it with :meth:`adopt` when it is ready.
    """

    def __init__(self, cluster: ClusterConfig, reactor: Reactor, tracker: RequestTracker, role: Role,
                 address: str = "", on_dead: Callable[[int], None] | None = None,
                 shm: dict[str, str] | None = None, on_alive: Callable[[int], None] | None = None,
                 on_servers: Callable[[list[int]], None] | None = None,
                 on_left: Callable[[int], None] | None = None,
                 metrics: Callable[[], Counters] | None = None,
                 mismatch: Callable[[], tuple[int, str] | None] | None = None,
                 on_view: Callable[[View], None] | None = None) -> None:
        self._cluster = cluster
        self._on_view = on_view
        self.view: View | None = None  # the newest view this node knows (elastic jobs)
        self._epoch = 0  # the epoch of the view it adopted: on its requests and in its meetings
        self._metrics = metrics
        self._mismatch = mismatch
        self._unsent: tuple[int, str] | None = None  # a mismatch report not yet answered
        self._carried: tuple[int, str] | None = None  # the one the heartbeat in flight carries
        self._metrics_sent = 0.0  # monotonic time the last heartbeat with metrics left
        self._reactor = reactor
        self._tracker = tracker
        self._role = role
        self._address = address
        self._shm = shm
        self._on_dead = on_dead
        self._on_alive = on_alive
        self._on_servers = on_servers
        self._on_left = on_left
        self._left: set[int] = set()  # workers that left the job (SHUTDOWN), as the scheduler said
        self._servers_version = 0
        self._dead_since: dict[int, float] = {}  # replaceable dead nodes whose requests still wait
        # a fixed routing identity: after a reset connection ZeroMQ reconnects under it, and
        # the scheduler's table (identity -> node) stays valid
        self._sid = reactor.connect_dealer(cluster.scheduler_address, self._on_reply,
                                           identity=b"pskv-node-" + os.urandom(8).hex().encode())
        self._link_down = False
        reactor.watch_connection(self._sid, self._on_link)
        self.info: NodeInfo | None = None
        self._dead: set[int] = set()
        self._ages: dict[int, float] = {}
        self._ages_at = time.monotonic()
        self._last_reply = time.monotonic()
        self._heartbeat_in_flight = False
        self._meetings = 0  # this node's meetings (barriers), counted: the scheduler compares the counts
        self._calls: dict[str, int] = {}  # name -> posts / reads since the last meeting (calls rank 0 may make alone)

    # -- plumbing -----------------------------------------------------------------------
    @property
    def node_id(self) -> int:
        """This node's id (0 before registration)."""
        return self.info.node_id if self.info else 0

    def _on_reply(self, frames: list[zmq.Frame]) -> None:
        try:
            header, buffers = decode(frames)
        except ProtocolError as exc:
            log.error("%s: malformed message from the scheduler dropped: %s", self._role.name.lower(), exc)
            return
        self._last_reply = time.monotonic()
        self._tracker.complete(header, buffers)

    def _request(self, command: Command, body: str, what: str,
                 callback: Callable[[Pending], None] | None = None, timeout: float | None = None) -> Pending:
        pending = self._tracker.new(SCHEDULER_ID, what, callback, timeout=timeout)
        frames = request_frames(command, pending.request, self.node_id, body, self._epoch)
        pending.frames = frames  # sent again if the connection is reset before the answer
        if self._reactor.on_reactor_thread():
            self._reactor.send_dealer(self._sid, frames)
        else:
            self._reactor.call_soon(lambda: self._reactor.send_dealer(self._sid, frames))
        return pending

    def _on_link(self, up: bool) -> None:
        """Reactor thread: the connection to the scheduler went down, or came back.

        Back after a reset: the requests still unanswered (a barrier, a shutdown) may have
        been lost with it, so they go out again (the scheduler answers repeats once).
        """
        if not up:
            self._link_down = True
            return
        if not self._link_down:
            return
        self._link_down = False
        for p in self._tracker.outstanding_to(SCHEDULER_ID):
            if p.frames is not None and p.what != "heartbeat":
                self._reactor.send_dealer(self._sid, p.frames)

    # -- registration -------------------------------------------------------------------
    def register(self, rank: int = -1) -> NodeInfo:
        """Register and wait until the whole cluster has (``startup_timeout``).

        Raises:
            OperationTimeoutError: the cluster did not assemble in time.
            RemoteError: the scheduler refused (cluster full, wrong sizes).
        """
        role = "server" if self._role is Role.SERVER else "worker"
        shm = ShmInfo(self._shm["dir"], self._shm["host"]) if self._shm is not None else None
        pending = self._request(Command.REGISTER, Register(role, self._address, rank, shm).encode(), "registration")
        try:
            reply = pending.wait(self._cluster.startup_timeout)
        except TimeoutError:
            raise OperationTimeoutError(
                f"{role} could not join the cluster within {self._cluster.startup_timeout} s: the scheduler at "
                f"{self._cluster.scheduler_address} did not answer or not all "
                f"{self._cluster.num_servers + self._cluster.num_workers} nodes registered"
            ) from None
        self.info = _node_info(NodeTable.parse(reply))
        if self.info.view is not None:  # an elastic job's: admitted in it
            self.view = self.info.view
            self._epoch = self.info.view.epoch
        self._last_reply = time.monotonic()
        if self._cluster.heartbeat_interval > 0:
            interval = self._cluster.heartbeat_interval
            if self._cluster.server_recovery and self._role is Role.WORKER:
                # a replacement server's address comes with a heartbeat reply: ask 5x as
                # often, so the workers find it within a fifth of an interval
                interval = max(0.05, interval / 5)
            if self._role is Role.SERVER:  # learn of departures soon (a round may wait for one)
                interval = max(0.05, min(interval, 0.2))
            self._attention = Attention(interval)
            self._reactor.call_soon(lambda: self._reactor.add_timer(interval, self._beat))
        return self.info

    def report_failure(self, rank: int, exc: BaseException, timeout: float = 2.0) -> None:
        """This node could not start and is exiting: tell the scheduler why (``exc``), so that the
        nodes waiting to register learn it now, not at ``startup_timeout``. Best effort: waits at
        most ``timeout`` s for the scheduler to take it, and never raises (the node exits with
        ``exc`` anyway). The reactor must be running."""
        role = "server" if self._role is Role.SERVER else "worker"
        body = Register(role, self._address, rank, failed=Failure.of(exc)).encode()
        try:
            self._request(Command.REGISTER, body, "startup failure report").wait(timeout)
        except Exception as err:  # noqa: BLE001 - the scheduler is gone or refused: nothing more to do
            log.info("%s: could not tell the scheduler why it did not start: %s", role, err)

    # -- views (elastic jobs) ------------------------------------------------------------
    def adopt(self, view: View) -> None:
        """This node now works in ``view`` (any thread): its epoch goes on its requests and meetings, and
        meetings are counted anew (they are per view)."""
        self._take_view(view, notify=False)
        self._epoch = view.epoch
        self._meetings = 0
        self._calls.clear()

    def ask_view(self) -> None:
        """Ask the scheduler for the current view now (any thread): a node that met a newer epoch than its
        view (a worker that heard of it first). A heartbeat goes at once; a newer view in its reply is
        delivered to ``on_view``, on the reactor thread."""
        if not self._reactor.on_reactor_thread():
            self._reactor.call_soon(self.ask_view)
            return
        if SCHEDULER_ID in self._dead:
            return
        try:
            self._request(Command.HEARTBEAT, "", "heartbeat", self._on_view_reply,
                          timeout=max(2 * self._cluster.heartbeat_interval, 0.5))
        except Exception:  # noqa: BLE001 - tracker closed: the node is shutting down
            pass

    def _on_view_reply(self, pending: Pending) -> None:
        if pending.error is None and pending.header is not None:
            try:
                self._take_view(Liveness.parse(pending.header).view, notify=True)
            except ProtocolError as exc:
                log.error("%s: malformed heartbeat reply from the scheduler: %s", self._role.name.lower(), exc)

    def _take_view(self, view: View | None, notify: bool) -> None:
        if view is None or (self.view is not None and view.epoch <= self.view.epoch):
            return
        self.view = view
        if notify and self._on_view is not None:
            self._on_view(view)

    # -- heartbeats ---------------------------------------------------------------------
    def _beat(self) -> None:
        limit = time.monotonic() - self._cluster.recovery_timeout
        for nid in [n for n, since in self._dead_since.items() if since < limit]:
            del self._dead_since[nid]  # not replaced in time: its requests fail now
            self._tracker.fail_node(nid, f"dead and not replaced within {self._cluster.recovery_timeout:g} s")
        # (not while this node's own loop was held up: the scheduler's replies wait unread)
        if (not self._attention.held_up() and time.monotonic() - self._last_reply > self._cluster.heartbeat_timeout
                and SCHEDULER_ID not in self._dead):
            self._mark_dead(SCHEDULER_ID, f"no answer for {self._cluster.heartbeat_timeout:.1f} s")
        if self._heartbeat_in_flight or SCHEDULER_ID in self._dead:
            return
        self._heartbeat_in_flight = True
        try:
            # a heartbeat lost in a reset connection times out, and the next one goes out
            # (a worker's client expires requests on its own, more often)
            if self._role is not Role.WORKER:
                self._tracker.expire()
            self._request(Command.HEARTBEAT, self._heartbeat_body(), "heartbeat", self._on_heartbeat,
                          timeout=max(2 * self._cluster.heartbeat_interval, 0.5))
        except Exception:  # noqa: BLE001 - tracker closed: the node is shutting down
            self._heartbeat_in_flight = False

    def report_now(self, done: Callable[[], None]) -> None:
        """A server's mismatch report is due: it goes now, in a heartbeat of its own (not at the next tick,
        nor after one in flight); ``done()`` is called once the scheduler has it (or it could not be sent),
        on the reactor thread. The server fails the round only then, so the meeting fails with the report's
        text before the worker ahead can raise and leave (which would fail it as a departure)."""
        if not self._reactor.on_reactor_thread():
            self._reactor.call_soon(lambda: self.report_now(done))
            return
        if self._unsent is None and self._mismatch is not None:
            self._unsent = self._mismatch()
        if self._unsent is None or SCHEDULER_ID in self._dead:
            done()
            return
        try:
            self._request(Command.HEARTBEAT, Heartbeat(None, self._unsent).encode(), "heartbeat",
                          partial(self._on_report, done), timeout=max(2 * self._cluster.heartbeat_interval, 0.5))
        except Exception:  # noqa: BLE001 - tracker closed: the node is shutting down
            done()

    def _on_report(self, done: Callable[[], None], pending: Pending) -> None:
        if pending.error is None:
            self._unsent = None  # the scheduler has it
        done()

    def _heartbeat_body(self) -> str:
        """This node's metrics, if it has some and sent none in the last :data:`METRICS_EVERY` s; a
        server's mismatch report, until a heartbeat that carried it is answered."""
        if self._unsent is None and self._mismatch is not None:
            self._unsent = self._mismatch()
        self._carried = self._unsent  # answered: the scheduler has it
        now = time.monotonic()
        if self._metrics is None or now - self._metrics_sent < METRICS_EVERY:
            return "" if self._unsent is None else Heartbeat(None, self._unsent).encode()
        self._metrics_sent = now
        return Heartbeat(self._metrics(), self._unsent).encode()

    def _on_heartbeat(self, pending: Pending) -> None:
        self._heartbeat_in_flight = False
        if pending.error is not None or pending.header is None:
            return
        if self._unsent is self._carried:
            self._unsent = None  # the scheduler has it
        try:
            body = Liveness.parse(pending.header)
        except ProtocolError as exc:
            log.error("%s: malformed heartbeat reply from the scheduler: %s", self._role.name.lower(), exc)
            return
        self._ages = dict(body.ages)
        self._ages_at = time.monotonic()
        self._take_view(body.view, notify=True)
        version = body.servers_version
        if version > self._servers_version and self.info is not None:
            self._servers_version = version
            servers = body.servers
            shm = _shm_dicts(body.server_shm)
            changed = [r for r, a in enumerate(servers) if r < len(self.info.servers) and a != self.info.servers[r]]
            self.info = replace(self.info, servers=servers, server_shm=shm)
            for r in changed:
                self._revive(node_id(Role.SERVER, r))
            if changed and self._on_servers is not None:
                self._on_servers(changed)
        for nid in sorted(set(body.left) - self._left):
            self._left.add(nid)
            if self._on_left is not None:
                self._on_left(nid)
        dead = set(body.dead)
        for nid in dead - self._dead:
            self._mark_dead(nid, "it exited or missed heartbeats: a departure from the elastic job"
                            if self._cluster.elastic and node_role_rank(nid)[0] is Role.WORKER
                            else "the scheduler lost its heartbeats")
        for nid in self._dead - dead - {SCHEDULER_ID}:  # replaced (a recovered worker)
            self._revive(nid)

    def _revive(self, nid: int) -> None:
        """``nid`` was dead and a replacement process took over."""
        self._dead_since.pop(nid, None)
        if nid not in self._dead:
            return
        self._dead.discard(nid)
        self._tracker.revive_node(nid)
        log.warning("%s: %s is back (a replacement process)", self._role.name.lower(), node_name(nid))
        if self._on_alive is not None:
            self._on_alive(nid)

    def _replaceable(self, nid: int) -> bool:
        role, _ = node_role_rank(nid)
        return self._cluster.recovery_timeout > 0 and (
            role is Role.WORKER or (role is Role.SERVER and bool(self._cluster.server_recovery)))

    def _mark_dead(self, nid: int, detail: str) -> None:
        self._dead.add(nid)
        departure = self._cluster.elastic and node_role_rank(nid)[0] is Role.WORKER  # the job goes on without it
        log.log(logging.WARNING if departure else logging.ERROR, "%s: %s is dead (%s)", self._role.name.lower(),
                node_name(nid), detail)
        if self._replaceable(nid):  # its requests wait for a replacement (or the recovery timeout)
            self._dead_since[nid] = time.monotonic()
        else:
            self._tracker.fail_node(nid, detail)
        if self._on_dead is not None:
            self._on_dead(nid)

    def dead(self) -> set[int]:
        """Node ids known to be dead."""
        return set(self._dead)

    def num_dead_node(self, group: int, timeout: float) -> int:
        """Nodes of ``group`` (1 scheduler, 2 servers, 4 workers, sums) silent for > ``timeout`` s."""
        count = 0
        now = time.monotonic()
        if group & Role.SCHEDULER and (SCHEDULER_ID in self._dead or now - self._last_reply > timeout):
            count += 1
        elapsed = now - self._ages_at
        for nid, age in self._ages.items():
            role, _ = node_role_rank(nid)
            if role is not Role.SCHEDULER and int(role) & group and (nid in self._dead or age + elapsed > timeout):
                count += 1
        return count

    # -- barrier / shutdown -------------------------------------------------------------
    def barrier(self, group: int, timeout: float, name: str = "", *, failure: Failure | None = None,
                result: str = "", agree: Sequence[tuple[str, str]] = (), mode: str = "",
                before: Callable[[int], None] | None = None) -> Met:
        """Wait until every member of ``group`` reached the barrier; the meeting's answer.

        ``name`` names the collective (:class:`~pskv.protocol.bodies.Barrier`): the
        meetings are counted, and a meeting whose members are in different collectives
        fails on all of them. ``failure`` (this node's), ``result`` (rank 0's) and ``agree``
        (items every member must have alike) travel with it; ``mode`` ``"post"`` / ``"read"``
        posts or reads rank 0's outcome of its n-th call of ``name`` instead of meeting.
        The scheduler answers before ``timeout`` ends, naming who did not arrive. ``before``
        is called with the meeting's count just before a counted meeting is asked for (a
        worker marks it on every server: :mod:`pskv.server.steps`).

        Raises:
            NodeFailedError: a member died (names it).
            CollectiveMismatchError: the members are in different collectives (names each one's).
            InitMismatchError: the members' ``agree`` items differ (names the first that does).
            OperationTimeoutError: not complete within ``timeout`` (names who did not arrive).
        """
        seq = nth = 0
        if name and mode:  # rank 0's n-th call of name since its last meeting matches another's n-th
            nth = self._calls[name] = self._calls.get(name, 0) + 1
            seq = self._meetings
        elif name and not (self.info is not None and self.info.recovery):  # a replacement's count is not the job's
            self._meetings += 1
            seq = self._meetings
            self._calls.clear()
            if before is not None:
                before(seq)
        digest = hashlib.sha256(json.dumps(list(agree)).encode()).hexdigest() if agree else ""
        items = tuple((k[:MAX_ITEM], v[:MAX_ITEM]) for k, v in agree[:MAX_AGREE])
        body = Barrier(group, name, seq, float(timeout), failure, result, items, digest, mode, nth, self._epoch)
        pending = self._request(Command.BARRIER, body.encode(), f"{name or 'barrier'} (group {group})")
        try:
            header = pending.wait(timeout + min(5.0, max(1.0, timeout / 20)), stated=timeout)  # the scheduler's answer comes first
        except RemoteError as exc:
            kind = _MEETING_ERRORS.get(exc.remote_type)
            if kind is None or pending.header is None:
                raise
            raise kind(ErrorReply.parse(pending.header).message) from None
        met = Met.parse(header)
        self._take_view(met.view, notify=False)  # a commit's release: the caller adopts it
        return met

    def shutdown(self, wait: bool, timeout: float | None) -> None:
        """Tell the scheduler this node is done; with ``wait``, block until the job ends."""
        self._request(Command.SHUTDOWN, Shutdown(wait).encode(), "shutdown").wait(timeout)


_MEETING_ERRORS: dict[str, type[Exception]] = {
    "CollectiveMismatchError": CollectiveMismatchError,
    "InitMismatchError": InitMismatchError,
    "MembershipChangedError": MembershipChangedError,
    "OperationTimeoutError": OperationTimeoutError,
}


def _node_info(table: NodeTable) -> NodeInfo:
    """What a registration reply tells a node."""
    return NodeInfo(table.node_id, table.rank, table.servers, table.num_servers, table.num_workers,
                    _shm_dicts(table.server_shm), table.recovery, table.secret, table.token, table.view)


def _shm_dicts(shm: tuple[ShmInfo | None, ...]) -> tuple[dict[str, str] | None, ...]:
    """NodeInfo's form of the servers' shared-memory places (``{"dir", "host"}`` dicts)."""
    return tuple(None if s is None else s._asdict() for s in shm)
