"""The scheduler: rendezvous, rank assignment, barriers, liveness and orderly shutdown.

It carries no array data. Every node connects to it and:

1. sends ``REGISTER`` (role, the address it serves on); once all ``S + W`` nodes have
   registered, each gets its rank, node id and the servers' addresses;
2. sends ``HEARTBEAT`` every interval; the reply lists the nodes the scheduler considers
   dead (silent for longer than the heartbeat timeout), so every survivor learns of a
   death within about one timeout;
3. sends ``BARRIER`` (group mask) — answered when every live member arrived, or with an
   error naming the dead members (the meetings: :mod:`pskv.cluster.meetings`);
4. at the end: workers send ``SHUTDOWN``; servers send ``SHUTDOWN`` with ``wait`` and
   are answered once every worker is done. Then the scheduler's :meth:`run` returns.

A heartbeat may carry the node's metrics (:mod:`pskv.metrics`), kept by
:class:`~pskv.cluster.rates.MetricsWindow`; anyone who can connect (``pskv top``; under
CURVE, a holder of the job's key) may send ``METRICS`` without registering and gets every
node's state, totals and rates.

In an elastic job (``-n MIN:MAX``) the workers are the current view's (:mod:`pskv.cluster.elastic`):
the scheduler's views object is told of every registration, death, departure and commit, and the
launcher's ``ROSTER`` reports (its token, no registration) of exits and drains.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import zmq

from pskv.cluster.attention import Attention
from pskv.cluster.elastic import views_for
from pskv.cluster.meetings import Meetings
from pskv.cluster.rates import MetricsWindow
from pskv.cluster.runtime import NodeRuntime
from pskv.config import ClusterConfig
from pskv.errors import NodeFailedError, OperationTimeoutError, ProtocolError, TransportError
from pskv.protocol import SCHEDULER_ID, Command, Header, Role, decode, node_id, node_name
from pskv.protocol.bodies import (
    DIGEST_CHARS,
    Barrier,
    Heartbeat,
    Liveness,
    NodeTable,
    Register,
    ShmInfo,
    Shutdown,
    node_token,
)
from pskv.protocol.replies import error_frames, reply_frames
from pskv.transport.security import RefusalLog

__all__ = ["Scheduler"]

log = logging.getLogger("pskv.scheduler")


@dataclass
class _Node:
    identity: bytes
    role: Role
    rank: int
    address: str
    last_seen: float
    dead: bool = False
    shm: ShmInfo | None = None  # a server's shared-memory directory and host id
    dead_since: float = 0.0  # monotonic time it was marked dead
    given_up: bool = False  # dead, and its recovery window (PSKV_RECOVERY_TIMEOUT) has passed


class Scheduler:
    """Runs the scheduler role on a reactor thread.

    Args:
        cluster: the cluster contract (sizes, heartbeat settings, bind address).
        context: ZeroMQ context (a new one by default).
        address: endpoint to bind; default ``tcp://<root_uri>:<root_port>``.
    """

    def __init__(self, cluster: ClusterConfig, context: zmq.Context[Any] | None = None,
                 address: str | None = None) -> None:
        self._cluster = cluster
        self._runtime = NodeRuntime("pskv-scheduler", context, describe=lambda: "the scheduler", cluster=cluster,
                                    on_failure=self._network_failed)
        self._reactor = self._runtime.reactor
        self._by_identity: dict[bytes, int] = {}
        # a peer not registered yet sends one small REGISTER (or a metrics query): bigger messages are dropped
        self._sid, self.address = self._reactor.bind_router(address or cluster.scheduler_address, self._on_message,
                                                            self._by_identity.__contains__)
        self._pending: list[tuple[bytes, Header, Register]] = []  # registrations before all arrived
        # the job's secret: servers get it, each worker HMAC(secret, its id), which proves its id to them
        self._secret = os.urandom(DIGEST_CHARS // 2).hex()
        self._nodes: dict[int, _Node] = {}
        self._refusals = RefusalLog(log)  # messages refused for their sender, logged at most every 10 s per peer
        self._done_workers: set[int] = set()  # workers that left the job (SHUTDOWN)
        self._waiting: dict[int, tuple[bytes, Header]] = {}  # SHUTDOWN with wait, answered when every worker left
        self._told: set[int] = set()  # nodes whose SHUTDOWN wait was answered
        self._born = time.monotonic()
        self._failure: Exception | None = None  # why the job ended badly (startup timeout)
        self._not_started: tuple[str, str] | None = None  # a node that could not start: its name, why
        self._told_why: set[bytes] = set()  # connections told of it (the job ends once all were)
        self._finished = threading.Event()
        self._servers_version = 0  # counts server replacements (heartbeat replies carry the table)
        self._rates = MetricsWindow(cluster.num_workers, cluster.num_servers)  # nodes' reported metrics (pskv top)
        self._views = views_for(cluster, self._send, self._admit)  # an elastic job's views; else no-ops
        self._meetings = Meetings(self._send, lambda nid: self._nodes[nid].role,
                                  lambda nid: self._views.rank(nid, self._nodes[nid].rank),
                                  lambda group: self._views.members(self._members(group)), self._lost,
                                  lambda: self._done_workers, self._views)
        self._reactor.add_timer(0.25, self._meetings.expire)
        if cluster.elastic:
            self._reactor.add_timer(0.25, self._check_views)
        self._reactor.add_timer(min(1.0, max(0.05, cluster.startup_timeout / 4)), self._check_startup)
        if cluster.heartbeat_interval > 0:
            period = max(0.05, cluster.heartbeat_interval / 2)
            self._attention = Attention(period)
            self._reactor.add_timer(period, self._check_liveness)

    # -- life cycle ---------------------------------------------------------------------
    def start(self) -> str:
        """Start serving; returns the bound address."""
        self._reactor.start()
        return self.address

    def run(self, timeout: float | None = None) -> None:
        """Start (if needed) and block until the job ends, then stop.

        Raises:
            OperationTimeoutError: the job did not end within ``timeout`` seconds.
            NodeFailedError: the job failed (a node died, startup, an elastic job below MIN).
            TransportError: the scheduler's network thread failed.
        """
        if not self._reactor.on_reactor_thread() and self._reactor._thread is None:
            self.start()
        try:
            if not self._finished.wait(timeout):
                raise OperationTimeoutError(f"the job did not finish within {timeout} s")
            time.sleep(0.05)  # let the last replies leave
            if self._failure is not None:
                raise self._failure
        finally:
            self.stop()

    def _network_failed(self, error: TransportError) -> None:
        """The network thread failed (a bug, out of file descriptors): the job cannot go on; :meth:`run` raises
        ``error`` now instead of waiting for an end that no thread can bring."""
        log.error("scheduler: %s", error)
        self._failure = error
        self._finished.set()

    def stop(self) -> None:
        """Stop serving and release the sockets (idempotent)."""
        self._runtime.stop()

    @property
    def finished(self) -> bool:
        """True once every worker has shut down and every server was told."""
        return self._finished.is_set()

    # -- dispatch -----------------------------------------------------------------------
    def _on_message(self, identity: bytes, frames: list[zmq.Frame]) -> None:
        try:
            header, _ = decode(frames)
        except ProtocolError as exc:
            log.error("scheduler: rejected a malformed message from %r: %s", identity, exc)
            return
        if self._cluster.verbose >= 2:
            log.info("scheduler: %s", header.command.name)
        try:
            self._dispatch(identity, header)
        except ProtocolError as exc:  # a malformed body: the sender learns why
            self._send(identity, error_frames(header, SCHEDULER_ID, "ProtocolError", str(exc)))

    def _dispatch(self, identity: bytes, header: Header) -> None:
        """Handle one request (bodies parsed here: a malformed one raises ProtocolError)."""
        nid = self._by_identity.get(identity)
        if header.command is Command.METRICS:  # anyone who can connect (pskv top): no registration needed
            view = self._views.current()
            report = self._rates.report(self._states(), len(self._nodes) or len(self._pending), self._num_workers(),
                                        view.epoch if view else 0)
            self._send(identity, reply_frames(header, SCHEDULER_ID, report.encode()))
            return
        if header.command is Command.REGISTER:
            body = Register.parse(header)
            if nid is not None and nid != node_id(Role.SERVER if body.role == "server" else Role.WORKER, body.rank):
                self._refuse_sender(identity, header, nid, f"REGISTER as a {body.role} of rank {body.rank}")
                return
            self._register(identity, header, body)
            return
        if header.command is Command.ROSTER:  # the launcher's (its token, no registration)
            self._roster(identity, header)
            return
        if nid is None:
            self._send(identity, error_frames(header, SCHEDULER_ID, "ProtocolError", "register first"))
            return
        if header.sender != nid:  # a node id is bound to the connection it registered on
            self._refuse_sender(identity, header, nid, f"{header.command.name} claiming node id {header.sender}")
            return
        self._nodes[nid].last_seen = time.monotonic()
        if header.command is Command.HEARTBEAT:
            self._take_metrics(identity, header, nid)
            self._send(identity, reply_frames(header, SCHEDULER_ID, self._liveness(nid, header.epoch).encode()))
        elif header.command is Command.BARRIER:
            self._meetings.arrive(identity, header, nid, Barrier.parse(header))
        elif header.command is Command.SHUTDOWN:
            self._shutdown(identity, header, nid, Shutdown.parse(header).wait)
        else:
            self._send(identity, error_frames(header, SCHEDULER_ID, "ProtocolError",
                                              f"the scheduler does not handle {header.command.name}"))

    def _send(self, identity: bytes, frames: list[Any]) -> None:
        self._reactor.send_router(self._sid, identity, frames)

    def _refuse_sender(self, identity: bytes, header: Header, nid: int, what: str) -> None:
        """Refuse a message that speaks for another node than the one its connection registered as."""
        message = f"{what} from connection {identity!r}, which registered as {node_name(nid)}: refused"
        self._refusals.error(identity, f"scheduler: {message}")
        self._send(identity, error_frames(header, SCHEDULER_ID, "ProtocolError", message))

    # -- metrics --------------------------------------------------------------------------
    def _take_metrics(self, identity: bytes, header: Header, nid: int) -> None:
        """Keep the metrics a heartbeat carries, and act on a server's mismatch report (mismatched
        step counts: the meeting fails); malformed ones are logged and dropped (the heartbeat is
        still answered: liveness does not depend on them)."""
        if not header.body:
            return
        try:
            beat = Heartbeat.parse(header)
        except ProtocolError as exc:
            self._refusals.error(identity, f"scheduler: {node_name(nid)}'s metrics refused: {exc}")
            return
        if beat.metrics is not None:
            self._rates.add(nid, beat.metrics)
        if beat.mismatch is not None and self._nodes[nid].role is Role.SERVER:  # a meeting that cannot complete
            self._meetings.mismatch(*beat.mismatch)

    def _states(self) -> dict[int, tuple[str, float]]:
        """Every registered node's state (alive, dead or left) and seconds since it was heard."""
        now = time.monotonic()
        return {nid: ("left" if nid in self._done_workers else "dead" if node.dead else "alive",
                      round(now - node.last_seen, 3)) for nid, node in self._nodes.items()}

    # -- registration -------------------------------------------------------------------
    def _liveness(self, nid: int, epoch: int) -> Liveness:
        """The heartbeat reply: who is dead, how long since each node was heard, where servers are; in an
        elastic job the view, to a node whose heartbeat carries an older epoch."""
        now = time.monotonic()
        ages = {n: round(now - node.last_seen, 3) for n, node in self._nodes.items()}
        left = tuple(sorted(self._done_workers))
        if not self._servers_version:
            return Liveness(tuple(self._dead_ids()), ages, left=left, view=self._views.view_for(epoch))
        table = self._table(nid)  # a server was replaced: where the servers are now
        return Liveness(tuple(self._dead_ids()), ages, self._servers_version, table.servers, table.server_shm, left,
                        self._views.view_for(epoch))

    def _register(self, identity: bytes, header: Header, body: Register) -> None:
        """A registration before the cluster is complete waits in ``_pending``, bounded: one
        entry per socket (a repeat replaces it) and per role at most the job's count — a
        registration past that is refused alone (a stray or hostile extra node cannot
        make the real ones fail)."""
        role = Role.SERVER if body.role == "server" else Role.WORKER
        if body.failed is not None or (self._not_started is not None and not self._nodes):
            self._fail_startup(identity, header, body)
            return
        if self._views.join(identity, header, body, bool(self._nodes)):  # elastic: admitted at a commit
            self._meetings.settle()  # (or at once below MIN: the held meetings of the old view fail)
            return
        expected = self._cluster.num_servers + self._cluster.num_workers
        if self._nodes and self._cluster.recovery_timeout > 0 and (
                role is Role.WORKER or self._cluster.server_recovery):
            self._rejoin(identity, header, body, role)
            return
        if self._nodes or len(self._pending) >= expected:
            self._send(identity, error_frames(header, SCHEDULER_ID, "ProtocolError",
                                              f"the cluster is already complete ({expected} nodes)"))
            return
        for i, (pending, _, _) in enumerate(self._pending):
            if pending == identity:  # the same socket again (a resend): the later registration counts
                self._pending[i] = (identity, header, body)
                return
        wanted = self._cluster.num_servers if role is Role.SERVER else self._cluster.num_workers
        if sum(1 for _, _, b in self._pending if (b.role == "server") == (role is Role.SERVER)) >= wanted:
            self._send(identity, error_frames(header, SCHEDULER_ID, "ProtocolError",
                                              f"all {wanted} {role.name.lower()}s of the job have registered"))
            return
        self._pending.append((identity, header, body))
        if self._cluster.verbose:
            log.info("scheduler: %s registered (%d of %d)", role.name.lower(), len(self._pending), expected)
        if len(self._pending) == expected:
            self._assign()

    def _assign(self, workers: int = 0) -> None:
        """The cluster assembled (an elastic job's with ``workers``, at least MIN, at the startup timeout)."""
        now = time.monotonic()
        by_role: dict[Role, list[tuple[bytes, Header, Register]]] = {Role.SERVER: [], Role.WORKER: []}
        for item in self._pending:
            by_role[Role.SERVER if item[2].role == "server" else Role.WORKER].append(item)
        wanted = {Role.SERVER: self._cluster.num_servers, Role.WORKER: workers or self._cluster.num_workers}
        for role, items in by_role.items():
            if len(items) != wanted[role]:
                for identity, header, _ in self._pending:
                    self._send(identity, error_frames(header, SCHEDULER_ID, "ProtocolError",
                                                      f"expected {wanted[role]} {role.name.lower()}s, got {len(items)}"))
                self._pending = []
                return
            ranks = _ranks([body.rank for _, _, body in items], slots=self._views.elastic and role is Role.WORKER)
            for (identity, _, body), rank in zip(items, ranks):
                nid = node_id(role, rank)
                self._nodes[nid] = _Node(identity, role, rank, body.address, now, shm=body.shm)
                self._by_identity[identity] = nid
        self._views.start(n.rank for n in self._nodes.values() if n.role is Role.WORKER)
        # servers first: each learns the job's secret before a worker's HELLO can reach it
        for identity, header, _ in sorted(self._pending, key=lambda item: item[2].role != "server"):
            self._send(identity, reply_frames(header, SCHEDULER_ID, self._table(self._by_identity[identity]).encode()))
        self._pending = []
        log.info("scheduler: all %d nodes registered", len(self._nodes))

    def _fail_startup(self, identity: bytes, header: Header, body: Register) -> None:
        """A node could not start (REGISTER with ``failed``; it is exiting). Before the cluster
        assembled, every registration fails with its reason (NodeFailedError naming it): the
        pending ones now, later ones as they come; the scheduler ends once every node of the job
        was told (or at ``startup_timeout``, or when the launcher ends it). After, a replacement
        that could not start is only logged (the launcher, or the recovery window, decides)."""
        if body.failed is not None:
            self._send(identity, reply_frames(header, SCHEDULER_ID))  # taken: the node may exit
            self._told_why.add(identity)
            name = f"{body.role} {body.rank}" if body.rank >= 0 else f"a {body.role}"
            text = f"could not start: {body.failed.type}: {body.failed.message}"
            log.error("scheduler: %s %s", name, text)
            if self._nodes or self._finished.is_set():
                return
            if self._not_started is None:
                self._not_started = (name, text)
                self._failure = NodeFailedError(name, text)
            waiting, self._pending = [(i, h) for i, h, _ in self._pending], []
        else:
            waiting = [(identity, header)]
        assert self._not_started is not None
        name, text = self._not_started
        for to, to_header in waiting:
            self._send(to, error_frames(to_header, SCHEDULER_ID, "NodeFailedError", text, node=name))
            self._told_why.add(to)
        if len(self._told_why) >= self._cluster.num_servers + self._cluster.num_workers:
            self._finished.set()

    def _table(self, nid: int, recovery: bool = False) -> NodeTable:
        """The registration reply of node ``nid``: its rank and the servers; a server's carries the
        job's secret, a worker's its token (the same for a replacement of its rank)."""
        servers = [self._nodes[node_id(Role.SERVER, r)] for r in range(self._cluster.num_servers)]
        server = self._nodes[nid].role is Role.SERVER
        return NodeTable(nid, self._nodes[nid].rank, tuple(s.address for s in servers), tuple(s.shm for s in servers),
                         self._cluster.num_servers, self._num_workers(), recovery,
                         self._secret if server else "", "" if server else node_token(self._secret, nid),
                         self._views.current())

    def _num_workers(self) -> int:
        """The job's workers now: an elastic job's view's members, else the fixed number."""
        view = self._views.current()
        return len(view.members) if view else self._cluster.num_workers

    def _admit(self, identity: bytes, header: Header, slot: int) -> None:
        """An elastic job's view admits worker ``slot`` (waiting in its REGISTER): it is registered and answered."""
        nid = node_id(Role.WORKER, slot)
        self._nodes[nid] = _Node(identity, Role.WORKER, slot, "", time.monotonic())
        self._by_identity[identity] = nid
        self._send(identity, reply_frames(header, SCHEDULER_ID, self._table(nid).encode()))

    def _rejoin(self, identity: bytes, header: Header, body: Register, role: Role) -> None:
        """A replacement process takes over a worker's or server's rank (``PSKV_RECOVERY_TIMEOUT`` > 0).

        It names its rank (``DMLC_WORKER_ID`` / ``PSKV_SERVER_RANK``); without one it takes
        the only dead node's of its role. Registering again means the old process is gone
        (a launcher restarts a process only after it exited), so the old one counts as
        replaced at once, dead or not. A new server's address reaches every node with
        the next heartbeat replies (``servers_version``).
        """
        rank = body.rank
        count = self._cluster.num_workers if role is Role.WORKER else self._cluster.num_servers
        if rank < 0:
            dead = [n.rank for n in self._nodes.values() if n.role is role and n.dead]
            rank = dead[0] if len(dead) == 1 else -1
        nid = node_id(role, rank) if 0 <= rank < count else -1
        node = self._nodes.get(nid)
        if node is None or nid in self._done_workers:
            self._send(identity, error_frames(header, SCHEDULER_ID, "ProtocolError",
                                              f"the cluster is complete and no {role.name.lower()} rank is open "
                                              "for a replacement (give DMLC_WORKER_ID / PSKV_SERVER_RANK)"))
            return
        if node.dead and time.monotonic() - node.dead_since > self._cluster.recovery_timeout:
            self._send(identity, error_frames(header, SCHEDULER_ID, "NodeFailedError",
                                              f"{node_name(nid)} has been dead for longer than "
                                              f"PSKV_RECOVERY_TIMEOUT={self._cluster.recovery_timeout:g} s "
                                              "(pskv launch --recovery-timeout)"))
            return
        self._by_identity.pop(node.identity, None)
        self._meetings.forget(nid)  # the old process may have died inside a barrier
        self._rates.forget(nid)  # the replacement's counters start from 0
        node.identity, node.address, node.dead, node.given_up = identity, body.address, False, False
        node.last_seen = time.monotonic()
        self._by_identity[identity] = nid
        if role is Role.SERVER:
            node.shm = body.shm
            self._servers_version += 1
        log.warning("scheduler: %s rejoined (a replacement process)", node_name(nid))
        self._send(identity, reply_frames(header, SCHEDULER_ID, self._table(nid, recovery=True).encode()))

    # -- groups -------------------------------------------------------------------------
    def _members(self, group: int) -> set[int]:
        return {nid for nid, n in self._nodes.items() if int(n.role) & group}

    # -- liveness -----------------------------------------------------------------------
    def _may_return(self, nid: int) -> bool:
        """True while a dead worker may still be replaced (``PSKV_RECOVERY_TIMEOUT``)."""
        node = self._nodes[nid]
        replaceable = node.role is Role.WORKER or (node.role is Role.SERVER and bool(self._cluster.server_recovery))
        return (replaceable and self._cluster.recovery_timeout > 0
                and time.monotonic() - node.dead_since <= self._cluster.recovery_timeout)

    def _lost(self, nid: int) -> bool:
        """True for a node that is dead and will not be replaced (no recovery, or its window closed)."""
        node = self._nodes.get(nid)
        return node is not None and node.dead and not self._may_return(nid)

    def _dead_ids(self) -> list[int]:
        return sorted(nid for nid, n in self._nodes.items() if n.dead)

    def _check_liveness(self) -> None:
        held = self._attention.held_up()  # every check: the wait for the first node is no stall
        if not self._nodes:
            return
        if held:  # the nodes' heartbeats wait unread: judged at the next check, once they are read
            log.warning("scheduler: its loop was held up for %.1f s; liveness is judged at the next check", held)
            return
        limit = time.monotonic() - self._cluster.heartbeat_timeout
        newly = [nid for nid, n in self._nodes.items() if not n.dead and n.last_seen < limit
                 and nid not in self._done_workers]
        now = time.monotonic()
        for nid in newly:
            self._nodes[nid].dead = True
            self._nodes[nid].dead_since = now
            departure = self._views.elastic and self._nodes[nid].role is Role.WORKER  # the job goes on without it
            log.log(logging.WARNING if departure else logging.ERROR, "scheduler: %s missed heartbeats for %.1f s: "
                    "marked dead%s", node_name(nid), self._cluster.heartbeat_timeout,
                    " (a departure from the elastic job)" if departure else "")
            self._views.depart(nid, f"missed heartbeats for {self._cluster.heartbeat_timeout:g} s")
        # workers whose recovery window just closed: the barriers waiting for them fail now
        expired = [nid for nid, n in self._nodes.items() if n.dead and self._cluster.recovery_timeout > 0
                   and (n.role is Role.WORKER or self._cluster.server_recovery)
                   and not n.given_up and not self._may_return(nid)]
        for nid in expired:
            self._nodes[nid].given_up = True
            log.error("scheduler: %s was not replaced within %.1f s", node_name(nid), self._cluster.recovery_timeout)
        if newly or expired:
            self._meetings.settle()
            self._settle_shutdown()

    # -- shutdown -----------------------------------------------------------------------
    def _shutdown(self, identity: bytes, header: Header, nid: int, wait: bool) -> None:
        """A node is done. A worker leaves the job at once (whether it waits or not): the
        meetings that need it fail now naming it, and the servers learn it with their next
        heartbeat reply (``Liveness.left``), so the sync rounds it never pushed fail too.
        With ``wait`` the answer comes when every worker has left (or died): a worker's
        exit barrier, a server's end of the job."""
        if self._nodes[nid].role is Role.WORKER:
            if nid not in self._done_workers:
                self._done_workers.add(nid)
                self._views.depart(nid, "left the job")  # elastic: a member that was not drained departs
                if self._cluster.verbose:
                    log.info("scheduler: %s left the job", node_name(nid))
                self._meetings.settle()  # meetings that need it cannot complete any more
            if not wait:
                self._send(identity, reply_frames(header, SCHEDULER_ID))
        if wait:
            self._waiting[nid] = (identity, header)
        self._settle_shutdown()

    def _settle_shutdown(self) -> None:
        workers = self._members(Role.WORKER)
        if not workers or not workers <= self._done_workers | {w for w in workers if self._lost(w)}:
            return
        servers = self._members(Role.SERVER)
        reply = Liveness(tuple(self._dead_ids()), {}, left=tuple(sorted(self._done_workers))).encode()
        for identity, header in self._waiting.values():
            self._send(identity, reply_frames(header, SCHEDULER_ID, reply))
        told = set(self._waiting)
        self._waiting.clear()
        self._told |= told
        if servers <= self._told | {s for s in servers if self._nodes[s].dead}:
            self._finished.set()

    # -- an elastic job's launcher reports and bounds ------------------------------------------
    def _roster(self, identity: bytes, header: Header) -> None:
        """The launcher reports a worker's exit (a departure now, not after the heartbeat timeout) or a drain."""
        gone = self._views.report(identity, header)
        node = self._nodes.get(gone) if gone is not None else None
        if node is not None and not node.dead:
            node.dead, node.dead_since = True, time.monotonic()
        self._meetings.settle()
        self._settle_shutdown()

    def _check_views(self) -> None:
        """Timer (elastic jobs): below MIN for longer than ``PSKV_ELASTIC_TIMEOUT`` fails the meetings and the job."""
        text = self._views.overdue()
        if text is None or self._finished.is_set():
            return
        log.error("scheduler: %s", text)
        self._meetings.fail_all("NodeFailedError", text, "the elastic job")
        self._failure = NodeFailedError("the elastic job", text)
        self._finished.set()

    # -- startup and the launcher's end ---------------------------------------------------
    def _check_startup(self) -> None:
        """Timer: a cluster that did not assemble within ``startup_timeout`` ends the scheduler."""
        if self._nodes or self._finished.is_set() or time.monotonic() - self._born < self._cluster.startup_timeout:
            return
        if self._not_started is not None:  # the reason went to every node that came (self._failure)
            self._finished.set()
            return
        roles = [body.role for _, _, body in self._pending]
        if self._views.elastic and roles.count("server") == self._cluster.num_servers \
                and roles.count("worker") >= self._cluster.min_workers:  # the late workers join at commits
            log.warning("scheduler: %d of %d workers registered within PSKV_STARTUP_TIMEOUT: the job starts with "
                        "them", roles.count("worker"), self._cluster.num_workers)
            self._assign(roles.count("worker"))
            return
        text = (f"the cluster did not assemble within PSKV_STARTUP_TIMEOUT={self._cluster.startup_timeout:g} s: "
                f"{roles.count('server')} of {self._cluster.num_servers} server(s) and {roles.count('worker')} of "
                f"{self._cluster.num_workers} worker(s) registered (a worker registers when it creates its dist store)")
        log.error("scheduler: %s", text)
        for identity, header, _ in self._pending:
            self._send(identity, error_frames(header, SCHEDULER_ID, "OperationTimeoutError", text))
        self._pending = []
        self._failure = OperationTimeoutError(text)
        self._finished.set()

    def end(self, reason: str) -> None:
        """End the job from outside (any thread): no worker will come or stay (``reason`` is logged).

        The launcher asks for this once every worker process has exited, or when it is
        gone (:mod:`pskv.launch.guard`): workers that never created a store never register,
        and without this the scheduler would wait for them until ``startup_timeout``.
        """
        if not self._finished.is_set():
            log.info("scheduler: %s; ending", reason)
            self._finished.set()

def _ranks(requested: list[int], slots: bool = False) -> list[int]:
    """Ranks for nodes in arrival order: requested ranks if they form 0..n-1 (``slots``, an elastic job's
    workers: if they are distinct and given), else arrival order."""
    n = len(requested)
    if sorted(requested) == list(range(n)) or (slots and min(requested) >= 0 and len(set(requested)) == n):
        return requested
    return list(range(n))
