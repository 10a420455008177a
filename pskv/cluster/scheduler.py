"""The scheduler: rendezvous, rank assignment, barriers, liveness and orderly shutdown.

It carries no array data. Every node connects to it and:

1. sends ``REGISTER`` (role, the address it serves on); once all ``S + W`` nodes have
   registered, each gets its rank, node id and the servers' addresses;
2. sends ``HEARTBEAT`` every interval; the reply lists the nodes the scheduler considers
   dead (silent for longer than the heartbeat timeout), so every survivor learns of a
   death within about one timeout;
3. sends ``BARRIER`` (group mask) — answered when every live member arrived, or with an
   error naming the dead members;
4. at the end: workers send ``SHUTDOWN``; servers send ``SHUTDOWN`` with ``wait`` and
   are answered once every worker is done. Then the scheduler's :meth:`run` returns.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import zmq

from pskv.cluster.runtime import NodeRuntime
from pskv.config import ClusterConfig
from pskv.errors import OperationTimeoutError, ProtocolError
from pskv.protocol import SCHEDULER_ID, Command, Header, Role, decode, node_id, node_name
from pskv.protocol.bodies import Barrier, Liveness, NodeTable, Register, ShmInfo, Shutdown
from pskv.protocol.replies import error_frames, reply_frames

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
        self._runtime = NodeRuntime("pskv-scheduler", context, describe=lambda: "the scheduler", cluster=cluster)
        self._reactor = self._runtime.reactor
        self._sid, self.address = self._reactor.bind_router(address or cluster.scheduler_address, self._on_message)
        self._pending: list[tuple[bytes, Header, Register]] = []  # registrations before all arrived
        self._nodes: dict[int, _Node] = {}
        self._by_identity: dict[bytes, int] = {}
        self._barriers: dict[int, dict[int, tuple[bytes, Header]]] = {}
        self._done_workers: set[int] = set()
        self._waiting_servers: dict[int, tuple[bytes, Header]] = {}
        self._finished = threading.Event()
        self._servers_version = 0  # counts server replacements (heartbeat replies carry the table)
        self._released: dict[int, int] = {}  # node -> request id of its last barrier released
        if cluster.heartbeat_interval > 0:
            self._reactor.add_timer(max(0.05, cluster.heartbeat_interval / 2), self._check_liveness)

    # -- life cycle ---------------------------------------------------------------------
    def start(self) -> str:
        """Start serving; returns the bound address."""
        self._reactor.start()
        return self.address

    def run(self, timeout: float | None = None) -> None:
        """Start (if needed) and block until the job ends, then stop.

        Raises:
            OperationTimeoutError: the job did not end within ``timeout`` seconds.
        """
        if not self._reactor.on_reactor_thread() and self._reactor._thread is None:
            self.start()
        try:
            if not self._finished.wait(timeout):
                raise OperationTimeoutError(f"the job did not finish within {timeout} s")
            time.sleep(0.05)  # let the last replies leave
        finally:
            self.stop()

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
        if header.command is Command.REGISTER:
            body = Register.parse(header)
            if nid is not None and nid != node_id(Role.SERVER if body.role == "server" else Role.WORKER, body.rank):
                self._refuse_sender(identity, header, nid, f"REGISTER as a {body.role} of rank {body.rank}")
                return
            self._register(identity, header, body)
            return
        if nid is None:
            self._send(identity, error_frames(header, SCHEDULER_ID, "ProtocolError", "register first"))
            return
        if header.sender != nid:  # a node id is bound to the connection it registered on
            self._refuse_sender(identity, header, nid, f"{header.command.name} claiming node id {header.sender}")
            return
        self._nodes[nid].last_seen = time.monotonic()
        if header.command is Command.HEARTBEAT:
            self._send(identity, reply_frames(header, SCHEDULER_ID, self._liveness(nid).encode()))
        elif header.command is Command.BARRIER:
            self._barrier(identity, header, nid, Barrier.parse(header).group)
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
        log.error("scheduler: %s", message)
        self._send(identity, error_frames(header, SCHEDULER_ID, "ProtocolError", message))

    # -- registration -------------------------------------------------------------------
    def _liveness(self, nid: int) -> Liveness:
        """The heartbeat reply: who is dead, how long since each node was heard, where servers are."""
        now = time.monotonic()
        ages = {n: round(now - node.last_seen, 3) for n, node in self._nodes.items()}
        if not self._servers_version:
            return Liveness(tuple(self._dead_ids()), ages)
        table = self._table(nid)  # a server was replaced: where the servers are now
        return Liveness(tuple(self._dead_ids()), ages, self._servers_version, table.servers, table.server_shm)

    def _register(self, identity: bytes, header: Header, body: Register) -> None:
        role = Role.SERVER if body.role == "server" else Role.WORKER
        expected = self._cluster.num_servers + self._cluster.num_workers
        if self._nodes and self._cluster.recovery_timeout > 0 and (
                role is Role.WORKER or self._cluster.server_recovery):
            self._rejoin(identity, header, body, role)
            return
        if self._nodes or len(self._pending) >= expected:
            self._send(identity, error_frames(header, SCHEDULER_ID, "ProtocolError",
                                              f"the cluster is already complete ({expected} nodes)"))
            return
        self._pending.append((identity, header, body))
        if self._cluster.verbose:
            log.info("scheduler: %s registered (%d of %d)", role.name.lower(), len(self._pending), expected)
        if len(self._pending) == expected:
            self._assign()

    def _assign(self) -> None:
        now = time.monotonic()
        by_role: dict[Role, list[tuple[bytes, Header, Register]]] = {Role.SERVER: [], Role.WORKER: []}
        for item in self._pending:
            by_role[Role.SERVER if item[2].role == "server" else Role.WORKER].append(item)
        wanted = {Role.SERVER: self._cluster.num_servers, Role.WORKER: self._cluster.num_workers}
        for role, items in by_role.items():
            if len(items) != wanted[role]:
                for identity, header, _ in self._pending:
                    self._send(identity, error_frames(header, SCHEDULER_ID, "ProtocolError",
                                                      f"expected {wanted[role]} {role.name.lower()}s, got {len(items)}"))
                self._pending = []
                return
            ranks = _ranks([body.rank for _, _, body in items])
            for (identity, _, body), rank in zip(items, ranks):
                nid = node_id(role, rank)
                self._nodes[nid] = _Node(identity, role, rank, body.address, now, shm=body.shm)
                self._by_identity[identity] = nid
        for identity, header, _ in self._pending:
            self._send(identity, reply_frames(header, SCHEDULER_ID, self._table(self._by_identity[identity]).encode()))
        self._pending = []
        log.info("scheduler: all %d nodes registered", len(self._nodes))

    def _table(self, nid: int, recovery: bool = False) -> NodeTable:
        """The registration reply of node ``nid``: its rank and the servers."""
        servers = [self._nodes[node_id(Role.SERVER, r)] for r in range(self._cluster.num_servers)]
        return NodeTable(nid, self._nodes[nid].rank, tuple(s.address for s in servers), tuple(s.shm for s in servers),
                         self._cluster.num_servers, self._cluster.num_workers, recovery)

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
                                              f"PSKV_RECOVERY_TIMEOUT={self._cluster.recovery_timeout:g} s"))
            return
        self._by_identity.pop(node.identity, None)
        for arrived in self._barriers.values():  # the old process may have died inside a barrier
            arrived.pop(nid, None)
        node.identity, node.address, node.dead, node.given_up = identity, body.address, False, False
        node.last_seen = time.monotonic()
        self._by_identity[identity] = nid
        if role is Role.SERVER:
            node.shm = body.shm
            self._servers_version += 1
        log.warning("scheduler: %s rejoined (a replacement process)", node_name(nid))
        self._send(identity, reply_frames(header, SCHEDULER_ID, self._table(nid, recovery=True).encode()))

    # -- barrier ------------------------------------------------------------------------
    def _members(self, group: int) -> set[int]:
        return {nid for nid, n in self._nodes.items() if int(n.role) & group}

    def _barrier(self, identity: bytes, header: Header, nid: int, group: int) -> None:
        if self._released.get(nid) == header.request:  # a repeat (reset connection) of one released
            self._send(identity, reply_frames(header, SCHEDULER_ID))
            return
        if not 1 <= group <= 7 or not int(self._nodes[nid].role) & group:
            self._send(identity, error_frames(header, SCHEDULER_ID, "InvalidArgumentError",
                                              f"{node_name(nid)} is not in barrier group {group}"))
            return
        arrived = self._barriers.setdefault(group, {})
        arrived[nid] = (identity, header)
        self._settle_barrier(group)

    def _settle_barrier(self, group: int) -> None:
        arrived = self._barriers.get(group, {})
        members = {m for m in self._members(group) if int(self._nodes[m].role) != Role.SCHEDULER}
        dead = sorted(m for m in members if self._nodes[m].dead and not self._may_return(m))
        if dead and arrived:
            names = ", ".join(node_name(m) for m in dead)
            for identity, header in arrived.values():
                self._send(identity, error_frames(header, SCHEDULER_ID, "NodeFailedError", f"barrier cannot complete: {names} dead"))
            self._barriers[group] = {}
        elif arrived and members <= set(arrived):
            for nid, (identity, header) in arrived.items():
                self._released[nid] = header.request
                self._send(identity, reply_frames(header, SCHEDULER_ID))
            self._barriers[group] = {}

    # -- liveness -----------------------------------------------------------------------
    def _may_return(self, nid: int) -> bool:
        """True while a dead worker may still be replaced (``PSKV_RECOVERY_TIMEOUT``)."""
        node = self._nodes[nid]
        replaceable = node.role is Role.WORKER or (node.role is Role.SERVER and bool(self._cluster.server_recovery))
        return (replaceable and self._cluster.recovery_timeout > 0
                and time.monotonic() - node.dead_since <= self._cluster.recovery_timeout)

    def _dead_ids(self) -> list[int]:
        return sorted(nid for nid, n in self._nodes.items() if n.dead)

    def _check_liveness(self) -> None:
        if not self._nodes:
            return
        limit = time.monotonic() - self._cluster.heartbeat_timeout
        newly = [nid for nid, n in self._nodes.items() if not n.dead and n.last_seen < limit
                 and nid not in self._done_workers]
        now = time.monotonic()
        for nid in newly:
            self._nodes[nid].dead = True
            self._nodes[nid].dead_since = now
            log.error("scheduler: %s missed heartbeats for %.1f s: marked dead", node_name(nid),
                      self._cluster.heartbeat_timeout)
        # workers whose recovery window just closed: the barriers waiting for them fail now
        expired = [nid for nid, n in self._nodes.items() if n.dead and self._cluster.recovery_timeout > 0
                   and (n.role is Role.WORKER or self._cluster.server_recovery)
                   and not n.given_up and not self._may_return(nid)]
        for nid in expired:
            self._nodes[nid].given_up = True
            log.error("scheduler: %s was not replaced within %.1f s", node_name(nid), self._cluster.recovery_timeout)
        if newly or expired:
            for group in list(self._barriers):
                self._settle_barrier(group)
            self._settle_shutdown()

    # -- shutdown -----------------------------------------------------------------------
    def _shutdown(self, identity: bytes, header: Header, nid: int, wait: bool) -> None:
        if self._nodes[nid].role is Role.WORKER:
            self._done_workers.add(nid)
            self._send(identity, reply_frames(header, SCHEDULER_ID))
        elif wait:
            self._waiting_servers[nid] = (identity, header)
        self._settle_shutdown()

    def _settle_shutdown(self) -> None:
        workers = self._members(Role.WORKER)
        if not workers or not workers <= self._done_workers | {w for w in workers if self._nodes[w].dead
                                                               and not self._may_return(w)}:
            return
        servers = self._members(Role.SERVER)
        for identity, header in self._waiting_servers.values():
            self._send(identity, reply_frames(header, SCHEDULER_ID, Liveness(tuple(self._dead_ids()), {}).encode()))
        told = set(self._waiting_servers)
        if servers <= told | {s for s in servers if self._nodes[s].dead}:
            self._finished.set()


def _ranks(requested: list[int]) -> list[int]:
    """Ranks for nodes in arrival order: requested ranks if they form 0..n-1, else arrival order."""
    n = len(requested)
    if sorted(requested) == list(range(n)):
        return requested
    return list(range(n))
