"""The server node: registers with the scheduler, then serves its shard until the job ends.

All work happens on the reactor thread: requests are decoded and validated there
(:mod:`pskv.protocol.codec`), applied to the :class:`~pskv.server.shard.ServerShard`,
and answered — at once, or later for pulls that wait for a sync round. A request that
fails validation gets an ``ERROR`` reply naming the problem; the server keeps serving
everyone else.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import Any, TypeGuard

import numpy as np
import zmq

from pskv.cluster import Membership, RequestTracker
from pskv.cluster.messages import error_frames, json_body, reply_frames
from pskv.config import ClusterConfig
from pskv.errors import (
    CheckpointError,
    InvalidArgumentError,
    KVStoreError,
    OptimizerStateError,
    ProtocolError,
    TransportError,
)
from pskv.protocol import (
    TX_PREFIX,
    ArraySpec,
    Command,
    Header,
    Role,
    decode,
    encode,
    frame_array,
    node_id,
    node_name,
    node_role_rank,
)
from pskv.server.controllers import find_controller, import_modules
from pskv.server.shard import Part, PushLog, ServerShard, to_storage
from pskv.server.snapshot import PartState, ShardState, read_manifest, read_shard, write_shard
from pskv.transport import IO_THREADS, Reactor
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
        self._own_context = context is None
        self._ctx = zmq.Context(io_threads=IO_THREADS) if context is None else context
        self._stop_lock = threading.Lock()
        self._tracker = RequestTracker()
        self._reactor = Reactor(self._ctx, "pskv-server", on_failure=self._on_reactor_failure)
        self._sid, self.address = self._reactor.bind_router(f"tcp://{bind_host(cluster)}:0", self._on_message)
        self._shm_dir = ShmDirectory(f"{job_prefix(cluster.job_id)}server-") if cluster.uses_shm else None
        shm_info = {"dir": self._shm_dir.path, "host": host_id()} if self._shm_dir else None
        if self._shm_dir is not None:
            try:  # workers on this host send their requests here (see WorkerClient.connect)
                self._reactor.bind_local(self._sid, local_path(self._shm_dir.path))
            except TransportError as exc:
                log.info("no local socket, workers on this host use TCP: %s", exc)
        self._membership = Membership(cluster, self._reactor, self._tracker, Role.SERVER, self.address,
                                      on_dead=self._on_node_dead, shm=shm_info, on_alive=self._on_node_alive)
        self._dead_workers: set[int] = set()
        self._recovering: dict[int, float] = {}  # dead workers that may be replaced -> when they died
        self._saved_counts: dict[tuple[int, int], dict[int, int]] = {}  # of a loaded checkpoint
        # per socket requests come from: recent request ids -> _IN_FLIGHT, the short reply, or
        # what a repeat gets
        self._seen: dict[bytes, OrderedDict[int, Any]] = {}
        self._current: tuple[OrderedDict[int, Any], int] | None = None  # the request being handled
        if cluster.recovery_timeout > 0:
            self._reactor.add_timer(max(0.05, min(1.0, cluster.recovery_timeout / 4)), self._check_recovery)
        workers = tuple(node_id(Role.WORKER, r) for r in range(cluster.num_workers))
        allocate = self._shm_dir.create if self._shm_dir is not None else None
        self._shard = ServerShard(cluster.num_workers, sync=True, allocate=allocate, workers=workers)
        self._rank = -1
        self._handlers: dict[Command, Callable[[bytes, Header, list[memoryview]], None]] = {
            Command.INIT: self._init,
            Command.PUSH: self._push,
            Command.PULL: self._pull,
            Command.PUSHPULL: self._pushpull,
            Command.SET_MODE: self._set_mode,
            Command.HELLO: self._hello,
            Command.SYNC: self._sync,
            Command.JOIN: self._join,
            Command.SAVE_CHECKPOINT: self._save_checkpoint,
            Command.REJOIN: self._rejoin,
            Command.SET_OPTIMIZER: self._set_optimizer,
            Command.CONTROLLER: self._controller,
            Command.SAVE_STATES: self._save_states,
            Command.LOAD_STATES: self._load_states,
        }
        if cluster.server_modules:
            import_modules(cluster.server_modules)
        if cluster.stall_report > 0:
            self._reactor.add_timer(min(cluster.stall_report / 4, 5.0), self._report_stalls)
        self._reported: set[tuple[tuple[int, int], int]] = set()
        self._held: list[tuple[bytes, list[Any]]] | None = None  # value replies held while a message is handled
        self._routes: dict[bytes, bytes] = {}  # a worker's send-only socket -> where its replies go (HELLO)

    @property
    def name(self) -> str:
        """``'server <rank>'``."""
        return f"server {self._rank}"

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
                self._restore(self._cluster.resume_from)
            self._reactor.start()
            info = self._membership.register(self._cluster.server_rank)
            self._rank = info.rank
            if info.recovery:  # a replacement in a running job: the workers go on numbering their pushes
                self._reactor.call_soon(self._apply_saved_counts)
            log.info("%s serving on %s", self.name, self.address)
            # Wait for the end of the job. This wait has no deadline of its own: a job may
            # run for days. It ends with NodeFailedError when the scheduler dies (the
            # heartbeats notice within PS_HEARTBEAT_TIMEOUT).
            self._membership.shutdown(wait=True, timeout=None)
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop serving and release the sockets (idempotent); unblocks :meth:`run`."""
        self._tracker.fail_all(TransportError(f"{self.name} stopped"))
        self._reactor.stop()
        if self._shm_dir is not None:
            self._shm_dir.remove()
        with self._stop_lock:  # run() and an outside stop() may both get here
            if self._own_context:
                self._own_context = False
                self._ctx.term()

    def _report_stalls(self) -> None:
        """Log, once per round, sync rounds waiting longer than the stall limit."""
        everyone = {node_id(Role.WORKER, r) for r in range(self._cluster.num_workers)}
        for pid, rnd, pushed, age in self._shard.stalled(self._cluster.stall_report):
            if (pid, rnd) in self._reported:
                continue
            self._reported.add((pid, rnd))
            missing = ", ".join(node_name(n) for n in sorted(everyone - pushed))
            have = ", ".join(node_name(n) for n in sorted(pushed))
            log.warning("%s: round %d of key %d (offset %d) has waited %.0f s for %s (pushed: %s)",
                        self.name, rnd, pid[0], pid[1], age, missing, have)

    # -- checkpoints ---------------------------------------------------------------------
    def _restore(self, directory: str) -> None:
        """Load this server's shard of the checkpoint ``directory`` (before serving).

        Raises:
            CheckpointError: no complete checkpoint there, or it does not fit this job.
        """
        from pskv.optimizer import Optimizer, states

        rank = self._cluster.server_rank
        if rank < 0:
            raise CheckpointError("resuming from a checkpoint needs the server's rank (PSKV_SERVER_RANK; "
                                  "pskv launch sets it)")
        manifest = read_manifest(directory)
        if manifest.get("num_servers") != self._cluster.num_servers:
            raise CheckpointError(f"{directory} was written by {manifest.get('num_servers')} servers; this job has "
                                  f"{self._cluster.num_servers}")
        state = read_shard(directory, rank)
        self._shard.sync = state.sync
        for p in state.parts:
            self._shard.restore(p.key, p.offset, p.dtype, p.value, p.round, p.summed)
        self._saved_counts = {(p.key, p.offset): dict(p.counts or {}) for p in state.parts}
        if state.optimizer is not None:
            document = states.loads(state.optimizer)
            if document.optimizer is None:
                raise CheckpointError(f"{directory}: server {rank}'s optimizer state has no optimizer config")
            updater = Optimizer.from_config(document.optimizer).get_updater()
            updater.set_states(state.optimizer)
            self._shard.updater = updater
        log.info("server %d: restored %d part(s)%s from %s", rank, len(state.parts),
                 " and the optimizer state" if state.optimizer is not None else "", directory)

    def _apply_saved_counts(self) -> None:
        """Reactor thread: the push counts of the checkpoint this replacement server loaded.

        The workers replay every push they made since that checkpoint, numbered on from
        these counts (a whole-job restart, whose workers start again, does not get them).
        """
        for (key, offset), counts in self._saved_counts.items():
            part = self._shard.parts.get((key, offset))
            if part is not None:
                part.restored = False  # the workers will not init it again
                part.pushes = {w: PushLog(count=c) for w, c in counts.items()}
        log.warning("%s: replacement server; push counts of %d part(s) restored", self.name, len(self._saved_counts))

    def _save_checkpoint(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """Write this server's shard into the checkpoint directory the request names."""
        from pskv.optimizer import Updater

        directory = json_body(header).get("dir")
        if not isinstance(directory, str) or not directory:
            raise ProtocolError("SAVE_CHECKPOINT needs {dir: str}")
        updater = self._shard.updater
        optimizer = updater.get_states(dump_optimizer=True) if isinstance(updater, Updater) else None
        if updater is not None and optimizer is None:
            raise CheckpointError(f"{self.name}: its updater is not a pskv optimizer; it cannot be saved")
        saved = self._shard.snapshot()
        open_rounds = sum(1 for part, _ in saved if part.pushed)
        if open_rounds:
            log.warning("%s: checkpoint %s: %d part(s) have an open sync round; their pending pushes are not "
                        "saved", self.name, directory, open_rounds)
        state = ShardState(self._rank, self._cluster.num_servers, self._cluster.num_workers, self._shard.sync,
                           tuple(PartState(p.key, p.offset, p.dtype, value, p.round, p.summed,
                                           {w: log_.count for w, log_ in p.pushes.items()}) for p, value in saved),
                           optimizer)
        path = write_shard(directory, state)
        self._reply(identity, reply_frames(header, self._node_id(), {
            "file": str(path), "bytes": path.stat().st_size, "open_rounds": open_rounds}))

    def _on_reactor_failure(self, exc: BaseException) -> None:
        self._tracker.fail_all(TransportError(f"{self.name}'s network thread failed: {exc!r}"))

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
            if self._repeat(origin, identity, header):
                return
            handler(identity, header, buffers)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an ERROR reply; the server lives on
            if not isinstance(exc, KVStoreError):
                log.exception("%s: %s failed", self.name, header.command.name)
            self._reply(identity, error_frames(header, self._node_id(), type(exc).__name__, str(exc)))
        finally:
            self._current = None
            held, self._held = self._held, None
            for peer, reply in held:
                self._reactor.send_router(self._sid, peer, reply)

    # -- repeated requests (a worker resends after a reset connection) -------------------------
    def _repeat(self, origin: bytes, identity: bytes, header: Header) -> bool:
        """True if ``header`` repeats a request of its sender that was handled: answered again here.

        A worker resends every unanswered request when a reset connection comes back;
        some of them had arrived. The recent request ids of each socket requests come from
        are remembered (``_SEEN_PER_WORKER``; a socket belongs to one process, so a
        replacement process starts afresh): a repeat of one still being answered (a parked pull, a
        quiet push) is dropped; a short answer (acknowledgement, error) is sent again; a
        pushpull's values are gathered again for the rounds its pushes joined, without
        applying them twice; a pull is simply served again.
        """
        seen = self._seen.get(origin)
        if seen is None:
            seen = self._seen[origin] = OrderedDict()
        state = seen.get(header.request)
        if state is None:
            seen[header.request] = _IN_FLIGHT
            if len(seen) > _SEEN_PER_WORKER:
                seen.popitem(last=False)
            self._current = (seen, header.request)
            return False
        if state is _IN_FLIGHT:
            log.debug("%s: dropped a repeat of request %d of %s (being answered)", self.name, header.request,
                      node_name(header.sender))
            return True
        if type(state) is list:  # a short answer: the same again
            self._reactor.send_router(self._sid, identity, state)
            return True
        if state[0] is Command.PUSHPULL:
            self._current = None
            self._gather(identity, header, state[1], shared=state[2])
            return True
        self._current = (seen, header.request)  # a pull: served again
        seen[header.request] = _IN_FLIGHT
        return False

    def _node_id(self) -> int:
        return self._membership.node_id

    def _reply(self, identity: bytes, frames: list[Any]) -> None:
        """Send the reply to the message being handled (at once)."""
        if self._current is not None and len(frames) == 1:  # kept for a repeat of the request
            seen, request = self._current
            seen[request] = frames
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

    def _frames(self, header: Header, buffers: list[memoryview]) -> list[tuple[ArraySpec, np.ndarray[Any, Any]]]:
        return [(spec, frame_array(spec, buf)) for spec, buf in zip(header.arrays, buffers)]

    # -- handlers -----------------------------------------------------------------------
    def _init(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        items = self._frames(header, buffers)
        if json_body(header).get("overwrite") is True:  # broadcast to existing keys
            parts = [(self._shard.check(spec.key, spec.offset, spec.dtype, data.size, "broadcast"), data)
                     for spec, data in items]
            for part, data in parts:  # in place: everyone finished reading at the barrier before
                np.copyto(part.value, to_storage(part.dtype, data.reshape(-1)))
            self._reply(identity, reply_frames(header, self._node_id()))
            return
        for spec, _ in items:
            existing = self._shard.parts.get((spec.key, spec.offset))
            if existing is not None and not existing.restored:
                raise KVStoreError(f"duplicate init of key {spec.key}")
        summed = json_body(header).get("summed") is True
        for spec, data in items:
            if not self._shard.accept_init(spec.key, spec.offset, spec.dtype, data.size):  # restored: kept
                self._shard.init(spec.key, spec.offset, spec.dtype, data, summed=summed)
        self._reply(identity, reply_frames(header, self._node_id()))

    def _checked(self, header: Header, buffers: list[memoryview], op: str) -> list[tuple[Part, np.ndarray[Any, Any]]]:
        items = self._frames(header, buffers)
        return [(self._shard.check(spec.key, spec.offset, spec.dtype, data.size, op), data) for spec, data in items]

    def _shm_pushes(self, header: Header, body: dict[str, Any], op: str) -> list[tuple[Part, np.ndarray[Any, Any]]]:
        """The parts a co-located worker pushed through its shared slots (body ``shm``)."""
        listed = body.get("shm")
        if listed is None:
            return []
        if not _int_lists(listed, 2):
            raise ProtocolError(f"{op}: shm needs [[key, offset], ...]")
        out = []
        for key, offset in listed:
            part = self._shard.part(key, offset, op)
            slot = part.slots.get(header.sender)
            if slot is None:
                raise InvalidArgumentError(f"{op} of key {key}: the part has no shared slot for this worker")
            out.append((part, slot))
        return out

    def _apply_pushes(self, header: Header, buffers: list[memoryview],
                      op: str) -> tuple[list[tuple[Part, int]], bool, dict[str, Any]]:
        """Validate and apply every push of a PUSH / PUSHPULL message: ``([(part, round joined)], shared, body)``.

        Each part the message names counts as the sender's next push of that part even
        when the message is refused (:meth:`ServerShard.skip_push`): the worker counted
        it when sending, and its pulls name pushes by number.
        """
        try:
            body = json_body(header)
            shm = self._shm_pushes(header, body, op)
            checked = shm + self._checked(header, buffers, op)
        except Exception:
            self._skip_pushes(header)
            raise
        joined = []
        for n, (part, data) in enumerate(checked):
            try:
                joined.append((part, self._shard.push(part, header.sender, data)))
            except Exception:  # that push counted itself; the rest of the message never runs
                for later, _ in checked[n + 1:]:
                    self._shard.skip_push(later, header.sender)
                raise
        return joined, bool(shm), body

    def _skip_pushes(self, header: Header) -> None:
        """Count every existing part a refused push message names (see :meth:`_apply_pushes`)."""
        named = [(a.key, a.offset) for a in header.arrays]
        try:
            listed = json_body(header).get("shm")
        except ProtocolError:
            listed = None
        if _int_lists(listed, 2):
            named += [(w[0], w[1]) for w in listed]
        for pid in dict.fromkeys(named):
            part = self._shard.parts.get(pid)
            if part is not None:
                self._shard.skip_push(part, header.sender)

    def _push(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        _, _, body = self._apply_pushes(header, buffers, "push")
        if body.get("quiet") is not True:
            self._reply(identity, reply_frames(header, self._node_id()))  # a bare acknowledgement
        # else the worker learns it succeeded from its next reply (a failure is answered)

    def _pull(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        body = json_body(header)
        wanted = body.get("parts")
        if not _int_lists(wanted, 3):
            raise ProtocolError("PULL needs parts: [[key, offset, push number], ...]")
        parts = [(self._shard.part(k, o, "pull"), n) for k, o, n in wanted]
        self._gather(identity, header, parts, shared=body.get("shm") is True, by_push=True)

    def _pushpull(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        joined, shared, _ = self._apply_pushes(header, buffers, "pushpull")
        self._gather(identity, header, joined, shared=shared)

    def _gather(self, identity: bytes, header: Header, parts: list[tuple[Part, int]], shared: bool = False,
                by_push: bool = False) -> None:
        """Reply with every part's value once each has completed its round.

        Each part comes with the round it must include or, with ``by_push``, the number
        of the sender's push of that part whose round it must include (a push that has
        not arrived yet is waited for).

        If a worker has died, a round that still needs pushes can never complete: the
        request fails at once with NodeFailedError naming the dead worker(s).
        """
        if not parts:
            self._reply(identity, reply_frames(header, self._node_id()))
            return
        if shared and any(part.buffers is None for part, _ in parts):
            raise InvalidArgumentError("a shared-memory pull names a part that is not in shared memory")
        gather = _Gather(self, identity, header, len(parts), snapshot=self._shard.updater is not None, shared=shared)
        if self._current is not None:  # what a repeat of this request gets (see _repeat)
            gather.record = (self._current[0], header.request,
                             (Command.PUSHPULL, list(parts), shared) if header.command is Command.PUSHPULL
                             else (Command.PULL,))
            self._current = None
        sender = header.sender
        if self._dead_workers and self._shard.sync and any(
            _must_wait(part, self._shard.round_of_push(part, sender, r) if by_push else r) for part, r in parts
        ):
            gather.fail(self._dead_reason())
            return
        for i, (part, r) in enumerate(parts):
            ready = partial(gather.ready, i)
            if by_push:
                self._shard.pull_after_push(part, sender, r, ready, gather.fail)
            else:
                self._shard.pull(part, r, ready, gather.fail)

    def _dead_names(self) -> str:
        return ", ".join(node_name(n) for n in sorted(self._dead_workers))

    def _dead_reason(self) -> str:
        return f"{self._dead_names()} died, so the sync round this request waits for can never complete"

    def _on_node_dead(self, nid: int) -> None:
        """Membership callback (reactor thread): fail waits that a dead worker makes impossible."""
        role, _ = node_role_rank(nid)
        if role is Role.WORKER and self._shard.sync and self._cluster.recovery_timeout > 0:
            # its rounds keep waiting: a replacement may take over (the stall report names it)
            self._recovering[nid] = time.monotonic()
            log.warning("%s: %s died; waiting up to %g s for a replacement", self.name, node_name(nid),
                        self._cluster.recovery_timeout)
            return
        if role is Role.WORKER and self._shard.sync:
            self._dead_workers.add(nid)
            failed = self._shard.fail_waiting(self._dead_reason())
            if failed:
                log.error("%s: failed %d waiting pull(s): %s", self.name, failed, self._dead_reason())

    def _check_recovery(self) -> None:
        """Timer: dead workers not replaced within the recovery timeout fail the waits that need them."""
        limit = time.monotonic() - self._cluster.recovery_timeout
        for nid in [n for n, since in self._recovering.items() if since < limit]:
            del self._recovering[nid]
            self._dead_workers.add(nid)
            failed = self._shard.fail_waiting(self._dead_reason())
            log.error("%s: %s was not replaced in time; failed %d waiting pull(s)", self.name, node_name(nid), failed)

    def _on_node_alive(self, nid: int) -> None:
        """Membership callback: a dead worker was replaced (the REJOIN does the rest)."""
        self._recovering.pop(nid, None)
        self._dead_workers.discard(nid)

    def _rejoin(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """A replacement process of a dead worker: its push numbering restarts (ServerShard.forget_pushes)."""
        worker = header.sender
        self._recovering.pop(worker, None)
        self._dead_workers.discard(worker)
        self._shard.forget_pushes(worker)
        log.warning("%s: %s rejoined (a replacement process)", self.name, node_name(worker))
        self._reply(identity, reply_frames(header, self._node_id()))

    def _hello(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """A worker's send-only socket gets its replies on this (the HELLO's) socket.

        Only messages arriving from that socket are rerouted: a peer can redirect the
        answers to its own requests, no one else's.
        """
        tx = json_body(header).get("tx")
        if not isinstance(tx, str) or len(tx) != 16 or any(c not in "0123456789abcdef" for c in tx):
            raise ProtocolError("HELLO needs {tx: 16 lowercase hex digits}")
        self._routes[TX_PREFIX + tx.encode()] = identity
        self._reply(identity, reply_frames(header, self._node_id()))

    def _sync(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """Answered at once: confirms the worker's earlier (quiet) messages were handled."""
        self._reply(identity, reply_frames(header, self._node_id()))

    def _join(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """The sender ran out of data: rounds that only waited for it complete (ServerShard.join)."""
        completed = self._shard.join(header.sender)
        if completed:
            log.info("%s: %s joined; %d round(s) completed without it", self.name, node_name(header.sender),
                     len(completed))
        self._reply(identity, reply_frames(header, self._node_id()))

    def _set_mode(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        sync = json_body(header).get("sync")
        if not isinstance(sync, bool):
            raise ProtocolError("SET_MODE needs {sync: bool}")
        if self._shard.parts and sync != self._shard.sync:
            raise InvalidArgumentError("the aggregation mode cannot change once keys exist")
        self._shard.sync = sync
        self._reply(identity, reply_frames(header, self._node_id()))

    def _set_optimizer(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        from pskv.optimizer import Optimizer, Updater

        optimizer = Optimizer.from_config(json_body(header))  # a config, never code
        updater = self._shard.updater
        if isinstance(updater, Updater):
            updater.set_optimizer(optimizer)  # new hyperparameters, same state
        else:
            self._shard.updater = optimizer.get_updater()
        self._reply(identity, reply_frames(header, self._node_id()))

    def _controller(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        body = json_body(header)
        head, text = body.get("head"), body.get("body", "")
        if type(head) is not int or not isinstance(text, str):
            raise ProtocolError("CONTROLLER needs {head: int, body: str}")
        fn = find_controller(head)
        if fn is None:
            raise InvalidArgumentError(
                f"{self.name} has no controller for head {head} (register one with @pskv.server.controller "
                "in a module named by PSKV_SERVER_MODULES)"
            )
        answer = fn(head, text)
        self._reply(identity, reply_frames(header, self._node_id(), {"answer": "" if answer is None else str(answer)}))

    def _states_path(self, header: Header) -> str:
        path = json_body(header).get("path")
        if not isinstance(path, str) or not path:
            raise ProtocolError("state commands need {path: str}")
        return f"{path}.server{self._rank}"

    def _save_states(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        from pskv.optimizer import Updater

        if not isinstance(self._shard.updater, Updater):
            raise OptimizerStateError(f"{self.name} has no optimizer (call set_optimizer first)")
        path = self._states_path(header)
        self._shard.updater.save_states(path, dump_optimizer=bool(json_body(header).get("dump_optimizer")))
        self._reply(identity, reply_frames(header, self._node_id(), {"file": path}))

    def _load_states(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        from pskv.optimizer import Optimizer, Updater, states

        path = self._states_path(header)
        if isinstance(self._shard.updater, Updater):
            self._shard.updater.load_states(path)
        else:
            document = states.load(path)
            if document.optimizer is None:
                raise OptimizerStateError(f"{self.name}: {path} holds no optimizer config and no optimizer is set")
            updater = Optimizer.from_config(document.optimizer).get_updater()
            updater.load_states(path)
            self._shard.updater = updater
        self._reply(identity, reply_frames(header, self._node_id(), {"file": path}))


_IN_FLIGHT = object()  # a request being handled (or a quiet push: answered only if it failed)
_SEEN_PER_WORKER = 8192  # request ids remembered per worker, for repeats after a reset connection


def _must_wait(part: Part, min_round: int | None) -> bool:
    """True if a pull for ``min_round`` (None: its push has not arrived) cannot be answered now."""
    return min_round is None or part.round < min_round


def _int_lists(value: Any, n: int) -> TypeGuard[list[list[int]]]:
    """True if ``value`` is a list of lists of ``n`` ints (JSON from a worker)."""
    if type(value) is not list:
        return False
    for w in value:
        if type(w) is not list or len(w) != n:
            return False
        for v in w:
            if type(v) is not int:
                return False
    return True


def _ints(values: Any) -> str:
    return ",".join(map(str, values))


class _Gather:
    """Collects the parts of one pull / pushpull and sends one reply (or one error)."""

    __slots__ = ("_node", "_identity", "_results", "_remaining", "_header", "_snapshot", "_shared", "_done",
                 "record")

    def __init__(self, node: ServerNode, identity: bytes, header: Header, n: int, snapshot: bool,
                 shared: bool = False) -> None:
        self._node = node
        self._identity = identity
        self._shared = shared  # reply with shared-buffer indices instead of data
        self._results: list[Part | None] = [None] * n
        self._remaining = n
        self._header = header
        self._snapshot = snapshot
        self._done = False
        self.record: tuple[Any, int, Any] | None = None  # (seen, request id, state once answered)

    def _send(self, frames: list[Any]) -> None:
        if self.record is not None:
            seen, request, state = self.record
            seen[request] = state
        self._node._answer(self._identity, frames)

    def ready(self, i: int, part: Part) -> None:
        if self._done:
            return
        self._results[i] = part
        self._remaining -= 1
        if self._remaining:
            return
        self._done = True
        sender = self._node._node_id()
        if self._shared:
            parts = [p for p in self._results if p is not None]
            # {"buffers": [...], "rounds": [...]}, formatted directly: this runs for every pull
            body = f'{{"buffers":[{_ints(p.buffer_index() for p in parts)}],"rounds":[{_ints(p.round for p in parts)}]}}'
            self._send(encode(Header(Command.REPLY, self._header.request, sender, (), 0, body)))
            return
        specs, data = [], []
        for p in self._results:
            assert p is not None
            data.append(p.wire_value(self._snapshot))
            specs.append(ArraySpec(p.key, p.dtype, (p.value.size,), p.offset, p.round))
        self._send(reply_frames(self._header, sender, arrays=tuple(specs), data=data))

    def fail(self, reason: str) -> None:
        """Answer with NodeFailedError naming the dead worker(s) (the round cannot complete)."""
        if self._done:
            return
        self._done = True
        self._send(error_frames(self._header, self._node._node_id(), "NodeFailedError", reason,
                                node=self._node._dead_names()))
