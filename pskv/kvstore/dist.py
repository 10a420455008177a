"""The distributed stores: ``dist_sync`` (alias ``dist``), ``dist_async``, ``dist_sync_device``.

This module keeps MXNet's semantics only — key normalisation, the local reduction,
engine scheduling and the collectives. How keys are laid out on the servers, the
messages, their bodies, replies, shared memory, quiet pushes and the replay to a
replacement server belong to the worker layer below, :class:`~pskv.worker.KVWorker`
(as MXNet's ``KVStoreDist`` over ps-lite's ``KVWorker``). Each call first reduces the
values of a key locally (the per-device list is summed in this process — on the
values' device for the ``_device`` types), then has the ``KVWorker`` send **one message
per server** holding every part of every key of the call, and waits for the replies
(each wait bounded by ``PSKV_REQUEST_TIMEOUT``; a dead server or scheduler raises
:class:`~pskv.errors.NodeFailedError` instead).

Consistency (sync): a push returns once the servers have the data; a later pull waits
for the round that push joined, so every worker sees the same values after the same
pushes. Operations of this process run under the same engine as the local store:
per-key issue order, priorities, ``block=False`` handles.

Pipelining: a pull names "the round of this worker's ``n``-th push of the part", so it
need not wait for the previous push's acknowledgement: a push hands its keys on to the
next operation as soon as it is sent (its handle completes only when the servers hold
the data), and ``push(block=False)`` then ``pull()`` costs one round trip. A push reuses
a key's buffers (its shared-memory slot, its reduce buffer) only after the previous
push of that key was acknowledged. A non-blocking push is *quiet*: the server answers
it only if it fails, and the next reply from that server confirms it; waiting on its
handle, or ``wait()``, asks the server (``SYNC``) if nothing follows.

Threads: small CPU calls (up to ``_QUICK_BYTES``) made with ``block=False`` send from
the caller's thread when their keys are idle and finish on the network thread;
blocking calls on idle keys send and wait in the caller's thread. Only bigger calls,
and calls queued behind earlier work on their keys, use the engine's worker threads.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pskv.arrays import CpuKernels, describe, empty, fan_out_many, sum_into_many
from pskv.checkpoints import next_server_checkpoint, read_manifest, write_manifest
from pskv.config import ClusterConfig, Config
from pskv.errors import (
    DuplicateKeyError,
    InvalidArgumentError,
    InvalidTypeError,
    NodeFailedError,
    NotSupportedError,
    StoreClosedError,
    UnknownKeyError,
)
from pskv.kvstore.base import KVStoreBase
from pskv.kvstore.checks import check_like, check_priority
from pskv.kvstore.engine import Deferred, Engine, OpHandle
from pskv.kvstore.keys import Key, KeyKind, as_key_list, pair_up
from pskv.kvstore.rows import apply_row_plan, plan_row_pulls
from pskv.kvstore.types import StoreType
from pskv.worker import KeyLayout, KVWorker

__all__ = ["DistStore"]

log = logging.getLogger("pskv.dist")

# Calls on CPU values of at most this many bytes are "quick": with block=False they send
# from the caller's thread, and their replies are handled on the network thread — a
# thread hand-off (~0.1-0.4 ms) costs more than their copies.
_QUICK_BYTES = 256 << 10


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
        self._store_type = StoreType.parse(name)
        self._config = Config.from_env() if config is None else config
        self._cluster = ClusterConfig.from_env() if cluster is None else cluster
        self._cluster.require_cluster()
        self._kernels = CpuKernels(self._config.kernel_threads, self._config.kernel_parallel_bytes)
        self._engine = Engine(self._config.engine_threads, name=f"pskv-{name}")
        self._keys: dict[Key, KeyLayout] = {}
        self._key_kind = KeyKind()
        self._closed = False
        self._barrier_before_exit = True
        self._worker = KVWorker(self._cluster, context, sync=self._store_type.sync)
        self._client = self._worker.client  # the connection (tests reach in)
        try:
            info = self._worker.connect()
            self._rank = info.rank
            self._recovery = info.recovery
            self._num_workers = info.num_workers
            self._num_servers = info.num_servers
            if self._recovery:  # the job runs already: nobody else is at a creation barrier
                log.warning("worker %d: a replacement process joins the running job (is_recovery)", self._rank)
            else:
                if self._rank == 0:
                    self._worker.set_mode(self._store_type.sync)
                self.barrier()
        except BaseException:
            self._worker.close()
            raise

    # -- properties ---------------------------------------------------------------------
    @property
    def type(self) -> str:
        """The type name given to ``create``."""
        return self._type

    @property
    def store_type(self) -> StoreType:
        """What the type means (sync or async rounds, reduced on the device or the CPU, ...)."""
        return self._store_type

    @property
    def rank(self) -> int:
        """This worker's rank."""
        return self._rank

    @property
    def local_rank(self) -> int:
        """This worker's rank among the workers of its host (``PSKV_LOCAL_RANK``, set by ``pskv launch``)."""
        return self._cluster.local_rank

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

    def _key_list(self, key: Any, creates: bool = False) -> tuple[list[Key], bool]:
        keys, single = as_key_list(key)
        self._key_kind.check(keys, fix=creates)
        return keys, single

    def _record(self, key: Key, op: str) -> KeyLayout:
        rec = self._keys.get(key)
        if rec is None:
            raise UnknownKeyError(key, op)
        return rec

    @staticmethod
    def _check_like(rec: KeyLayout, arrays: Sequence[Any], op: str) -> None:
        check_like(rec.key, rec.meta, arrays, op)

    def _submit(self, op: str, keys: Sequence[Key], priority: int, fn: Callable[[], Any], block: bool,
                timeout: float | None, quick: bool = False) -> Any:
        return self._engine.submit(op, keys, check_priority(priority), fn, block, self._timeout(timeout), quick)

    def _reduce(self, pairs: Sequence[tuple[KeyLayout, list[Any]]]) -> None:
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
            if self._store_type.on_device and len(vals) > 1 and describe(vals[0]).device != "cpu":
                acc = empty(rec.meta, device=describe(vals[0]).device)  # sum where the values live
                sum_into_many([(acc, vals)], self._kernels)
                vals = [acc]
            to_sum.append((rec.send, vals))
        sum_into_many(to_sum, self._kernels)

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
        recs = []
        seen: set[Key] = set()
        for k, vals in pair_up(keys, single, value, "value"):
            if len(vals) != 1:
                raise InvalidArgumentError(f"init of key {k!r} got {len(vals)} values; give exactly one")
            if k in seen or k in self._keys:
                raise DuplicateKeyError(k)
            seen.add(k)
            recs.append((self._worker.layout(k, describe(vals[0])), vals))
        self._key_kind.check(keys, fix=True)
        if not self._recovery:  # else the keys exist on the servers (created by the job before this process)
            if self._rank == 0:
                self._reduce(recs)
                self._worker.init([r for r, _ in recs], summed=summed)
            self.barrier()  # rank 0's init (and the servers' shared buffers) exist for everyone now
        self._worker.attach([rec for rec, _ in recs])
        for rec, _ in recs:
            self._keys[rec.key] = rec

    # -- push / pull --------------------------------------------------------------------
    def _push_pairs(self, key: Any, value: Any, op: str) -> list[tuple[KeyLayout, list[Any]]]:
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

    @staticmethod
    def _quick(recs: Sequence[KeyLayout], arrays: Sequence[Any] = ()) -> bool:
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
    def _reuses_buffers(pairs: Sequence[tuple[KeyLayout, list[Any]]]) -> bool:
        """True if pushing ``pairs`` writes a key's own buffers (shared slot, reduce buffer).

        Those must not change before the key's previous push was answered. A single CPU
        value over sockets is sent from the caller's array itself.
        """
        for rec, vals in pairs:
            if rec.shared or len(vals) != 1 or not (isinstance(vals[0], np.ndarray)
                                                     or describe(vals[0]).device == "cpu"):
                return True
        return False

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
        worker = self._worker
        reuses = self._reuses_buffers(pairs)
        quick = (not block and self._quick(recs, [v for _, vals in pairs for v in vals])
                 and (not reuses or worker.acked(recs)))
        quiet = not block  # nobody waits for the answer now: the next reply from the server confirms it

        def start() -> Deferred:
            if reuses:
                worker.await_acks(recs, timeout)
            self._reduce(pairs)
            sent = worker.push(recs, priority, timeout, quiet)

            def confirm() -> None:
                worker.confirm(sent.replies, self._timeout(timeout))
            return Deferred(sent.replies, lambda: worker.wait_acks(sent, timeout), release=True, inline=True,
                            poke=confirm if quiet else None)
        result = self._submit("push", [rec.key for rec in recs], priority, start, block, timeout, quick)
        return result if not block else None

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
        worker = self._worker

        def start() -> Deferred:
            sent = worker.pull(recs, priority, timeout)
            return Deferred(sent.replies, lambda: self._deliver(recs, worker.values(sent, timeout), outs, single),
                            inline=quick)
        result = self._submit("pull", keys, priority, start, block, timeout, quick)
        return result if (not block or out is None) else None

    def _deliver(self, recs: Sequence[KeyLayout], values: dict[int, Any], outs: Any, single: bool) -> Any:
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
        worker = self._worker

        def start() -> Deferred:
            sent = worker.pull(recs, priority, timeout)

            def finish() -> Any:
                values = worker.values(sent, timeout)
                return apply_row_plan(plan, [values[id(rec)] for rec in recs], single, self._kernels)
            return Deferred(sent.replies, finish, inline=quick)
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
        worker = self._worker
        reuses = self._reuses_buffers(pairs)
        quick = (not block and self._quick(recs, [a for _, vals in pairs for a in vals] + [a for o in targets for a in o])
                 and (not reuses or worker.acked(recs)))

        def start() -> Deferred:
            if reuses:
                worker.await_acks(recs, timeout)
            self._reduce(pairs)
            sent = worker.pushpull(recs, priority, timeout)

            def finish() -> None:
                values = worker.values(sent, timeout)
                fan_out_many([(o, values[id(rec)]) for rec, o in zip(recs, targets)], self._kernels)
            return Deferred(sent.replies, finish, inline=quick)
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
                self._worker.init([rec for rec, _ in existing], overwrite=True, priority=priority, timeout=timeout)
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
        self._rank0_between_barriers(lambda: self._worker.set_optimizer(optimizer.to_config()))

    def set_updater(self, updater: Any) -> None:
        """Not available: code never travels to the servers. Use :meth:`set_optimizer`."""
        raise NotSupportedError(
            "a distributed store cannot ship a Python function to its servers; use set_optimizer "
            "with a pskv.optimizer optimizer"
        )

    def _rank0_between_barriers(self, send: Callable[[], Any]) -> None:
        """A collective: this worker's operations finish, everyone meets, rank 0 ``send``s, everyone meets.

        The first barrier makes every worker's earlier pushes reach the servers first.
        """
        self.wait()
        self.barrier()
        if self._rank == 0:
            send()
        self.barrier()

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Every server writes its shard's optimizer state to ``<fname>.server<rank>``.

        Collective: rank 0 sends the request after a barrier (so every worker's pushes
        are in), and everyone returns when all servers have written. Files are
        written by the servers, on their hosts (use a shared file system across hosts).

        Raises:
            RemoteError: a server has no optimizer, or could not write.
        """
        self._check_open("save_optimizer_states")
        self._rank0_between_barriers(lambda: self._worker.save_states(str(fname), bool(dump_optimizer)))

    def load_optimizer_states(self, fname: str) -> None:
        """Every server loads ``<fname>.server<rank>`` (written by :meth:`save_optimizer_states`).

        Raises:
            RemoteError: a file is missing or not a pskv state file.
        """
        self._check_open("load_optimizer_states")
        self._rank0_between_barriers(lambda: self._worker.load_states(str(fname)))

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
        self._check_open("save_checkpoint")
        try:
            meta_json = json.loads(json.dumps(meta))
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"save_checkpoint: meta must be JSON-serialisable: {exc}") from None
        if path is None:
            if not self._cluster.checkpoint_dir:
                raise InvalidArgumentError("save_checkpoint() needs a path or PSKV_CHECKPOINT_DIR "
                                           "(pskv launch --checkpoint-dir)")
            path = str(next_server_checkpoint(self._cluster.checkpoint_dir))
        directory = os.path.abspath(path)
        self._rank0_between_barriers(lambda: self._write_checkpoint(directory, meta_json))
        self._worker.checkpoint_saved()  # a replacement server will load this checkpoint
        return directory

    def _write_checkpoint(self, directory: str, meta: Any) -> None:
        """Rank 0: every server writes its file into ``directory``, then the manifest makes it a checkpoint."""
        os.makedirs(directory, exist_ok=True)
        bodies = self._worker.save_checkpoint(directory)
        write_manifest(directory, {
            "store": self._type, "num_servers": self._num_servers, "num_workers": self._cluster.num_workers,
            "files": [b.get("file") for b in bodies], "bytes": sum(int(b.get("bytes", 0)) for b in bodies),
            "open_rounds": sum(int(b.get("open_rounds", 0)) for b in bodies), "meta": meta,
        })

    @property
    def resumed(self) -> dict[str, Any] | None:
        """The manifest of the checkpoint this job resumed from (``PSKV_RESUME_FROM``), or None.

        Its ``"meta"`` is what :meth:`save_checkpoint` was given (e.g. the step to go on
        from); ``"path"`` is the directory. The keys it holds keep their saved values
        (and optimizer state) when the workers ``init`` them again.
        """
        if not self._cluster.resume_from:
            return None
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
        self._worker.controller(head, body)

    # -- cluster ------------------------------------------------------------------------
    def barrier(self) -> None:
        """Wait until every worker reached the barrier.

        Raises:
            NodeFailedError: a worker died (named).
        """
        self._check_open("barrier")
        self._worker.barrier(self._cluster.request_timeout)

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
        self._worker.join(limit)
        self._worker.barrier(limit)

    def num_dead_node(self, node_id: int, timeout: float = 60) -> int:
        """Nodes of group ``node_id`` (1 scheduler, 2 servers, 4 workers, sums) silent for > ``timeout`` s."""
        super().num_dead_node(node_id, timeout)  # validates
        return self._worker.num_dead_node(node_id, timeout)

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
                    self._worker.barrier(self._cluster.request_timeout)
                except NodeFailedError as exc:  # the job is failing anyway: still leave cleanly
                    log.error("worker %d: skipping the exit barrier: %s", self._rank, exc)
            try:
                self._worker.shutdown(self._cluster.request_timeout)
            except NodeFailedError as exc:
                log.error("worker %d: could not report shutdown: %s", self._rank, exc)
        finally:
            self._kernels.close()
            self._worker.close()

    def __enter__(self) -> DistStore:
        return self

