"""The distributed stores: ``dist_sync`` (alias ``dist``), ``dist_async``, ``dist_sync_device``.

A worker process's store talks to the servers through a
:class:`~pskv.worker.client.WorkerClient`. Each call first reduces the values of a key
locally (the per-device list is summed in this process — on the values' device for the
``_device`` types), then sends **one message per server** holding every part of every
key of the call, and waits for the replies (each wait bounded by
``PSKV_REQUEST_TIMEOUT``; a dead server or scheduler raises
:class:`~pskv.errors.NodeFailedError` instead).

Consistency (sync): a push returns once the servers have the data; a later pull waits
for the round that push joined, so every worker sees the same values after the same
pushes. Operations of this process run under the same engine as the local store:
per-key issue order, priorities, ``block=False`` handles.

Pipelining: a pull names "the round of this worker's ``n``-th push of the part" (``n``
counted here, per part) rather than a round number learnt from a push's reply, and the
server resolves it (parking the pull if that push has not even arrived yet). So a pull
need not wait for the previous push's acknowledgement: a push hands its keys on to the
next operation as soon as it is sent (its handle still completes only when the servers
hold the data), and ``push(block=False)`` followed by ``pull()`` costs one round trip,
like MXNet's asynchronous push. A push reuses a key's buffers (its shared-memory slot,
its reduce buffer) only after the previous push of that key was acknowledged. A
non-blocking push is *quiet*: the server answers it only if it fails, and the next
reply from that server (usually the pull's) confirms it — its handle is done once
confirmed; waiting on it, or ``wait()``, asks the server (``SYNC``) if nothing follows.

Threads: small CPU calls (up to ``_QUICK_BYTES``) made with ``block=False`` send their
requests from the caller's thread when their keys are idle, and finish (copy the reply
out, record the acknowledgement) on the network thread when the reply arrives; blocking
calls on idle keys send and wait in the caller's thread. Only bigger calls, and calls
queued behind earlier work on their keys, use the engine's worker threads.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import weakref
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pskv.arrays import (
    ArrayMeta,
    CpuKernels,
    describe,
    empty,
    fan_out_many,
    from_wire,
    itemsize,
    numpy_dtype,
    sum_into_many,
    wire_view,
)
from pskv.config import ClusterConfig, Config
from pskv.errors import (
    DuplicateKeyError,
    InvalidArgumentError,
    InvalidTypeError,
    NodeFailedError,
    NotSupportedError,
    ProtocolError,
    StoreClosedError,
    UnknownKeyError,
)
from pskv.kvstore.base import KVStoreBase
from pskv.kvstore.checks import check_like, check_priority
from pskv.kvstore.engine import Deferred, Engine, OpHandle
from pskv.kvstore.keys import Key, KeyKind, as_key_list, pair_up
from pskv.kvstore.rows import apply_row_plan, plan_row_pulls
from pskv.partition import server_key, split
from pskv.protocol import ArraySpec, Command, Header, Role, encode, frame_array, node_id, node_name
from pskv.transport.shm import host_id, map_array, part_file
from pskv.worker import WorkerClient

__all__ = ["DistStore"]

log = logging.getLogger("pskv.dist")

# Calls on CPU values of at most this many bytes are "quick": with block=False they send
# from the caller's thread, and their replies are handled on the network thread — a
# thread hand-off (~0.1-0.4 ms) costs more than their copies.
_QUICK_BYTES = 256 << 10
_QUIET = json.dumps({"quiet": True})  # the body of a socket push answered only if it fails


@dataclass
class _SharedPart:
    """A part's shared buffers on this host: this worker's push slot and the two values."""

    slot: np.ndarray[Any, Any]
    values: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]


@dataclass
class _Key:
    """What a worker knows about one key: its layout on the servers and its pushes so far."""

    key: Key
    skey: int
    meta: ArrayMeta  # of the value given to init (shape, dtype, kind, device)
    parts: list[tuple[int, int, int]]  # (server, offset, length)
    pushes: list[int]  # per part: pushes (and pushpulls) this worker sent; a pull names the last
    acks: list[Any] = field(default_factory=list)  # replies of the key's last push (maybe outstanding)
    shm: list[_SharedPart | None] = field(default_factory=list)  # per part, when shared with its server
    send: Any = None  # CPU buffer of the meta's kind: the locally reduced value
    outgoing: Any = None  # what the current operation sends: the caller's value or `send`
    recv: Any = None  # CPU buffer assembling a split value
    groups: dict[bool, Any] = field(default_factory=dict)  # _by_server of this key alone, per shared_ok
    nbytes: int = 0  # of one value; set with the layout

    @property
    def shared(self) -> bool:
        """True if some part of the key goes through shared memory."""
        return any(p is not None for p in self.shm)


class DistStore(KVStoreBase):
    """A worker's handle on the parameter server.

    Use :func:`pskv.create` with a ``dist_*`` name inside a process started by
    ``pskv launch`` (or with the ``DMLC_*`` environment set).

    Args:
        name: the store type.
        config: local settings (kernels, engine).
        cluster: the cluster contract (default: from the environment).
    """

    def __init__(self, name: str = "dist_sync", config: Config | None = None,
                 cluster: ClusterConfig | None = None, context: Any = None) -> None:
        self._type = name
        self._sync = "async" not in name
        self._on_device = "device" in name
        self._config = Config.from_env() if config is None else config
        self._cluster = ClusterConfig.from_env() if cluster is None else cluster
        self._cluster.require_cluster()
        self._kernels = CpuKernels(self._config.kernel_threads, self._config.kernel_parallel_bytes)
        self._engine = Engine(self._config.engine_threads, name=f"pskv-{name}")
        self._keys: dict[Key, _Key] = {}
        self._key_kind = KeyKind()
        self._closed = False
        self._barrier_before_exit = True
        # With PSKV_SERVER_RECOVERY every push since the newest checkpoint is kept (copied)
        # per server, to be sent again to a replacement server: (command, pending, specs, data, body).
        self._replay: dict[int, list[tuple[Command, Any, tuple[ArraySpec, ...], list[Any], str]]] | None = (
            defaultdict(list) if self._cluster.server_recovery else None)
        self._replay_lock = threading.Lock()
        # A weak reference: a bound method would make store and client a reference cycle, and
        # the store's shared-memory maps would then live until the garbage collector runs.
        recover = weakref.WeakMethod(self._recover_server)

        def on_server_replaced(server: int) -> None:
            method = recover()
            if method is not None:
                method(server)
        self._client = WorkerClient(self._cluster, context,
                                    on_server_replaced=on_server_replaced if self._cluster.server_recovery else None)
        try:
            info = self._client.connect()
            self._rank = info.rank
            self._recovery = info.recovery
            here = host_id()
            self._shm_dirs: dict[int, str] = {}
            if self._cluster.uses_shm and self._sync:
                self._shm_dirs = {s: shm["dir"] for s, shm in enumerate(info.server_shm)
                                  if shm is not None and shm.get("host") == here}
            self._num_workers = info.num_workers
            self._num_servers = info.num_servers
            if self._recovery:  # the job runs already: nobody else is at a creation barrier
                log.warning("worker %d: a replacement process joins the running job (is_recovery)", self._rank)
            else:
                if self._rank == 0:
                    body = json.dumps({"sync": self._sync})
                    self._wait_all([self._client.request(s, Command.SET_MODE, body=body, what="set mode")
                                    for s in range(self._num_servers)])
                self.barrier()
        except BaseException:
            self._client.close()
            raise

    # -- properties ---------------------------------------------------------------------
    @property
    def type(self) -> str:
        """The type name given to ``create``."""
        return self._type

    @property
    def rank(self) -> int:
        """This worker's rank."""
        return self._rank

    @property
    def num_workers(self) -> int:
        """Number of workers in the job."""
        return self._num_workers

    @property
    def is_recovery(self) -> bool:
        """True in a process that replaced a dead worker of a running job (``PSKV_RECOVERY_TIMEOUT``).

        Such a process skips the collective steps the others did long ago: ``init``
        registers the keys without sending values or meeting at a barrier (pulls return
        the servers' current values), ``set_optimizer`` keeps the servers' optimizer, and
        ``broadcast`` of existing keys pulls them. Its pushes join the current rounds.
        Explicit ``barrier()`` calls are not skipped: guard the ones the others have
        passed with ``if not kv.is_recovery`` (as with MXNet).
        """
        return self._recovery

    @classmethod
    def is_capable(cls, capability: str) -> bool:
        """True for ``'optimizer'`` (the servers run it) and ``'row_sparse_pull'``.

        Raises:
            InvalidArgumentError: unknown capability.
        """
        cls._capability(capability)
        return True

    # -- plumbing -----------------------------------------------------------------------
    def _check_open(self, op: str) -> None:
        if self._closed:
            raise StoreClosedError(f"cannot {op}: the store is closed")

    def _timeout(self, timeout: float | None) -> float:
        return self._cluster.request_timeout if timeout is None else timeout

    def _wait_all(self, pendings: Sequence[Any], timeout: float | None = None) -> list[Any]:
        limit = self._timeout(timeout)
        return [p.wait(limit) for p in pendings]

    def _key_list(self, key: Any, creates: bool = False) -> tuple[list[Key], bool]:
        keys, single = as_key_list(key)
        self._key_kind.check(keys, fix=creates)
        return keys, single

    def _record(self, key: Key, op: str) -> _Key:
        rec = self._keys.get(key)
        if rec is None:
            raise UnknownKeyError(key, op)
        return rec

    @staticmethod
    def _check_like(rec: _Key, arrays: Sequence[Any], op: str) -> None:
        check_like(rec.key, rec.meta, arrays, op)

    def _submit(self, op: str, keys: Sequence[Key], priority: int, fn: Callable[[], Any], block: bool,
                timeout: float | None, quick: bool = False) -> Any:
        return self._engine.submit(op, keys, check_priority(priority), fn, block, self._timeout(timeout), quick)

    def _reduce(self, pairs: Sequence[tuple[_Key, list[Any]]]) -> None:
        """Set each key's outgoing buffer: its one CPU value as is, else the sum of its values.

        A single CPU value is sent without a copy (which is why a value given to a
        non-blocking push must not change before its handle is done); several values,
        or values on a GPU, are summed into the key's CPU send buffer.
        """
        to_sum = []
        for rec, vals in pairs:
            if len(vals) == 1 and describe(vals[0]).device == "cpu":
                rec.outgoing = vals[0]
                continue
            if rec.send is None:
                rec.send = empty(rec.meta, device="cpu")
            rec.outgoing = rec.send
            if self._on_device and len(vals) > 1 and describe(vals[0]).device != "cpu":
                acc = empty(rec.meta, device=describe(vals[0]).device)  # sum where the values live
                sum_into_many([(acc, vals)], self._kernels)
                vals = [acc]
            to_sum.append((rec.send, vals))
        sum_into_many(to_sum, self._kernels)

    def _by_server(self, recs: Sequence[_Key], shared_ok: bool) -> dict[tuple[int, bool], list[tuple[_Key, int]]]:
        """Parts grouped by (server, through shared memory?): one message per group (do not modify)."""
        if len(recs) == 1:  # a key's own grouping never changes: computed once
            cached = recs[0].groups.get(shared_ok)
            if cached is None:
                cached = recs[0].groups[shared_ok] = self._group(recs, shared_ok)
            return cached  # type: ignore[no-any-return]
        return self._group(recs, shared_ok)

    @staticmethod
    def _group(recs: Sequence[_Key], shared_ok: bool) -> dict[tuple[int, bool], list[tuple[_Key, int]]]:
        groups: dict[tuple[int, bool], list[tuple[_Key, int]]] = defaultdict(list)
        for rec in recs:
            for i, (server, _, _) in enumerate(rec.parts):
                shared = shared_ok and bool(rec.shm) and rec.shm[i] is not None
                groups[(server, shared)].append((rec, i))
        return dict(groups)

    @staticmethod
    def _spec(rec: _Key, i: int) -> ArraySpec:
        _, offset, length = rec.parts[i]
        return ArraySpec(rec.skey, rec.meta.dtype, (length,), offset)

    @staticmethod
    def _slice(rec: _Key, buffer: Any, i: int) -> np.ndarray[Any, Any]:
        _, offset, length = rec.parts[i]
        return wire_view(buffer)[offset: offset + length]

    def _send_values(self, command: Command, recs: Sequence[_Key], priority: int, body: str = "",
                     timeout: float | None = None, quiet: bool = False) -> dict[Any, Any]:
        """One ``command`` message per server with every part of ``recs`` (from their outgoing buffers).

        Parts a co-located server holds in shared memory (pushes only) are copied into
        this worker's slot; the message then only names them. Pushes and pushpulls are
        counted per part as they are queued (pulls name them by number). A ``quiet``
        push is answered only if it fails (see :meth:`WorkerClient.confirm`).
        """
        pendings = {}
        pushes = command in (Command.PUSH, Command.PUSHPULL)
        limit = self._timeout(timeout)
        for (server, shared), items in self._by_server(recs, pushes).items():
            if shared:
                for rec, i in items:
                    np.copyto(rec.shm[i].slot, self._slice(rec, rec.outgoing, i))  # type: ignore[union-attr]
                # {"shm": [[key, offset], ...], "quiet": true}, formatted directly (every push)
                listed = ",".join(f"[{rec.skey},{rec.parts[i][1]}]" for rec, i in items)
                text = f'{{"shm":[{listed}],"quiet":true}}' if quiet else f'{{"shm":[{listed}]}}'
                pending = self._client.request(server, command, body=text, priority=priority, timeout=limit,
                                               quiet=quiet)
            else:
                specs = tuple(self._spec(rec, i) for rec, i in items)
                data = [self._slice(rec, rec.outgoing, i) for rec, i in items]
                pending = self._client.request(server, command, specs, data, _QUIET if quiet else body, priority,
                                               timeout=limit, quiet=quiet)
                if pushes and self._replay is not None:  # kept until the next checkpoint
                    with self._replay_lock:
                        self._replay[server].append((command, pending, specs, [np.array(d, copy=True) for d in data],
                                                     body))
            if pushes:
                for rec, i in items:
                    rec.pushes[i] += 1
            pendings[(server, shared)] = (items, pending)
        return pendings

    def _collect(self, pendings: dict[Any, Any], timeout: float | None) -> dict[int, Any]:
        """Wait for replies; returns the received value of each key (a CPU array of its kind)."""
        limit = self._timeout(timeout)
        values: dict[int, Any] = {}
        for items, pending in pendings.values():
            header = pending.wait(limit)
            if header.body and not header.arrays:
                reply = json.loads(header.body)
                if "buffers" in reply:  # the values are in shared memory
                    self._read_shared(items, reply, values, pending.node)
                continue
            if not header.arrays:  # an acknowledgement without data (init)
                continue
            if len(header.arrays) != len(items):
                raise ProtocolError(
                    f"{node_name(pending.node)} answered {len(header.arrays)} arrays for {len(items)} requested parts"
                )
            for (rec, i), spec, buf in zip(items, header.arrays, pending.buffers):
                frame = frame_array(spec, buf)
                if spec.offset != rec.parts[i][1] or frame.size != rec.parts[i][2]:
                    raise ProtocolError(f"{node_name(pending.node)}'s reply for key {rec.key!r} does not match its layout")
                self._place(rec, i, frame, values)
        return values

    def _place(self, rec: _Key, i: int, frame: np.ndarray[Any, Any], values: dict[int, Any]) -> None:
        """Record part ``i`` of ``rec``'s received value (assembling split keys)."""
        if len(rec.parts) == 1:
            values[id(rec)] = from_wire(frame, rec.meta).reshape(rec.meta.shape)
            return
        if rec.recv is None:
            rec.recv = empty(rec.meta, device="cpu")
        self._slice(rec, rec.recv, i)[...] = frame
        values[id(rec)] = rec.recv

    def _read_shared(self, items: list[tuple[_Key, int]], reply: dict[str, Any], values: dict[int, Any],
                     node: int) -> None:
        buffers, rounds = reply.get("buffers"), reply.get("rounds")
        if not isinstance(buffers, list) or not isinstance(rounds, list) or not len(buffers) == len(rounds) == len(items):
            raise ProtocolError(f"{node_name(node)} sent a malformed shared-memory reply")
        for (rec, i), b in zip(items, buffers):
            if b not in (0, 1) or rec.shm[i] is None:
                raise ProtocolError(f"{node_name(node)} named shared buffer {b!r} for key {rec.key!r}")
            self._place(rec, i, rec.shm[i].values[b], values)  # type: ignore[union-attr]

    def _attach_shared(self, recs: Sequence[_Key]) -> None:
        """Map the shared buffers of parts held by servers on this host (after init)."""
        for rec in recs:
            rec.shm = [None] * len(rec.parts)
            if rec.meta.dtype == "bfloat16":
                continue
            dtype = numpy_dtype(rec.meta.dtype)
            for i, (server, offset, length) in enumerate(rec.parts):
                directory = self._shm_dirs.get(server)
                if directory is None:
                    continue
                try:
                    rec.shm[i] = _SharedPart(
                        map_array(part_file(directory, rec.skey, offset, f"w{self._client.node_id}"), dtype, length),
                        (map_array(part_file(directory, rec.skey, offset, "v0"), dtype, length),
                         map_array(part_file(directory, rec.skey, offset, "v1"), dtype, length)),
                    )
                except OSError as exc:  # e.g. another mount namespace: use the socket path
                    log.info("worker %d: key %r uses sockets, not shared memory: %s", self._rank, rec.key, exc)

    # -- init ---------------------------------------------------------------------------
    def init(self, key: Any, value: Any, *, summed: bool = False) -> None:
        """Initialise keys on every worker; rank 0's values are used.

        Every worker must call ``init`` for the same keys; it returns when the keys are
        initialised for everyone. ``summed=True`` makes keys whose sync rounds always
        store the plain sum of the pushes, even when an optimizer runs on the servers
        (counters and flags next to model weights; async: pushes are added).

        Raises:
            DuplicateKeyError, KeyTypeError, UnsupportedValueError: as the local store.
            NodeFailedError: a server or worker died meanwhile.
        """
        self._check_open("init")
        keys, single = self._key_list(key)
        pairs = pair_up(keys, single, value, "value")
        recs = []
        seen: set[Key] = set()
        for k, vals in pairs:
            if len(vals) != 1:
                raise InvalidArgumentError(f"init of key {k!r} got {len(vals)} values; give exactly one")
            if k in seen or k in self._keys:
                raise DuplicateKeyError(k)
            seen.add(k)
            meta = describe(vals[0])
            skey = server_key(k)
            parts = split(skey, meta.size, self._num_servers, self._cluster.bigarray_bound)
            recs.append((_Key(k, skey, meta, parts, [0] * len(parts), nbytes=meta.size * itemsize(meta.dtype)), vals))
        self._key_kind.check(keys, fix=True)
        if self._recovery:  # the keys exist on the servers (created by the job before this process)
            self._attach_shared([rec for rec, _ in recs])
            for rec, _ in recs:
                self._keys[rec.key] = rec
            return
        if self._rank == 0:
            self._reduce(recs)
            body = '{"summed": true}' if summed else ""
            self._collect(self._send_values(Command.INIT, [r for r, _ in recs], 0, body=body), None)
        self.barrier()  # rank 0's init (and the servers' shared buffers) exist for everyone now
        self._attach_shared([rec for rec, _ in recs])
        for rec, _ in recs:
            self._keys[rec.key] = rec

    # -- push / pull --------------------------------------------------------------------
    def _push_pairs(self, key: Any, value: Any, op: str) -> list[tuple[_Key, list[Any]]]:
        keys, single = self._key_list(key)
        merged: dict[Key, list[Any]] = {}
        for k, vals in pair_up(keys, single, value, "value"):
            merged.setdefault(k, []).extend(vals)
        out = []
        for k, vals in merged.items():
            rec = self._record(k, op)
            self._check_like(rec, vals, op)
            out.append((rec, vals))
        return out

    # -- quick calls and acknowledgements ---------------------------------------------------
    @staticmethod
    def _quick(recs: Sequence[_Key], arrays: Sequence[Any] = ()) -> bool:
        """True if a call on ``recs`` (with these values / outs) is small and all on the CPU."""
        total = 0
        for rec in recs:
            if rec.meta.device != "cpu":
                return False
            total += rec.nbytes
        if total > _QUICK_BYTES:
            return False
        for a in arrays:
            if not isinstance(a, np.ndarray) and describe(a).device != "cpu":
                return False
        return True

    @staticmethod
    def _acked(recs: Sequence[_Key]) -> bool:
        """True if the last push of every key of ``recs`` has been answered."""
        return all(p.done() for rec in recs for p in rec.acks)

    @staticmethod
    def _reuses_buffers(pairs: Sequence[tuple[_Key, list[Any]]]) -> bool:
        """True if pushing ``pairs`` writes a key's own buffers (shared slot, reduce buffer).

        Those must not change before the key's previous push was answered. A single CPU
        value over sockets is sent from the caller's array itself.
        """
        for rec, vals in pairs:
            if rec.shared or len(vals) != 1 or not (isinstance(vals[0], np.ndarray)
                                                     or describe(vals[0]).device == "cpu"):
                return True
        return False

    def _await_acks(self, recs: Sequence[_Key], timeout: float | None) -> None:
        """Wait until the last push of each key was answered, so its buffers may be reused.

        That push's own error (if any) belongs to its handle, not to the caller here.

        Raises:
            OperationTimeoutError: no answer within the timeout.
        """
        limit = self._timeout(timeout)
        acks = list({id(p): p for rec in recs for p in rec.acks}.values())
        if acks and not all(p.done() for p in acks):
            self._client.quiet.confirm(acks, limit)  # quiet pushes are answered only when asked
        for p in acks:
            if not p.done():
                try:
                    p.wait(limit)
                except Exception:
                    if not p.done():
                        raise
        for rec in recs:
            rec.acks = []

    def _check_pushes(self, pendings: dict[Any, Any], timeout: float | None) -> None:
        """Wait for the servers to acknowledge a push (raises the first error)."""
        limit = self._timeout(timeout)
        for _, pending in pendings.values():
            pending.wait(limit)

    # -- push / pull --------------------------------------------------------------------
    def push(self, key: Any, value: Any, priority: int = 0, *, block: bool = True,
             timeout: float | None = None) -> OpHandle | None:
        """Push values: summed locally, then summed over workers on the servers.

        Returns once the servers hold the data (not when the round completes). With
        ``block=False`` the handle completes then; the keys are handed on to later
        calls as soon as the push is sent, so a pull issued right after it is sent
        without waiting (the servers make it see this push's round).

        Raises:
            UnknownKeyError, ShapeMismatchError, DTypeMismatchError: as the local store.
            RemoteError: a server refused (e.g. ``dist_async`` without an optimizer).
            NodeFailedError: a server or the scheduler died.
            OperationTimeoutError: no reply within the request timeout.
        """
        self._check_open("push")
        pairs = self._push_pairs(key, value, "push")
        recs = [rec for rec, _ in pairs]
        reuses = self._reuses_buffers(pairs)
        quick = (not block and self._quick(recs, [v for _, vals in pairs for v in vals])
                 and (not reuses or self._acked(recs)))
        quiet = not block  # nobody waits for the answer now: the next reply from the server confirms it

        def start() -> Deferred:
            if reuses:
                self._await_acks(recs, timeout)
            self._reduce(pairs)
            pendings = self._send_values(Command.PUSH, recs, priority, timeout=timeout, quiet=quiet)
            replies = self._replies(pendings)
            for rec in recs:
                rec.acks = replies

            def confirm() -> None:
                self._client.quiet.confirm(replies, self._timeout(timeout))
            return Deferred(replies, lambda: self._check_pushes(pendings, timeout), release=True, inline=True,
                            poke=confirm if quiet else None)
        result = self._submit("push", [rec.key for rec in recs], priority, start, block, timeout, quick)
        return result if not block else None

    def _pull_requests(self, recs: Sequence[_Key], priority: int, timeout: float | None) -> dict[Any, Any]:
        pendings = {}
        limit = self._timeout(timeout)
        for (server, shared), items in self._by_server(recs, True).items():
            # {"parts": [[key, offset, push number], ...], "shm": true}, formatted directly (every pull)
            listed = ",".join(f"[{rec.skey},{rec.parts[i][1]},{rec.pushes[i]}]" for rec, i in items)
            text = f'{{"parts":[{listed}],"shm":true}}' if shared else f'{{"parts":[{listed}]}}'
            pending = self._client.request(server, Command.PULL, body=text, priority=priority, timeout=limit)
            pendings[(server, shared)] = (items, pending)
        return pendings

    @staticmethod
    def _replies(pendings: dict[Any, Any]) -> list[Any]:
        return [p for _, p in pendings.values()]

    def pull(self, key: Any, out: Any = None, priority: int = 0, *, block: bool = True,
             timeout: float | None = None) -> Any:
        """Pull the values (at least as new as this worker's last push) into ``out``.

        ``out=None`` returns new arrays of the kind and device each key was
        initialised with.

        Raises:
            UnknownKeyError, ShapeMismatchError, DTypeMismatchError, NodeFailedError,
            OperationTimeoutError: as :meth:`push`.
        """
        self._check_open("pull")
        keys, single = self._key_list(key)
        recs = [self._record(k, "pull") for k in keys]
        outs = None if out is None else pair_up(keys, single, out, "out")
        if outs is not None:
            for rec, (_, o) in zip(recs, outs):
                self._check_like(rec, o, "pull")
        quick = self._quick(recs, [a for _, o in outs or () for a in o])

        def start() -> Deferred:
            pendings = self._pull_requests(recs, priority, timeout)
            return Deferred(self._replies(pendings),
                            lambda: self._deliver(recs, self._collect(pendings, timeout), outs, single), inline=quick)
        result = self._submit("pull", keys, priority, start, block, timeout, quick)
        return result if (not block or out is None) else None

    def _deliver(self, recs: Sequence[_Key], values: dict[int, Any], outs: Any, single: bool) -> Any:
        if outs is None:
            arrays = []
            for rec in recs:
                new = empty(rec.meta)
                fan_out_many([([new], values[id(rec)])], self._kernels)
                arrays.append(new)
            return arrays[0] if single else arrays
        if len(outs) == 1 and len(outs[0][1]) == 1 and type(outs[0][1][0]) is np.ndarray and recs[0].nbytes <= _QUICK_BYTES:
            np.copyto(outs[0][1][0], values[id(recs[0])])  # the usual small case, directly
            return None
        fan_out_many([(o, values[id(rec)]) for rec, (_, o) in zip(recs, outs)], self._kernels)
        return None

    def row_sparse_pull(self, key: Any, out: Any = None, priority: int = 0, row_ids: Any = None, *,
                        block: bool = True, timeout: float | None = None) -> Any:
        """Pull the rows ``row_ids`` of 2-D+ values (same forms and checks as the local store).

        The rows are taken from the value this worker receives; through shared memory
        only the requested rows are copied, over sockets the whole value travels.
        """
        self._check_open("row_sparse_pull")
        keys, single = self._key_list(key)
        recs = [self._record(k, "row_sparse_pull") for k in keys]
        metas = [rec.meta for rec in recs]
        plan = plan_row_pulls(keys, single, metas, metas, out, row_ids)

        quick = self._quick(recs, [a for _, k_outs in plan.outs for a in k_outs])

        def start() -> Deferred:
            pendings = self._pull_requests(recs, priority, timeout)

            def finish() -> Any:
                values = self._collect(pendings, timeout)
                return apply_row_plan(plan, [values[id(rec)] for rec in recs], single, self._kernels)
            return Deferred(self._replies(pendings), finish, inline=quick)
        result = self._submit("row_sparse_pull", keys, priority, start, block, timeout, quick)
        return result if (not block or plan.returns_new) else None

    def pushpull(self, key: Any, value: Any, out: Any = None, priority: int = 0, *, block: bool = True,
                 timeout: float | None = None) -> OpHandle | None:
        """Push, then receive the round's result in the same exchange.

        ``out=None`` writes the result back into ``value``.
        """
        self._check_open("pushpull")
        pairs = self._push_pairs(key, value, "pushpull")
        recs = [rec for rec, _ in pairs]
        if out is None:
            targets = [vals for _, vals in pairs]
        else:
            keys, single = self._key_list(key)
            out_pairs = dict(pair_up(keys, single, out, "out"))
            targets = [out_pairs[rec.key] for rec in recs]
            for rec, o in zip(recs, targets):
                self._check_like(rec, o, "pushpull")

        reuses = self._reuses_buffers(pairs)
        quick = (not block and self._quick(recs, [a for _, vals in pairs for a in vals] + [a for o in targets for a in o])
                 and (not reuses or self._acked(recs)))

        def start() -> Deferred:
            if reuses:
                self._await_acks(recs, timeout)
            self._reduce(pairs)
            pendings = self._send_values(Command.PUSHPULL, recs, priority, timeout=timeout)

            def finish() -> None:
                values = self._collect(pendings, timeout)
                fan_out_many([(o, values[id(rec)]) for rec, o in zip(recs, targets)], self._kernels)
            return Deferred(self._replies(pendings), finish, inline=quick)
        result = self._submit("pushpull", [r.key for r in recs], priority, start, block, timeout, quick)
        return result if not block else None

    def broadcast(self, key: Any, value: Any, out: Any = None, priority: int = 0, *, block: bool = True,
                  timeout: float | None = None) -> OpHandle | None:
        """Rank 0's ``value`` into the store (new keys are created) and into every ``out``.

        Collective: every worker calls it.
        """
        self._check_open("broadcast")
        keys, single = self._key_list(key)
        values = pair_up(keys, single, value, "value")
        for k, vals in values:
            if len(vals) != 1:
                raise InvalidArgumentError(f"broadcast of key {k!r} got {len(vals)} values; give exactly one")
        fresh = {k for k, _ in values if k not in self._keys}
        if fresh:
            self.init([k for k, _ in values if k in fresh], [v[0] for k, v in values if k in fresh])
        existing = [(self._keys[k], v) for k, v in values if k not in fresh]
        if existing and not self._recovery:  # a replacement process only reads the current values
            for rec, vals in existing:
                self._check_like(rec, vals, "broadcast")
            # Everyone must be done reading the old value before rank 0 overwrites it.
            self.wait([rec.key for rec, _ in existing])
            self.barrier()
            if self._rank == 0:
                self._reduce(existing)
                recs = [rec for rec, _ in existing]
                self._collect(self._send_values(Command.INIT, recs, priority, body='{"overwrite": true}'), timeout)
            self.barrier()
        if out is not None:
            return self.pull(key, out=out, priority=priority, block=block, timeout=timeout)
        return None

    # -- optimizer / updater --------------------------------------------------------------
    def set_optimizer(self, optimizer: Any) -> None:
        """Install ``optimizer`` on every server (sent as its config, never pickled).

        Collective: rank 0 sends it, everyone waits at a barrier. Calling it again
        updates the hyperparameters and keeps the optimizer state.
        """
        from pskv.optimizer import Optimizer

        self._check_open("set_optimizer")
        if not isinstance(optimizer, Optimizer):
            raise InvalidTypeError(f"set_optimizer needs a pskv.optimizer.Optimizer, got {type(optimizer).__qualname__}")
        if self._recovery:  # the servers run the job's optimizer already (with its state)
            return
        self.wait()
        self.barrier()  # every worker's earlier pushes are in before the optimizer changes
        if self._rank == 0:
            body = json.dumps(optimizer.to_config())
            self._wait_all([self._client.request(s, Command.SET_OPTIMIZER, body=body, what="set_optimizer")
                            for s in range(self._num_servers)])
        self.barrier()

    def set_updater(self, updater: Any) -> None:
        """Not available: code never travels to the servers. Use :meth:`set_optimizer`."""
        raise NotSupportedError(
            "a distributed store cannot ship a Python function to its servers; use set_optimizer "
            "with a pskv.optimizer optimizer"
        )

    def _all_servers(self, command: Command, body: dict[str, Any], what: str) -> list[Any]:
        """Send ``command`` to every server and wait for every answer."""
        text = json.dumps(body)
        pendings = [self._client.request(s, command, body=text, what=what) for s in range(self._num_servers)]
        return self._wait_all(pendings)

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Every server writes its shard's optimizer state to ``<fname>.server<rank>``.

        Collective: rank 0 sends the request after a barrier (so every worker's pushes
        are in), and everyone returns when all servers have written. Files are
        written by the servers, on their hosts (use a shared file system across hosts).

        Raises:
            RemoteError: a server has no optimizer, or could not write.
        """
        self._check_open("save_optimizer_states")
        self.wait()
        self.barrier()
        if self._rank == 0:
            self._all_servers(Command.SAVE_STATES, {"path": str(fname), "dump_optimizer": bool(dump_optimizer)},
                              "save_optimizer_states")
        self.barrier()

    def load_optimizer_states(self, fname: str) -> None:
        """Every server loads ``<fname>.server<rank>`` (written by :meth:`save_optimizer_states`).

        Raises:
            RemoteError: a file is missing or not a pskv state file.
        """
        self._check_open("load_optimizer_states")
        self.wait()
        self.barrier()
        if self._rank == 0:
            self._all_servers(Command.LOAD_STATES, {"path": str(fname)}, "load_optimizer_states")
        self.barrier()

    # -- checkpoints ----------------------------------------------------------------------
    def save_checkpoint(self, path: str | None = None, meta: Any = None) -> str:
        """Save every server's shard — values, rounds, optimizer state and config — as a checkpoint.

        Collective: every worker calls it at the same point (e.g. every N steps). After a
        barrier (every worker's earlier operations are done), worker 0 has each server
        write ``server-<rank>.safetensors`` into the directory, then writes
        ``manifest.json`` (with ``meta``, any JSON-serialisable value, e.g. the step),
        which makes the directory a checkpoint; everyone returns after a second
        barrier. Files are written atomically on the servers' hosts (use a shared file
        system across hosts). A job started with ``PSKV_RESUME_FROM`` set to such a
        directory (``pskv launch --max-restarts`` does it after a failure) continues from
        it: see :attr:`resumed`.

        Args:
            path: the checkpoint directory; default ``<PSKV_CHECKPOINT_DIR>/ckpt-<n>``
                with ``n`` one more than the highest existing one.
            meta: stored in the manifest and returned by :attr:`resumed` after a restart.

        Returns:
            The checkpoint directory.

        Raises:
            InvalidArgumentError: no ``path`` and no ``PSKV_CHECKPOINT_DIR``, or ``meta``
                is not JSON-serialisable.
            RemoteError: a server could not write its file (CheckpointError there).
        """
        from pskv.server.snapshot import write_manifest

        self._check_open("save_checkpoint")
        try:
            meta_json = json.loads(json.dumps(meta))
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"save_checkpoint: meta must be JSON-serialisable: {exc}") from None
        if path is None:
            if not self._cluster.checkpoint_dir:
                raise InvalidArgumentError("save_checkpoint() needs a path or PSKV_CHECKPOINT_DIR "
                                           "(pskv launch --checkpoint-dir)")
            path = os.path.join(self._cluster.checkpoint_dir, f"ckpt-{_next_checkpoint(self._cluster.checkpoint_dir)}")
        directory = os.path.abspath(path)
        self.wait()
        self.barrier()  # every worker's pushes are in
        if self._rank == 0:
            os.makedirs(directory, exist_ok=True)
            replies = self._all_servers(Command.SAVE_CHECKPOINT, {"dir": directory}, "save_checkpoint")
            bodies = [json.loads(h.body) for h in replies]
            write_manifest(directory, {
                "store": self._type, "num_servers": self._num_servers, "num_workers": self._cluster.num_workers,
                "files": [b.get("file") for b in bodies], "bytes": sum(int(b.get("bytes", 0)) for b in bodies),
                "open_rounds": sum(int(b.get("open_rounds", 0)) for b in bodies), "meta": meta_json,
            })
        self.barrier()
        if self._replay is not None:  # a replacement server will load this checkpoint
            with self._replay_lock:
                self._replay.clear()
        return directory

    def _recover_server(self, server: int) -> None:
        """A replacement of ``server`` joined (``PSKV_SERVER_RECOVERY``; its own thread).

        It loaded the newest checkpoint, whose push counts it goes on from. This worker
        sends it every push made since that checkpoint (kept with their data; a push
        whose request still waits gets its reply), then every other request the old
        process never answered — in that order, before anything new reaches it.
        """
        node = node_id(Role.SERVER, server)
        tracker = self._client.tracker
        limit = self._cluster.request_timeout

        def replay(epoch: int) -> list[tuple[Any, list[Any]]]:
            messages: list[tuple[Any, list[Any]]] = []
            with self._replay_lock:
                entries = list(self._replay.get(server, ())) if self._replay is not None else []
            replayed = set()
            for command, pending, specs, data, body in entries:
                if pending.epoch is None or pending.epoch >= epoch:
                    continue  # not sent yet, or sent to the new process already
                replayed.add(pending.request)
                target = pending
                if pending.done():  # answered by the old process: send it again under a new request
                    target = tracker.new(node, "replayed push", timeout=limit)
                    target.add_done_callback(self._replayed)
                messages.append((target, encode(Header(command, target.request, self._client.node_id, specs, 0, body),
                                                data)))
            for p in tracker.outstanding_to(node):
                if p.request not in replayed and p.frames is not None and p.epoch is not None and p.epoch < epoch:
                    messages.append((p, p.frames))
            log.warning("worker %d: server %d replaced: sending it %d push(es) since the checkpoint and %d other "
                        "request(s)", self._rank, server, len(replayed), len(messages) - len(replayed))
            return messages

        try:
            self._client.reconnect(server, limit, replay)
        except Exception as exc:  # noqa: BLE001 - fail what waits on it rather than hang
            log.error("worker %d: could not switch to server %d's replacement: %s", self._rank, server, exc)
            tracker.fail_node(node, f"its replacement could not be reached: {exc}")

    @staticmethod
    def _replayed(pending: Any) -> None:
        if pending.error is not None:
            log.error("a push sent again to a replacement server failed: %s", pending.error)

    @property
    def resumed(self) -> dict[str, Any] | None:
        """The manifest of the checkpoint this job resumed from (``PSKV_RESUME_FROM``), or None.

        Its ``"meta"`` is what :meth:`save_checkpoint` was given (e.g. the step to go on
        from); ``"path"`` is the directory. The keys it holds keep their saved values
        (and optimizer state) when the workers ``init`` them again.
        """
        if not self._cluster.resume_from:
            return None
        from pskv.server.snapshot import read_manifest

        return {**read_manifest(self._cluster.resume_from), "path": self._cluster.resume_from}

    def send_command_to_servers(self, head: int, body: str) -> None:
        """Run the controller registered for ``head`` on every server; returns when all answered.

        Controllers are registered on the servers (``@pskv.server.controller`` in a module
        named by ``PSKV_SERVER_MODULES``); only ``head`` and ``body`` travel.

        Raises:
            InvalidTypeError: ``head`` is not an int or ``body`` not a str.
            RemoteError: a server has no controller for ``head``, or it raised.
        """
        self._check_open("send_command_to_servers")
        if isinstance(head, bool) or not isinstance(head, int) or not isinstance(body, str):
            raise InvalidTypeError("send_command_to_servers needs an int head and a str body")
        self._all_servers(Command.CONTROLLER, {"head": head, "body": body}, f"command {head}")

    # -- cluster ------------------------------------------------------------------------
    def barrier(self) -> None:
        """Wait until every worker reached the barrier.

        Raises:
            NodeFailedError: a worker died (named).
        """
        self._check_open("barrier")
        self._client.membership.barrier(Role.WORKER, self._cluster.request_timeout)

    def join(self, timeout: float | None = None) -> None:
        """This worker has no more data: rounds go on without it until every worker joined.

        Finishes this worker's outstanding operations, tells every server (sync rounds
        that only waited for this worker complete at once, and later ones do not wait
        for it), then waits at a barrier for the other workers to join too. When it
        returns, every server has seen every worker's join, so rounds need everyone
        again. Collective: every worker calls it (e.g. at the end of each epoch).
        ``timeout`` bounds each wait, the wait for the slowest worker included
        (default ``PSKV_DEFAULT_TIMEOUT``).

        Raises:
            NodeFailedError: a worker or server died.
            OperationTimeoutError: a server did not answer within the timeout.
        """
        self._check_open("join")
        limit = self._timeout(timeout)
        self.wait(timeout=limit)
        self._wait_all([self._client.request(s, Command.JOIN, what="join", timeout=limit)
                        for s in range(self._num_servers)], limit)
        self._client.membership.barrier(Role.WORKER, limit)

    def num_dead_node(self, node_id: int, timeout: float = 60) -> int:
        """Nodes of group ``node_id`` (1 scheduler, 2 servers, 4 workers, sums) silent for > ``timeout`` s."""
        super().num_dead_node(node_id, timeout)  # validates
        return self._client.membership.num_dead_node(node_id, timeout)

    def wait(self, keys: Any = None, timeout: float | None = None) -> None:
        """Wait for outstanding operations (on ``keys``, if given)."""
        wanted = None if keys is None else as_key_list(keys)[0]
        self._engine.wait_all(wanted, self._timeout(timeout))

    def close(self) -> None:
        """Finish queued work, meet the other workers (unless disabled), leave the job."""
        if self._closed:
            return
        self._closed = True
        try:
            self._engine.close(self._cluster.request_timeout)
            if self._barrier_before_exit:
                try:
                    self._client.membership.barrier(Role.WORKER, self._cluster.request_timeout)
                except NodeFailedError as exc:  # the job is failing anyway: still leave cleanly
                    log.error("worker %d: skipping the exit barrier: %s", self._rank, exc)
            try:
                self._client.membership.shutdown(False, self._cluster.request_timeout)
            except NodeFailedError as exc:
                log.error("worker %d: could not report shutdown: %s", self._rank, exc)
        finally:
            self._kernels.close()
            self._client.close()

    def __enter__(self) -> DistStore:
        return self


def _next_checkpoint(root: str) -> int:
    """One more than the highest ``n`` of the ``ckpt-<n>`` entries in ``root`` (1 if none)."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return 1
    numbers = [int(n[5:]) for n in names if n.startswith("ckpt-") and n[5:].isdigit()]
    return max(numbers, default=0) + 1
