"""``ServerCore``: everything a server does with a request, with no socket in sight.

ps-lite's ``KVServer::Process`` decodes a message and calls one request handler; this
is that handler for pskv: decode the header's fixed fields, check the sender, and only
then decode and validate the arrays (a stranger's message costs its header), answer a
repeated request from the :class:`~pskv.server.dedup.ReplyCache`, dispatch to the data
(:mod:`pskv.server.handlers`) or control (:mod:`pskv.server.control`) commands, and
turn any exception into an ``ERROR`` reply naming it. Replies leave through one
``send(peer, frames)`` callable:

* :class:`~pskv.server.node.ServerNode` passes its reactor's router socket — the real
  server process;
* :class:`~pskv.testing.loopback.LoopbackCluster` passes a function call into a worker
  in the same thread — store semantics tested without sockets or threads.

A value reply produced while a message is handled (a push completing a round answers
the pulls that waited for it) is held until that message's own reply went out, so a
worker sees its push acknowledged before any pull that includes it returns.

A worker's ``HELLO`` (or ``REJOIN``) may arrive before this server has taken in its own
registration reply, which brings the job's secret that checks the worker's token
(:mod:`pskv.server.senders`): such opening messages are held (bounded, without array
frames) and handled in order once :meth:`ServerCore.registered` is called.

In an elastic job (``ClusterConfig.elastic``) the core also holds the shard's commit snapshots
(:mod:`pskv.server.commits`) and the view it serves (:mod:`pskv.server.members`): a message whose
epoch is not the view's is refused or held there (a header too long to be read at once has its epoch
after its specs: its sender is checked and it is read whole first), and a new view
(:meth:`ServerCore.adopt`) rolls back or promotes a commit. In every other job both are no-ops and
cost nothing per message (its messages and its view both have epoch 0, so the check is one comparison).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import Any, NoReturn

from pskv.config import ClusterConfig
from pskv.errors import KVStoreError, ProtocolError
from pskv.metrics import STALL_AFTER
from pskv.partition import server_key
from pskv.protocol import Command, Header, Role, node_id, node_name, node_role_rank
from pskv.protocol.bodies import Counters, InitBody, View
from pskv.protocol.codec import decode, decode_arrays, decode_head
from pskv.protocol.replies import error_frames
from pskv.server.checkpointing import ShardCheckpoints
from pskv.server.commits import CommitSnapshots, NoCommits
from pskv.server.control import ControlHandlers
from pskv.server.dedup import Dropped, Regather, Repeat, ReplyCache
from pskv.server.handlers import DataHandlers, Handler
from pskv.server.liveness import DeadWorkers
from pskv.server.members import ViewMembers
from pskv.server.observe import ServerObserver, observer
from pskv.server.paths import AllowedPaths
from pskv.server.routes import Routes
from pskv.server.rows import SharedRows
from pskv.server.senders import CONNECTIONS_PER_WORKER, SenderBindings
from pskv.server.shard import Allocator, ServerShard
from pskv.timeline import Timeline

__all__ = ["ServerCore", "Send"]

log = logging.getLogger("pskv.server")

Send = Callable[[bytes, list[Any]], None]  # (peer identity, frames)


class ServerCore:
    """A server's shard and request handling (no I/O of its own).

    Args:
        cluster: the cluster contract (number of workers, recovery timeout, ...).
        send: delivers frames to a peer.
        node_id: this server's node id (the replies' sender; known after registering).
        name: this server's name for messages (``'server 0'``).
        rank: this server's rank (names its state files).
        secret: the job's secret, hex (known after registering; ``""`` before): workers
            prove their identity with tokens made from it (:mod:`pskv.server.senders`).
        allocate: makes a part's shared-memory buffers (None: no shared memory).
        defer: runs a call on this server's handling thread later (the reactor's
            ``call_soon``); with it, big tables are drawn on a thread of their own
            (:class:`~pskv.server.row_init.RowInit`). None: everything inline.
        ask_view: asks the scheduler for the current view now (an elastic job's; unused in others).
    """

    def __init__(self, cluster: ClusterConfig, send: Send, node_id: Callable[[], int], name: Callable[[], str],
                 rank: Callable[[], int], secret: Callable[[], str], allocate: Allocator | None = None,
                 defer: Callable[[Callable[[], None]], None] | None = None,
                 ask_view: Callable[[], None] | None = None) -> None:
        self._cluster = cluster
        self._send = send
        self._node_id = node_id
        self._name = name
        workers = tuple(node_id_of(r) for r in range(cluster.num_workers))
        self.observer = ServerObserver()  # what pskv top shows of this server (metrics()), spans once traced
        self.shard = ServerShard(cluster.num_workers, sync=True, allocate=allocate, workers=workers,
                                 observer=self.observer)
        self.dead = DeadWorkers(self.shard, cluster.recovery_timeout, name)
        most = max(1, cluster.num_workers, cluster.max_workers)  # workers at once (an elastic job's MAX)
        self.replies = ReplyCache(CONNECTIONS_PER_WORKER * most)
        self.senders = SenderBindings(name, secret)  # which worker each connection speaks for (by its token)
        self.checkpoints = ShardCheckpoints(self.shard, cluster, name)
        self._early_limit = 2 * most + 16  # a worker's connections open one at a time per server
        self.commits = CommitSnapshots(self.shard, self.checkpoints.squeezed) if cluster.elastic else NoCommits()
        self.view = ViewMembers(self.shard, self.commits, workers, ask_view if cluster.elastic else None,
                                self._early_limit)  # whom it serves and waits for; stale epochs
        self.routes = Routes()  # a worker's send-only socket -> where its replies go (HELLO); bounded
        self.data = DataHandlers(self.shard, self._reply, self._answer, node_id, self.replies, self.dead,
                                 self.routes, name, cluster.max_table_bytes, defer, fail=self.fail)
        self.data.squeezed = self.checkpoints.squeezed  # both_ways residuals: saved and restored with the shard
        if allocate is not None and cluster.shm_rows_bytes:  # rows of row-sparse keys in shared memory (workers here)
            self.data.shared_rows = SharedRows(allocate, workers, cluster.shm_rows_bytes)
        self.key_names: dict[int, str] = {}  # str keys' names by server key, from INIT (the stall report, errors)
        control = ControlHandlers(self.shard, self.checkpoints, self._reply, node_id, rank, AllowedPaths.of(cluster),
                                  cluster.max_message_bytes, self.commits, self.key_names)
        self._handlers: dict[Command, Handler] = {**self.data.handlers(), **control.handlers()}
        self._handlers[Command.INIT] = self._init
        # for the shard's errors (unknown key, size, dtype, commit, rows, ...) and those of step counts and liveness
        self.shard.key_names = self.key_names
        self._held: list[tuple[bytes, list[Any]]] | None = None  # value replies held while a message is handled
        self._secret = secret
        self._early: list[tuple[bytes, list[bytes]]] | None = []  # HELLO/REJOIN that came before the secret
        self._scanned = (0, 0, 0)  # queue, stalls, whom they wait for: the last pass over the parts (metrics())
        self._next_scan = 0.0  # monotonic time metrics() may pass over the parts again

    def handle(self, identity: bytes, frames: list[Any]) -> None:
        """Handle one message from the socket ``identity`` (malformed frames are logged and dropped)."""
        try:
            header, specs = decode_head(frames)  # the fixed fields: who sent it is checked before its arrays
        except ProtocolError as exc:
            log.error("%s: rejected a malformed message from %r: %s", self._name(), identity, exc)
            return
        if self._early is not None and self._hold_early(identity, header, frames):
            return
        origin = identity  # the socket it came from: one process's (fixed across reconnects)
        identity = self.routes.get(identity)  # from a send-only socket: answer where its HELLO came from
        self._held = []
        try:
            if specs is None:  # a long header, read only up to its specs: its epoch follows them (_read_long)
                read = self._read_long(origin, header, frames)
                if read is None:
                    return
                header, buffers = read
            if header.epoch != self.view.epoch and self._other_view(origin, header, frames):
                return  # of a view this server does not have yet: handled again when it comes (adopt)
            handler = self._handlers.get(header.command) if header.sender in self.view.members else None
            if handler is None:
                self._refuse(header)
            self.senders.check(origin, header)  # a connection speaks for one worker only
            if specs is not None:  # (the usual case: its arrays are read now, its sender passed)
                try:
                    header, buffers = decode_arrays(header, specs, frames)
                except ProtocolError as exc:
                    log.error("%s: rejected a malformed message from %r: %s", self._name(), origin, exc)
                    return
            self.observer.received(header, buffers)
            repeat = self.replies.begin(origin, header.request)
            if repeat is None:
                handler(identity, header, buffers)
            else:
                self._answer_repeat(identity, header, repeat)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an ERROR reply; the server lives on
            self.fail(identity, header, exc)
        finally:
            self.replies.end()
            held, self._held = self._held, None
            for peer, reply in held:
                self._send(peer, reply)

    def fail(self, identity: bytes, header: Header, exc: Exception) -> None:
        """The server's one ERROR reply: the request ``header`` failed with ``exc`` (its type and text go back;
        logged with its traceback unless a :class:`~pskv.errors.KVStoreError`). Called in the ``except``
        block, also for a request answered later (a row-sparse INIT drawn on a thread)."""
        if not isinstance(exc, KVStoreError):
            log.exception("%s: %s failed", self._name(), header.command.name)
        self._reply(identity, error_frames(header, self._node_id(), type(exc).__name__, str(exc)))

    def trace(self, timeline: Timeline | None) -> None:
        """Record the shard's rounds on ``timeline`` too (``PSKV_TIMELINE``; None: off), str keys by name."""
        self.observer = observer(self.observer.counters, timeline, self.key_names)
        self.shard.observer = self.commits.wrap(self.observer)  # an elastic job's copy on write first

    def metrics(self) -> Counters:
        """This server's metrics now (the membership sends them with a heartbeat; reactor thread).

        Rounds are the shard's completed rounds; the queue is the pulls parked until a
        round completes; stalls the open rounds older than :data:`STALL_AFTER` s (the shard's
        :meth:`~ServerShard.open_rounds`, which the stall report reads too). Queue and
        stalls need a pass over every part: it is made again only once 50 times its own
        duration has passed, so it takes at most 2% of this thread (100,000 parts: about
        80 ms, so every 4 s; till then the last pass's numbers are sent).
        """
        start = time.monotonic()
        if start >= self._next_scan:
            stalls = 0
            joined = self.shard.joined
            missing: collections.Counter[int] = collections.Counter()  # worker -> stalled rounds without its push
            for stall in self.shard.open_rounds(STALL_AFTER):
                stalls += 1
                missing.update(w for w in self.view.workers if w not in stall.pushed and w not in joined)
            self._scanned = (self.shard.parked(), stalls, missing.most_common(1)[0][0] if missing else 0)
            self._next_scan = start + 50 * (time.monotonic() - start)
        return self.observer.counters.report(*self._scanned)

    def adopt(self, view: View) -> None:
        """An elastic job's new view (an older one is ignored): the shard rolled back or its commit promoted
        (:meth:`ViewMembers.adopt`), then what lies outside the shard reset, and the messages held for it handled.

        Every slot's step marks are forgotten (meetings are counted per view), departed workers are no
        longer dead or left (they are no members), and a voiding view drops the refused rounds (their
        round numbers went back). The ReplyCache needs no reset: a repeat of a voided request carries
        its old epoch and is refused before the cache is asked.
        """
        before = self.view.workers
        held = self.view.adopt(view)
        if self.view.view is not view:
            return
        for worker in {*before, *self.view.workers}:
            self.data.steps.forget(worker)
        departed = set(before) - self.view.members
        self.dead.dead -= departed
        self.dead.left -= departed
        if view.voids:
            self.data._refused.clear()  # the refused rounds' numbers went back with the shard
        for identity, frames in held:
            self.handle(identity, frames)

    def registered(self) -> None:
        """The job's secret is known now: handle the opening messages held until now, in order."""
        early, self._early = self._early, None
        for identity, frames in early or ():
            self.handle(identity, frames)

    def _hold_early(self, identity: bytes, header: Header, frames: list[Any]) -> bool:
        """Before the secret is known, hold an opening message (bounded) to handle at :meth:`registered`.

        Returns whether it was held. Past the bound, or with array frames, it is not: the
        sender check then refuses it (this server has not registered yet).
        """
        if self._secret():
            self.registered()  # the secret came: what was held goes first
            return False
        assert self._early is not None
        if header.command not in (Command.HELLO, Command.REJOIN) or len(frames) > 1 or len(self._early) >= self._early_limit:
            return False
        self._early.append((identity, [bytes(memoryview(f).cast("B")) for f in frames]))  # copied: small
        return True

    def _init(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """INIT: the names of its str keys are known (checked first: each names a key of the message), then
        the data handler's (so its errors name them: a checkpoint's key of another size, ...)."""
        names = InitBody.parse(header).names
        self.key_names.update((server_key(n), n) for n in names)
        self.data.init(identity, header, buffers)

    def _read_long(self, origin: bytes, header: Header, frames: list[Any]) -> tuple[Header, list[memoryview]] | None:
        """All of a message whose header :func:`~pskv.protocol.codec.decode_head` only peeked at (longer than
        its ``PEEK_BYTES``; its specs ``None``, its flags and epoch 0 till read): its epoch follows its specs,
        so its sender is checked first (a stranger's costs its first fields), then it is read whole, and
        :meth:`handle` compares its epoch and checks it as any other. None: malformed (logged, dropped).

        Raises:
            ProtocolError: its sender is no worker of this job, or its connection does not speak for it.
        """
        if header.sender not in self.view.members and not self._cluster.elastic:
            self._refuse(header)  # (an elastic job's non-member may be a joiner of a newer view: its token tells)
        self.senders.check(origin, header)
        try:
            return decode(frames)
        except ProtocolError as exc:
            log.error("%s: rejected a malformed message from %r: %s", self._name(), origin, exc)
            return None

    def _other_view(self, origin: bytes, header: Header, frames: list[Any]) -> bool:
        """A message of another view than this server's: refused, or held until that view comes (True).

        Its connection is checked first (a joiner's HELLO proves its slot with its token), so only a
        proven worker's messages are ever held (:meth:`ViewMembers.stale`).
        """
        self.senders.check(origin, header)
        return self.view.stale(origin, header, frames)

    def _refuse(self, header: Header) -> NoReturn:
        """Refuse a request this server does not handle.

        Raises:
            ProtocolError: the sender is no worker of this job, or the command no server command.
        """
        if header.sender not in self.view.members:
            try:
                node_role_rank(header.sender)
            except ValueError:
                raise ProtocolError(f"sender {header.sender} is not a node id") from None
            raise ProtocolError(f"sender {header.sender} is not a worker of this job")
        raise ProtocolError(f"a server does not handle {header.command.name}")

    def _answer_repeat(self, identity: bytes, header: Header, repeat: Repeat) -> None:
        """Answer a request its sender sent again after a reset connection (see :mod:`pskv.server.dedup`)."""
        if isinstance(repeat, Dropped):
            log.debug("%s: dropped a repeat of request %d of %s (being answered)", self._name(), header.request,
                      node_name(header.sender))
        elif isinstance(repeat, Regather):  # a pushpull: its rounds' values again, its pushes not applied again
            self.data.gather(identity, header, repeat.parts, shared=repeat.shared)
        else:  # a short answer: the same again
            self._send(identity, repeat.frames)

    def _reply(self, identity: bytes, frames: list[Any]) -> None:
        """Send the reply to the message being handled (at once)."""
        self.replies.answered(frames)  # kept for a repeat of the request, if short
        self._send(identity, frames)

    def _answer(self, identity: bytes, frames: list[Any]) -> None:
        """Send a reply with values (pull, pushpull) — after the reply to the message being handled."""
        self.observer.sent(frames)
        if self._held is not None:
            self._held.append((identity, frames))
        else:
            self._send(identity, frames)


def node_id_of(worker_rank: int) -> int:
    """The node id of worker ``worker_rank``."""
    return node_id(Role.WORKER, worker_rank)
