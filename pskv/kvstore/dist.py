"""The distributed stores: ``dist_sync`` (alias ``dist``), ``dist_async``, ``dist_sync_device``.

This module keeps MXNet's semantics of the key calls only, as MXNet's ``KVStoreDist`` over
ps-lite's ``KVWorker``: arguments are checked by the store front end (:mod:`~pskv.kvstore.frontend`),
the values of a key are reduced locally (:mod:`~pskv.kvstore.staging`: summed in this process, on
the values' device for the ``_device`` types), then :class:`~pskv.worker.KVWorker` sends **one
message per server** holding every part of every key of the call and waits for the replies (each
wait bounded by ``PSKV_REQUEST_TIMEOUT``; a dead server or scheduler raises
:class:`~pskv.errors.NodeFailedError`). Layouts, messages, shared memory, quiet pushes and the
replay to a replacement server belong to that layer; row-sparse keys to :mod:`~pskv.kvstore.dist_rows`;
the job-level calls (replacement, the servers' state, the cluster, an elastic job's commits:
:mod:`~pskv.kvstore.elastic`) to the base class :class:`~pskv.kvstore.dist_job.DistJob`.

Consistency (sync): a push returns once the servers have the data; a later pull waits for the
round that push joined, so every worker sees the same values after the same pushes. Operations
of this process run under the same engine as the local store: per-key issue order, priorities,
``block=False`` handles.

Pipelining: a pull names "the round of this worker's ``n``-th push of the part", so it need not
wait for the previous push's acknowledgement: ``push(block=False)`` then ``pull()`` costs one
round trip. A push reuses a key's buffers (its shared-memory slot, its reduce buffer) only after
the previous push of that key was acknowledged. A non-blocking push is *quiet*: the server
answers it only if it fails, and the next reply from that server confirms it; waiting on its
handle, or ``wait()``, asks the server (``SYNC``) if nothing follows.

Threads: small non-blocking CPU calls send from the caller's thread and finish on the network
thread (:func:`~pskv.kvstore.staging.is_quick`); blocking calls on idle keys send and wait in
the caller's thread; bigger or queued calls use the engine's threads.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, NoReturn

from pskv.arrays import ArrayMeta, describe
from pskv.arrays.rowsparse import is_row_sparse
from pskv.checkpoints import read_manifest
from pskv.config import ClusterConfig, Config
from pskv.errors import InvalidArgumentError, NotSupportedError
from pskv.kvstore import dist_rows
from pskv.kvstore.collectives import ServerCollectives
from pskv.kvstore.compressing import GradientCompression, agreed, key_compressions
from pskv.kvstore.dist_job import SETTLE_BEFORE_BARRIER, DistJob
from pskv.kvstore.dist_rows import DistRows, RowInit
from pskv.kvstore.elastic import elastic_job
from pskv.kvstore.engine import Deferred
from pskv.kvstore.exit import leave_at_exit
from pskv.kvstore.keys import Key, merge_repeats
from pskv.kvstore.quick import QuickCalls
from pskv.kvstore.resume import PushNumbers
from pskv.kvstore.staging import deliver, fan_out_rest, is_quick, landing, reduce_outgoing, reuses_buffers
from pskv.worker import KeyLayout, KVWorker

__all__ = ["DistStore"]

log = logging.getLogger("pskv.dist")


class DistStore(DistJob):
    """A worker's handle on the parameter server.

    Use :func:`pskv.create` with a ``dist_*`` name inside a process started by
    ``pskv launch`` (or with the ``DMLC_*`` environment set). Operations, ``wait()`` and
    handles wait ``PSKV_REQUEST_TIMEOUT`` when given no timeout.

    Args:
        name: the store type.
        config: local settings (kernels, engine).
        cluster: the cluster contract (default: from the environment).
        worker: the worker layer to use (default: a new :class:`~pskv.worker.KVWorker`;
            :mod:`pskv.testing.loopback` passes one wired to servers in this process).

    Row-sparse keys (``init`` with a RowSparse, a torch sparse COO tensor or a
    :class:`~pskv.arrays.tables.TableInit`) are stored by row ranges on the servers; pushes and
    ``row_sparse_pull`` move only rows (:mod:`~pskv.kvstore.dist_rows`).
    """

    _sparse_refusal = None  # row-sparse keys live on the servers by row ranges

    def __init__(self, name: str = "dist_sync", config: Config | None = None,
                 cluster: ClusterConfig | None = None, context: Any = None, worker: KVWorker | None = None) -> None:
        cluster = ClusterConfig.from_env() if cluster is None else cluster
        cluster.require_cluster()
        super().__init__(name, config, default_timeout=cluster.request_timeout)
        self._cluster = cluster
        self._on_device = self._store_type.on_device
        self._keys: dict[Key, KeyLayout] = {}
        self._worker = worker if worker is not None else KVWorker(cluster, context, sync=self._store_type.sync)
        self._rows = DistRows(self._worker, self._kernels)  # row-sparse keys (kvstore/dist_rows.py)
        self._quick = QuickCalls(self._keys, self._worker, self._engine, self._kernels,
                                 lambda: self._compression is not None, self._timeout)  # kvstore/quick.py
        try:
            info = self._worker.connect()
            self._elastic = elastic_job(self._worker, cluster, self._engine)  # kv.commit/restore (kvstore/elastic.py)
            self._rank = info.rank
            self._recovery = info.recovery
            self._num_workers = info.num_workers
            self._num_servers = info.num_servers
            self._servers = ServerCollectives(self._worker, cluster, self._rank, self._engine)
            self._pushes = PushNumbers(self._worker, self._recovery, self, self._rank)  # a replacement: its guard too
            if not (self._recovery or self._elastic.joining):  # rank 0 sets the servers' mode; all learn if it could
                self._servers.run("create", lambda: self._worker.control.set_mode(self._store_type.sync),
                                  settle=lambda: None, before=False)
        except BaseException:
            self._worker.close()
            raise
        leave_at_exit(self, cluster.request_timeout)  # a store never closed still leaves (pskv.kvstore.exit)

    # -- records, init -----------------------------------------------------------------
    def _lookup(self, key: Key) -> KeyLayout | None:
        return self._keys.get(key)

    def _holds_keys(self) -> bool:
        return bool(self._keys)

    def _compression_set(self, compression: GradientCompression) -> None:
        """Each worker compresses its pushes (after summing its devices' values, as MXNet's dist
        stores do); the servers decode each push by the compression it names."""
        self._worker.set_compression(compression)
        # a resumed job takes each worker's residuals from the checkpoint; a replacement's died with its predecessor
        if self._recovery:
            log.warning("worker %d: a replacement process: the compression residuals of its predecessor died with "
                        "it; they start at zero", self._rank)
        elif self._cluster.resume_from:
            self._worker.compression.restore(self._cluster.resume_from, read_manifest(self._cluster.resume_from),
                                             self._num_workers)

    def init(self, key: Any, value: Any, *, summed: bool = False, compression: Any = None) -> None:
        """Initialise keys on every worker; rank 0's values are used.

        Every worker must call ``init`` for the same keys; it returns when the keys are initialised for
        everyone. ``summed=True`` makes keys whose sync rounds always store the plain sum of the pushes,
        even when an optimizer runs on the servers (counters and flags next to model weights; async: added).
        ``compression``: the keys' own gradient compression (:func:`~pskv.kvstore.compressing.key_compressions`).

        Raises:
            DuplicateKeyError, KeyTypeError, UnsupportedValueError: as the local store.
            InitMismatchError: workers gave a key different shapes or dtypes (on every worker).
            CollectiveFailedError: ``init`` failed on another worker (named).
            NodeFailedError: a server or worker died meanwhile.
        """
        self._check_open("init")
        pairs: list[tuple[Key, KeyLayout, list[Any]]] = []
        failure: Exception | None = None
        value, tables = DistRows.tables(key, value)
        sparse: list[RowInit] = []
        try:
            keys, staged = self._new_values(key, value, "init")
            pairs = [(k, self._layout(k, v, summed), [v]) for k, v in staged]
            key_compressions(compression, keys, [rec for _, rec, _ in pairs])  # each layout's own
            self._key_kind.check(keys, fix=True)
            sparse = DistRows.staged(pairs, tables, summed)
        except Exception as exc:
            if self._recovery or self._elastic.joining:
                raise
            failure = exc  # the other workers must not wait for this one: told at the meeting
        recs = [rec for _, rec, _ in pairs]
        dense = [p for p in pairs if not p[1].sparse]
        self._elastic.held(recs)  # a joiner's keys: the servers must hold them alike (kvstore/elastic.py)
        self._worker.adopt([rec for _, rec, _ in dense], summed)
        if not (self._recovery or self._elastic.joining):  # else the keys exist on the servers (made before it)
            def settle() -> None:  # queued operations reach the servers first: no meeting finds this worker behind
                self._engine.settle(min(SETTLE_BEFORE_BARRIER, self._cluster.request_timeout))
                if failure is not None:
                    raise failure

            def send() -> None:
                if dense:
                    reduce_outgoing(dense, self._kernels, self._on_device)
                    self._worker.init([rec for _, rec, _ in dense], summed=summed)
                self._rows.init(sparse, summed)
            # every worker's keys, shapes and dtypes must agree (InitMismatchError on every worker
            # if not); once the call returns, rank 0's init (and the servers' shared buffers) exist
            agree = [(repr(rec.key), f"shape {tuple(rec.meta.shape)} dtype {rec.meta.dtype}"
                      + (" row-sparse" if rec.sparse else "") + agreed(rec.own)) for rec in recs]
            self._servers.run("init", send, settle=settle, agree=agree)
        elif self._recovery:  # number the pushes on from those of this rank that reached the servers (push_count)
            self._pushes.resume(recs)
        self._worker.attach(recs)
        for rec in recs:
            self._keys[rec.key] = rec

    def _layout(self, key: Key, value: Any, summed: bool) -> KeyLayout:
        """The layout of a new key from its init value (row-sparse values make row-sparse keys).

        Raises:
            NotSupportedError: a row-sparse key with gradient compression, or one the servers cannot keep.
        """
        if not is_row_sparse(value):
            return self._worker.layout(key, describe(value))
        return self._rows.layout(key, value, summed, self._refuse_sparse_compression)

    # -- push / pull --------------------------------------------------------------------
    def push(self, key: Any, value: Any, priority: int = 0, *, block: bool = True,
             timeout: float | None = None) -> Any:  # KVStoreBase's overloads type the calls
        """Push values: summed locally, then summed over workers on the servers.

        Returns (with ``block=False``: its handle completes) once the servers hold the
        data, not when the round completes; a later call on the keys need not wait for
        that (see "Pipelining" above).

        Raises:
            UnknownKeyError, ShapeMismatchError, DTypeMismatchError: as the local store.
            RemoteError: a server refused (e.g. ``dist_async`` without an optimizer).
            NodeFailedError: a server or the scheduler died.
            OperationTimeoutError: no reply within the request timeout.
        """
        self._check_open("push")
        handle = None if block else self._quick.push(key, value, priority, timeout)  # the usual case, shorter
        if handle is not None:
            return handle
        every = self._push_pairs(key, value, "push")
        self._check_compressible(every, "push")
        # row-sparse keys push rows; row-sparse values of dense keys are summed as dense ones
        rows = [(k, rec, vals) for k, rec, vals in every if rec.sparse]
        pairs = [(k, rec, dist_rows.densified(vals)) for k, rec, vals in every if not rec.sparse]
        recs = [rec for _, rec, _ in pairs]
        worker = self._worker
        reuses = reuses_buffers(pairs)
        quick = (not block and not rows and is_quick(recs, [v for _, _, vals in pairs for v in vals])
                 and (not reuses or worker.acked(recs)))
        quiet = not block  # nobody waits for the answer now: the next reply from the server confirms it

        def start() -> Deferred:
            if reuses:
                worker.await_acks(recs, timeout)
            reduce_outgoing(pairs, self._kernels, self._on_device)
            sent = worker.push(recs, priority, timeout, quiet) if recs else None
            if rows:  # summed on this worker, then each server gets the rows of its range
                sent = self._rows.push(rows, sent, priority, timeout, quiet)
            assert sent is not None

            def confirm() -> None:
                worker.confirm(sent.replies, self._timeout(timeout))
            return Deferred(sent.replies, lambda: worker.wait_acks(sent, timeout), release=True, inline=True,
                            poke=confirm if quiet else None)
        result = self._submit("push", [k for k, _, _ in every], priority, start, block, timeout, quick)
        return result if not block else None

    def pull(self, key: Any, out: Any = None, priority: int = 0, *, ignore_sparse: bool = True, block: bool = True,
             timeout: float | None = None) -> Any:
        """Pull the values (at least as new as this worker's last push) into ``out``.

        ``out=None`` returns new arrays of the kind and device each key was initialised
        with; for a row-sparse key a row-sparse value of its present rows (only those
        travel). Row-sparse outs: skipped with a warning if ``ignore_sparse`` (MXNet's
        default; use :meth:`row_sparse_pull`), else filled with the key's present rows
        (every row of a dense key). A row-sparse key's whole table travels to a dense out.

        Raises:
            UnknownKeyError, ShapeMismatchError, DTypeMismatchError, NodeFailedError, OperationTimeoutError: as
                :meth:`push`.
        """
        self._check_open("pull")
        if block and out is not None and self._quick.pull(key, out, priority, timeout):  # the usual case, shorter
            return None
        outs: list[list[Any]] | None = None
        sparse_outs: list[tuple[int, Any]] = []  # (index of the key, a row-sparse out)
        if out is None:
            keys, single = self._key_list(key)
            recs = [self._record(k, "pull") for k in keys]
            whole = [i for i, rec in enumerate(recs) if not rec.sparse]
            present = [i for i, rec in enumerate(recs) if rec.sparse]
        else:
            targets = self._out_targets(key, out, "pull")
            skipped = [k for k, _, o in targets if any(is_row_sparse(a) for a in o)]
            if skipped and ignore_sparse:
                warnings.warn(f"pull skipped the row-sparse outs of keys {skipped!r} (ignore_sparse=True, as MXNet); "
                              "use row_sparse_pull, or pull(..., ignore_sparse=False)", UserWarning, stacklevel=2)
            elif skipped:
                sparse_outs = [(i, a) for i, (_, _, o) in enumerate(targets) for a in o if is_row_sparse(a)]
            keys, single = [k for k, _, _ in targets], False
            recs, outs = [r for _, r, _ in targets], [[a for a in o if not is_row_sparse(a)] for _, _, o in targets]
            present = sorted({i for i, _ in sparse_outs if recs[i].sparse})
            whole = [i for i, o in enumerate(outs) if o or (i not in present and any(j == i for j, _ in sparse_outs))]
        dense = [recs[i] for i in whole]
        dense_outs = None if outs is None else [outs[i] for i in whole]
        quick = not sparse_outs and not present and is_quick(recs, [a for o in outs or () for a in o])
        worker = self._worker

        def start() -> Deferred:
            sent = worker.pull(dense, priority, timeout) if dense else None
            rows = self._rows.pull_present(recs, present, sparse_outs, priority, timeout)
            into = landing(dense, dense_outs)

            def finish() -> Any:
                values = worker.values(sent, timeout, into) if sent is not None else {}
                result = deliver(dense, values, dense_outs, False, self._kernels)
                made = rows.finish(values, recs, timeout, new=out is None)  # the row-sparse outs and keys
                if out is not None:
                    return None
                arrays = {**dict(zip(whole, result)), **made}
                return arrays[0] if single else [arrays[i] for i in range(len(recs))]
            replies = (sent.replies if sent is not None else []) + rows.replies
            return Deferred(replies, finish, inline=quick)
        result = self._submit("pull", keys, priority, start, block, timeout, quick)
        return result if (not block or out is None) else None

    def row_sparse_pull(self, key: Any, out: Any = None, priority: int = 0, row_ids: Any = None, *,
                        block: bool = True, timeout: float | None = None) -> Any:
        """Pull the rows ``row_ids`` of 2-D+ values (same forms and checks as the local store).

        A row-sparse key's servers send only the rows asked for (each server those of its
        range); a row-sparse out then holds exactly those rows, sorted and unique; outs of
        another floating dtype are cast into. A dense key's value travels whole (through
        shared memory only the requested rows are copied). ``out=None`` returns new
        values: row-sparse ones for row-sparse keys.
        """
        self._check_open("row_sparse_pull")
        keys, single = self._key_list(key)
        recs = [self._record(k, "row_sparse_pull") for k in keys]
        start, quick, made = self._rows.row_sparse_pull(keys, single, recs, out, row_ids, priority, timeout)
        result = self._submit("row_sparse_pull", keys, priority, start, block, timeout, quick)
        return result if (not block or made is not None) else None

    def pushpull(self, key: Any, value: Any, out: Any = None, priority: int = 0, *, block: bool = True,
                 timeout: float | None = None) -> Any:  # KVStoreBase's overloads type the calls
        """Push, then receive the round's result in the same exchange.

        ``out=None`` writes the result back into ``value``.
        """
        self._check_open("pushpull")
        if block and self._quick.pushpull(key, value, out, priority, timeout):  # the usual case, shorter
            return None
        pairs = self._push_pairs(key, value, "pushpull")
        out_targets = [] if out is None else self._out_targets(key, out, "pushpull")
        sparse = [k for k, rec, vals in pairs if rec.sparse or any(map(is_row_sparse, vals))]
        sparse += [k for k, _, o in out_targets if any(map(is_row_sparse, o))]
        if sparse:
            raise NotSupportedError(f"pushpull of key {sparse[0]!r}: row-sparse keys, values and outs are pushed, "
                                    "then pulled or row_sparse_pulled")
        self._check_compressible(pairs, "pushpull")
        recs = [rec for _, rec, _ in pairs]
        if out is None:
            targets = [vals for _, _, vals in pairs]
        else:  # a key listed twice: every out of it
            outs = dict(merge_repeats([(k, o) for k, _, o in out_targets]))
            targets = [outs[k] for k, _, _ in pairs]
        worker = self._worker
        reuses = reuses_buffers(pairs)
        quick = (not block and is_quick(recs, [a for _, _, vals in pairs for a in vals] + [a for o in targets for a in o])
                 and (not reuses or worker.acked(recs)))

        def start() -> Deferred:
            if reuses:
                worker.await_acks(recs, timeout)
            reduce_outgoing(pairs, self._kernels, self._on_device)
            sent = worker.pushpull(recs, priority, timeout)
            into = landing(recs, targets)  # a piece's result lands after its own bytes were sent

            def finish() -> None:
                values = worker.values(sent, timeout, into)
                fan_out_rest([(o, values[id(rec)]) for rec, o in zip(recs, targets)], self._kernels)
            return Deferred(sent.replies, finish, inline=quick)
        result = self._submit("pushpull", [k for k, _, _ in pairs], priority, start, block, timeout, quick)
        return result if not block else None

    def broadcast(self, key: Any, value: Any, out: Any = None, priority: int = 0, *, block: bool = True,
                  timeout: float | None = None, root_rank: int = 0) -> Any:  # KVStoreBase's overloads type the calls
        """Rank ``root_rank``'s ``value`` into the store (new keys are created) and into every ``out``.

        Collective: every worker calls it, with the same ``root_rank``. New keys are made
        by :meth:`init` (rank 0's values); from another root they are then overwritten.

        Raises:
            InvalidArgumentError: ``root_rank`` is not a worker's rank.
            InitMismatchError: the workers gave different ``root_rank`` (on every worker), checked
                where they all meet to overwrite: an existing key, or new keys from a root other
                than 0. A worker that broadcasts only new keys from rank 0 skips that meeting, so
                such a mismatch fails later (CollectiveMismatchError at the next collective, or
                OperationTimeoutError).
            NotSupportedError: a row-sparse value from a root other than 0, or for an existing key.
        """
        self._check_open("broadcast")
        try:
            root = self._root_rank(root_rank)
        except InvalidArgumentError as exc:  # the others must not wait for this worker: told at the meeting
            self._servers.meet("broadcast", exc)
            raise
        keys, values = self._one_value_each(key, value, "broadcast")
        if root != 0 and any(is_row_sparse(v) for _, v in values):
            raise NotSupportedError(f"broadcast from root_rank {root} takes dense values (a row-sparse key is made "
                                    "by init or a broadcast from rank 0)")
        fresh = {k for k, _ in values if k not in self._keys}
        if fresh:
            self.init([k for k, _ in values if k in fresh], [v for k, v in values if k in fresh])
        existing = [(k, self._keys[k], [v]) for k, v in values if k not in fresh or root != 0]
        for k, rec, vals in existing:
            if rec.sparse or is_row_sparse(vals[0]):
                raise NotSupportedError(f"broadcast of key {k!r}: an existing key takes dense values (a row-sparse key "
                                        "is made by init and read by row_sparse_pull)")
        if existing and not self._recovery:  # a replacement process only reads the current values
            def settle() -> None:  # a value that does not fit fails the broadcast on every worker
                for k, rec, vals in existing:
                    self._check_like(k, rec, vals, "broadcast")
                self.wait([k for k, _, _ in existing])  # everyone must be done reading the old value

            def overwrite() -> None:
                reduce_outgoing(existing, self._kernels, self._on_device)
                self._worker.init([rec for _, rec, _ in existing], overwrite=True, priority=priority, timeout=timeout)
            self._servers.run("broadcast", overwrite, settle=settle, root=root, agree=[("root_rank", str(root))])
        if out is not None:
            return self.pull(key, out=out, priority=priority, block=block, timeout=timeout)
        return None

    def refuse_push(self, key: Any, error: BaseException, value: Any = None) -> NoReturn:
        """:meth:`KVStoreBase.refuse_push`: a push the servers refuse (of ``value``'s dtype and size, or of no
        elements if ``value`` is None or fits the key), which fails the sync round it would have joined on
        every worker (:meth:`KVWorker.refuse`); then ``error`` is raised. A key this worker does not hold, or
        an asynchronous store (no rounds to fail): only ``error``."""
        rec = self._keys.get(key)
        if rec is not None and self._store_type.sync:
            meta = describe(value) if value is not None else None
            if meta is None or (meta.dtype, meta.size) == (rec.meta.dtype, rec.meta.size):
                meta = ArrayMeta("numpy", (0,) if rec.meta.size else (1,), rec.meta.dtype, "cpu")
            self._refuse_push(key, meta)
        raise error

    def _refuse_push(self, key: Key, meta: Any) -> bool:
        """If a value described by ``meta`` does not fit ``key``'s dtype or size, push it for the
        servers to refuse (the sync round fails on every worker; :meth:`KVWorker.refuse`); True if so.

        The byteps store's allreduce does (:meth:`BytePSStore.pushpull`); the MXNet API's
        push keeps a refused value on this worker.
        """
        rec = self._keys.get(key)
        if rec is None or not self._store_type.sync or (meta.dtype, meta.size) == (rec.meta.dtype, rec.meta.size):
            return False
        self.wait([key])  # in this worker's order of operations on the key
        self._worker.refuse(rec, meta)
        return True

    def __enter__(self) -> DistStore:
        return self

