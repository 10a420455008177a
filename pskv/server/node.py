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
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq

from pskv.cluster import Membership, RequestTracker
from pskv.cluster.messages import error_frames, json_body, reply_frames
from pskv.config import ClusterConfig
from pskv.errors import InvalidArgumentError, KVStoreError, OptimizerStateError, ProtocolError, TransportError
from pskv.protocol import ArraySpec, Command, Header, Role, decode, frame_array, node_id, node_name, node_role_rank
from pskv.server.controllers import find_controller, import_modules
from pskv.server.shard import Part, ServerShard, to_storage
from pskv.transport import IO_THREADS, Reactor
from pskv.transport.addresses import bind_host
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
        self._shm_dir = ShmDirectory(f"{job_prefix(cluster.job_id)}server-") if cluster.shm else None
        shm_info = {"dir": self._shm_dir.path, "host": host_id()} if self._shm_dir else None
        self._membership = Membership(cluster, self._reactor, self._tracker, Role.SERVER, self.address,
                                      on_dead=self._on_node_dead, shm=shm_info)
        self._dead_workers: set[int] = set()
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
            Command.SET_OPTIMIZER: self._set_optimizer,
            Command.CONTROLLER: self._controller,
            Command.SAVE_STATES: self._save_states,
            Command.LOAD_STATES: self._load_states,
        }
        if cluster.server_modules:
            import_modules(cluster.server_modules)
        if cluster.stall_report > 0:
            self._reactor.add_timer(min(cluster.stall_report, 5.0), self._report_stalls)
        self._reported: set[tuple[tuple[int, int], int]] = set()

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
        """
        self._reactor.start()
        try:
            info = self._membership.register(self._cluster.server_rank)
            self._rank = info.rank
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
        try:
            role, rank = node_role_rank(header.sender)
            if role is not Role.WORKER or rank >= self._cluster.num_workers:
                raise ProtocolError(f"sender {header.sender} is not a worker of this job")
            if handler is None:
                raise ProtocolError(f"a server does not handle {header.command.name}")
            handler(identity, header, buffers)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an ERROR reply; the server lives on
            if not isinstance(exc, KVStoreError):
                log.exception("%s: %s failed", self.name, header.command.name)
            self._reply(identity, error_frames(header, self._node_id(), type(exc).__name__, str(exc)))

    def _node_id(self) -> int:
        return self._membership.node_id

    def _reply(self, identity: bytes, frames: list[Any]) -> None:
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
            if (spec.key, spec.offset) in self._shard.parts:
                raise KVStoreError(f"duplicate init of key {spec.key}")
        for spec, data in items:
            self._shard.init(spec.key, spec.offset, spec.dtype, data)
        self._reply(identity, reply_frames(header, self._node_id()))

    def _checked(self, header: Header, buffers: list[memoryview], op: str) -> list[tuple[Part, np.ndarray[Any, Any]]]:
        items = self._frames(header, buffers)
        return [(self._shard.check(spec.key, spec.offset, spec.dtype, data.size, op), data) for spec, data in items]

    def _shm_pushes(self, header: Header, op: str) -> list[tuple[Part, np.ndarray[Any, Any]]]:
        """The parts a co-located worker pushed through its shared slots (body ``shm``)."""
        listed = json_body(header).get("shm")
        if listed is None:
            return []
        if not isinstance(listed, list) or not all(
            isinstance(w, list) and len(w) == 2 and all(type(v) is int for v in w) for w in listed
        ):
            raise ProtocolError(f"{op}: shm needs [[key, offset], ...]")
        out = []
        for key, offset in listed:
            part = self._shard.part(key, offset, op)
            slot = part.slots.get(header.sender)
            if slot is None:
                raise InvalidArgumentError(f"{op} of key {key}: the part has no shared slot for this worker")
            out.append((part, slot))
        return out

    def _push(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        checked = self._checked(header, buffers, "push") + self._shm_pushes(header, "push")
        rounds = [self._shard.push(part, header.sender, data) for part, data in checked]
        self._reply(identity, reply_frames(header, self._node_id(), {"rounds": rounds}))

    def _pull(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        wanted = json_body(header).get("parts")
        if not isinstance(wanted, list) or not all(
            isinstance(w, list) and len(w) == 3 and all(type(v) is int for v in w) for w in wanted
        ):
            raise ProtocolError("PULL needs parts: [[key, offset, min_round], ...]")
        parts = [(self._shard.part(k, o, "pull"), r) for k, o, r in wanted]
        self._gather(identity, header, parts, shared=json_body(header).get("shm") is True)

    def _pushpull(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        shm = self._shm_pushes(header, "pushpull")
        checked = shm or self._checked(header, buffers, "pushpull")
        rounds = [self._shard.push(part, header.sender, data) for part, data in checked]
        self._gather(identity, header, [(part, r) for (part, _), r in zip(checked, rounds)], shared=bool(shm))

    def _gather(self, identity: bytes, header: Header, parts: list[tuple[Part, int]], shared: bool = False) -> None:
        """Reply with every part's value once each has completed its round.

        If a worker has died, a round that still needs pushes can never complete: the
        request fails at once with NodeFailedError naming the dead worker(s).
        """
        if not parts:
            self._reply(identity, reply_frames(header, self._node_id()))
            return
        if shared and any(part.buffers is None for part, _ in parts):
            raise InvalidArgumentError("a shared-memory pull names a part that is not in shared memory")
        gather = _Gather(len(parts), lambda frames: self._reply(identity, frames), header, self._node_id(),
                         snapshot=self._shard.updater is not None, shared=shared)
        if self._dead_workers and self._shard.sync and any(part.round < r for part, r in parts):
            gather.fail(self._dead_reason(), self._dead_names())
            return
        for i, (part, min_round) in enumerate(parts):
            self._shard.pull(part, min_round, _bind(gather.ready, i),
                             lambda reason: gather.fail(reason, self._dead_names()))

    def _dead_names(self) -> str:
        return ", ".join(node_name(n) for n in sorted(self._dead_workers))

    def _dead_reason(self) -> str:
        return f"{self._dead_names()} died, so the sync round this request waits for can never complete"

    def _on_node_dead(self, nid: int) -> None:
        """Membership callback (reactor thread): fail waits that a dead worker makes impossible."""
        role, _ = node_role_rank(nid)
        if role is Role.WORKER and self._shard.sync:
            self._dead_workers.add(nid)
            failed = self._shard.fail_waiting(self._dead_reason())
            if failed:
                log.error("%s: failed %d waiting pull(s): %s", self.name, failed, self._dead_reason())

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


def _bind(fn: Callable[[int, Part], None], i: int) -> Callable[[Part], None]:
    def call(part: Part) -> None:
        fn(i, part)
    return call


class _Gather:
    """Collects the parts of one pull / pushpull and sends one reply (or one error)."""

    __slots__ = ("_results", "_remaining", "_send", "_header", "_sender", "_snapshot", "_shared", "_done")

    def __init__(self, n: int, send: Callable[[list[Any]], None], header: Header, sender: int,
                 snapshot: bool, shared: bool = False) -> None:
        self._shared = shared  # reply with shared-buffer indices instead of data
        self._results: list[Part | None] = [None] * n
        self._remaining = n
        self._send = send
        self._header = header
        self._sender = sender
        self._snapshot = snapshot
        self._done = False

    def ready(self, i: int, part: Part) -> None:
        if self._done:
            return
        self._results[i] = part
        self._remaining -= 1
        if self._remaining:
            return
        self._done = True
        if self._shared:
            parts = [p for p in self._results if p is not None]
            body = {"buffers": [p.buffer_index() for p in parts], "rounds": [p.round for p in parts]}
            self._send(reply_frames(self._header, self._sender, body))
            return
        specs, data = [], []
        for p in self._results:
            assert p is not None
            data.append(p.wire_value(self._snapshot))
            specs.append(ArraySpec(p.key, p.dtype, (p.value.size,), p.offset, p.round))
        self._send(reply_frames(self._header, self._sender, arrays=tuple(specs), data=data))

    def fail(self, reason: str, node: str) -> None:
        if self._done:
            return
        self._done = True
        self._send(error_frames(self._header, self._sender, "NodeFailedError", reason, node=node))
