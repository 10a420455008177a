"""The single-process stores: ``'local'`` (reduce on CPU) and ``'device'`` (reduce on the values' device).

Guarantees (each one fixes a known MXNet defect):

* the store keeps copies, never references to the caller's arrays;
* pushes and pulls check shape and dtype against the initialised value; a failed call changes nothing;
* an updater's exception propagates out of ``push`` and the store is unchanged;
* ``broadcast`` works for new and existing keys, any number of times;
* ``row_sparse_pull`` checks its row ids.

Row-sparse keys and values (MXNet's ``row_sparse``; :mod:`pskv.kvstore.local_rows`): a key
made by ``init`` with a :class:`~pskv.arrays.rowsparse.RowSparse` or a torch sparse COO
tensor keeps its table dense here and remembers which rows are present.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pskv.arrays import (
    ArrayMeta,
    clone,
    copy_into,
    describe,
    empty,
    fan_out_many,
    signature,
    sum_into_many,
)
from pskv.arrays.dtypes import NUMPY_NAMES
from pskv.arrays.rowsparse import RowSparse, any_row_sparse, is_row_sparse
from pskv.config import Config
from pskv.errors import (
    DuplicateKeyError,
    InvalidArgumentError,
    InvalidTypeError,
    OptimizerStateError,
)
from pskv.kvstore.frontend import StoreFrontEnd
from pskv.kvstore.keys import PUSHPULL_DENSE, Key, pair_up
from pskv.kvstore.local_rows import (
    add_present,
    all_rows,
    as_sparse_like,
    cast_copy,
    empty_sparse,
    fill_sparse_out,
    join_rows,
    merge_into,
    merge_rows,
    present_rows,
    present_value,
    replace_rows,
    scatter_rows,
    sparse_meta,
    sparse_parts,
    store_pushes,
    value_device,
    zero_rows,
)
from pskv.kvstore.row_ids import apply_row_plan, plan_row_pulls
from pskv.optimizer import Optimizer
from pskv.optimizer.base import UpdateFn
from pskv.optimizer.states import file_errors
from pskv.optimizer.updater import install_optimizer, updater_from_states

__all__ = ["LocalStore"]


@dataclass(slots=True)
class _Entry:
    """One key: its stored copy, where the caller's value came from, and reusable buffers."""

    value: Any
    meta: ArrayMeta  # of the stored copy (device may change in a 'device' store)
    origin: ArrayMeta  # of the value given to init: pull(out=None) returns this kind
    merge: Any = None  # merge buffer for updater pushes
    spare: Any = None  # second copy for transactional user updaters
    lock: threading.Lock = field(default_factory=threading.Lock)
    summed: bool = False  # init(summed=True): pushes store their sum, the updater never runs
    rows: np.ndarray[Any, Any] | None = None  # a row-sparse key's present rows (sorted); None: a dense key


class LocalStore(StoreFrontEnd[_Entry]):
    """A key-value store inside one process, over NumPy arrays and PyTorch tensors.

    Use :func:`pskv.create` (``'local'`` or ``'device'``) rather than this class.

    Args:
        name: the store type name (``'local'``, ``'device'`` or an MXNet alias).
        config: settings; default :meth:`pskv.config.Config.from_env`.
    """

    _sparse_refusal = None  # row-sparse keys and values are this store's
    _casts_outs = True  # a pull into an out of another floating dtype casts

    def __init__(self, name: str = "local", config: Config | None = None) -> None:
        super().__init__(name, config)
        self._on_device = self._store_type.on_device
        self._entries: dict[Key, _Entry] = {}
        self._table_lock = threading.Lock()
        self._updater: UpdateFn | None = None
        self._builtin_updater = False
        # Engine threads run pushes of different keys concurrently; updaters (and the
        # optimizers' shared update counts) see one call at a time.
        self._updater_lock = threading.Lock()

    # -- properties ----------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """Always 0: one process."""
        return 0

    @property
    def num_workers(self) -> int:
        """Always 1: one process."""
        return 1

    # -- records ---------------------------------------------------------------------------
    def _lookup(self, key: Key) -> _Entry | None:
        return self._entries.get(key)

    def _holds_keys(self) -> bool:
        return bool(self._entries)

    # -- init ----------------------------------------------------------------------------
    def init(self, key: Any, value: Any, *, summed: bool = False) -> None:
        """Create keys holding copies of ``value``.

        Args:
            key: a key or a list of keys (int or str; one kind per store).
            value: an array per key (a one-element list is accepted too). Later changes
                to the caller's arrays never change the store. A row-sparse value (a
                :class:`~pskv.arrays.rowsparse.RowSparse` or a torch sparse COO tensor)
                makes a row-sparse key holding its rows.
            summed: pushes to these keys store the sum of the pushed values even when
                an updater or optimizer is set (counters and flags next to weights).

        Raises:
            DuplicateKeyError: a key already exists (or appears twice in the list).
            InvalidArgumentError: a key is given several values.
            KeyTypeError, UnsupportedValueError: bad key or value types.
            NotSupportedError: a row-sparse value with gradient compression set (for the key).
        """
        self._check_open("init")
        keys, staged = self._new_values(key, value, "init")
        for k, v in staged:
            if not summed and is_row_sparse(v):
                self._refuse_sparse_compression(k, sparse_meta(v), True, "init")
        entries = [(k, self._new_entry(v, summed)) for k, v in staged]
        self._key_kind.check(keys, fix=True)
        with self._table_lock:
            for k, _ in entries:
                if k in self._entries:
                    raise DuplicateKeyError(k)
            self._entries.update(entries)

    def _new_entry(self, value: Any, summed: bool = False) -> _Entry:
        sparse = is_row_sparse(value)
        origin = sparse_meta(value) if sparse else describe(value)
        device = origin.device if self._on_device else "cpu"
        stored = empty(origin, device=device, pin=not self._on_device and origin.device != "cpu")
        rows = None
        if sparse:
            rows, data = sparse_parts(value)
            zero_rows(stored)
            scatter_rows(stored, rows, data, add=False)
            rows = rows.copy()
        else:
            copy_into(stored, value, self._kernels)
        return _Entry(stored, describe(stored), origin, summed=summed, rows=rows)

    # -- push ----------------------------------------------------------------------------
    def push(self, key: Any, value: Any, priority: int = 0, *, block: bool = True,
             timeout: float | None = None) -> Any:  # KVStoreBase's overloads type the calls
        """Push values: the values of each key are summed, then stored (or given to the updater).

        Args:
            key: a key or a list of keys.
            value: per key an array or a list of arrays (one per device), summed.
                With ``block=False`` do not modify these arrays until the handle is done.
                Row-sparse values are summed by row (the union of their rows); without
                an updater they replace the key's value (its rows are then those pushed).
            priority: higher runs first among queued operations.
            block: False returns an :class:`OpHandle` at once.
            timeout: seconds to wait behind queued work (default ``PSKV_DEFAULT_TIMEOUT``).

        Raises:
            UnknownKeyError: a key was never initialised.
            ShapeMismatchError, DTypeMismatchError: a value does not match the stored one;
                nothing is changed.
            Exception: the updater's own exception, with every stored value unchanged.
        """
        self._check_open("push")
        pairs = self._push_pairs(key, value, "push")
        self._check_compressible(pairs, "push")
        keys = [k for k, _, _ in pairs]
        result = self._submit("push", keys, priority, lambda: self._apply_pushes(pairs), block, timeout)
        return result if not block else None

    def _apply_pushes(self, pairs: Sequence[tuple[Key, _Entry, list[Any]]]) -> None:
        compression = self._compression
        if compression is not None:  # what each device's compressed value decodes to is summed
            pairs = [(k, e, compression.exchange(k, vals) if compression.applies(e.meta, e.summed) else vals)
                     for k, e, vals in pairs]
        updater = self._updater
        stored = pairs if updater is None else [p for p in pairs if p[1].summed]
        if updater is not None and len(stored) < len(pairs):  # first: a failing updater changes nothing
            self._apply_updater(updater, [p for p in pairs if not p[1].summed])
        for _, entry, vals in stored:
            self._settle_device(entry, vals)
        store_pushes(stored, self._kernels)

    def _apply_updater(self, updater: UpdateFn, pairs: Sequence[tuple[Key, _Entry, list[Any]]]) -> None:
        """Give each key's merged pushes to the updater; if it fails, no stored value changed.

        pskv's optimizers get, for a push of row-sparse values only and with ``lazy_update``
        set, the merged rows (``update_rows``: only those rows of the weight and its state
        change, at a cost of the rows pushed); otherwise the dense sum (their dense update;
        MXNet's ``lazy_update=False``). A user updater gets, for a push of row-sparse values
        only, their sum as a row-sparse value of the stored array's kind (MXNet passes its
        row-sparse merge), else the dense sum.
        """
        for _, entry, vals in pairs:
            self._settle_device(entry, vals)
        if self._builtin_updater:
            lazy = updater.optimizer.lazy_update  # type: ignore[attr-defined]
            by_rows = [lazy and all(is_row_sparse(v) for v in vals) for _, _, vals in pairs]
            dense = [p for p, r in zip(pairs, by_rows) if not r]
            lazy_pairs = [p for p, r in zip(pairs, by_rows) if r]
            merged, pushed_rows = self._merge_all(dense)
            row_sums = [merge_rows(entry.value, vals) for _, entry, vals in lazy_pairs]
            # pskv's Updater checks every key of the call before it writes any, so it
            # runs in place: a failing call changes nothing.
            with self._updater_lock:
                updater.update_batch(  # type: ignore[attr-defined]
                    [(k, m, entry.value) for (k, entry, _), m in zip(dense, merged)],
                    [(k, ids, rows, entry.value) for (k, entry, _), (ids, rows) in zip(lazy_pairs, row_sums)])
            join_rows(dense, pushed_rows)
            for (_, entry, _), (ids, _) in zip(lazy_pairs, row_sums):
                if entry.rows is not None:  # only the pushed rows changed: they join the present rows
                    entry.rows = add_present(entry.rows, ids)
            return
        merged, pushed_rows = self._merge_all(pairs)
        # A user updater may fail half-way: run it on spare copies, then swap them in.
        for _, entry, _ in pairs:
            if entry.spare is None:
                entry.spare = empty(entry.meta)
        fan_out_many([([entry.spare], entry.value) for _, entry, _ in pairs], self._kernels)
        with self._updater_lock:
            for (k, entry, _), m, rows in zip(pairs, merged, pushed_rows):
                updater(k, m if rows is None else as_sparse_like(m, rows), entry.spare)
        for _, entry, _ in pairs:
            entry.value, entry.spare = entry.spare, entry.value
        join_rows(pairs, pushed_rows)

    def _merge_all(self, pairs: Sequence[tuple[Key, _Entry, list[Any]]]
                   ) -> tuple[list[Any], list[np.ndarray[Any, Any] | None]]:
        """Sum each key's pushed values into its reusable merge buffer, as one batch.

        Returns the merge buffers and, per key, the rows its row-sparse pushes hold (None
        when a dense value was pushed: every row).
        """
        for _, entry, _ in pairs:
            if entry.merge is None:
                entry.merge = empty(entry.meta)
        sparse = [any_row_sparse(vals) for _, _, vals in pairs]
        sum_into_many([(entry.merge, vals) for (_, entry, vals), s in zip(pairs, sparse) if not s], self._kernels)
        rows = [merge_into(entry.merge, vals, self._kernels) if s else None for (_, entry, vals), s in zip(pairs, sparse)]
        return [entry.merge for _, entry, _ in pairs], rows

    def _settle_device(self, entry: _Entry, vals: list[Any]) -> None:
        """'device' stores reduce where the pushed values live; move the key there once."""
        if not self._on_device:
            return
        device = value_device(vals[0])
        if device == entry.meta.device:
            return
        entry.value = clone(entry.value, entry.meta, device=device)
        entry.meta = describe(entry.value)
        entry.merge = entry.spare = None

    # -- pull ----------------------------------------------------------------------------
    def pull(self, key: Any, out: Any = None, priority: int = 0, *, ignore_sparse: bool = True,
             block: bool = True, timeout: float | None = None) -> Any:
        """Copy stored values into ``out``, or return new arrays if ``out`` is None.

        Args:
            key: a key or a list of keys.
            out: per key an array or a list of arrays (e.g. one per device; each gets a
                copy, on its own device). None returns new arrays of the kind and device
                the key was initialised with: one array for one key, a list for a list
                (a row-sparse key: a RowSparse, or a torch sparse COO tensor, of its
                present rows). An out of another floating dtype gets the values cast.
            ignore_sparse: row-sparse outs (RowSparse, torch sparse COO) are skipped with
                a warning (MXNet's default; use :meth:`row_sparse_pull`); False fills
                them with the key's present rows (every row of a dense key).
            priority: higher runs first among queued operations.
            block: False returns an :class:`OpHandle`; its ``wait()`` gives the result.
            timeout: seconds to wait behind queued work.

        Raises:
            UnknownKeyError: a key was never initialised.
            ShapeMismatchError, DTypeMismatchError: an out does not match the stored value
                (integer against floating dtypes included).
        """
        self._check_open("pull")
        keys, single = self._key_list(key)
        entries = [self._record(k, "pull") for k in keys]
        if out is None:
            def run_new() -> Any:
                arrays = [self._copy_out(e) for e in entries]
                return arrays[0] if single else arrays
            return self._submit("pull", keys, priority, run_new, block, timeout)
        pairs = pair_up(keys, single, out, "out", None)
        for (k, outs), entry in zip(pairs, entries):
            self._check_like(k, entry, outs, "pull", casts=True)
        if ignore_sparse:
            skipped = [k for k, outs in pairs if any_row_sparse(outs)]
            if skipped:
                warnings.warn(f"pull skipped the row-sparse outs of keys {skipped!r} (ignore_sparse=True, as MXNet); "
                              "use row_sparse_pull, or pull(..., ignore_sparse=False)", UserWarning, stacklevel=2)
                pairs = [(k, [o for o in outs if not is_row_sparse(o)]) for k, outs in pairs]

        def run() -> None:
            self._fill_outs([(outs, entry) for (_, outs), entry in zip(pairs, entries)])
        result = self._submit("pull", keys, priority, run, block, timeout)
        return result if not block else None

    def _fill_outs(self, targets: Sequence[tuple[Sequence[Any], _Entry]]) -> None:
        """Copy each entry's value into its outs: same dtype as one batch; cast, or row-sparse, one by one."""
        same: list[tuple[list[Any], Any]] = []
        rest: list[tuple[Any, _Entry]] = []
        for outs, entry in targets:
            dtype = entry.meta.dtype
            plain = []
            for o in outs:
                if (NUMPY_NAMES.get(o.dtype) == dtype if type(o) is np.ndarray  # the common case: no call
                        else not is_row_sparse(o) and signature(o)[1] == dtype):
                    plain.append(o)
                else:
                    rest.append((o, entry))
            same.append((plain, entry.value))
        fan_out_many(same, self._kernels)
        for o, entry in rest:
            if is_row_sparse(o):
                fill_sparse_out(o, entry.value, present_rows(entry))
            else:
                cast_copy(o, entry.value)

    def _copy_out(self, entry: _Entry) -> Any:
        if entry.rows is not None:
            return present_value(entry)
        new = empty(entry.origin)
        copy_into(new, entry.value, self._kernels)
        return new

    # -- pushpull --------------------------------------------------------------------------
    def pushpull(self, key: Any, value: Any, out: Any = None, priority: int = 0, *, block: bool = True,
                 timeout: float | None = None) -> Any:  # KVStoreBase's overloads type the calls
        """Push ``value``, then pull the result into ``out`` — one operation.

        With ``out=None`` the result is written back into every array of ``value``.
        Errors are those of :meth:`push` and :meth:`pull`; nothing changes on error.
        """
        self._check_open("pushpull")
        listed = self._key_list(key)
        pairs = self._push_pairs(key, value, "pushpull", listed, PUSHPULL_DENSE)
        self._check_compressible(pairs, "pushpull")
        if out is None:
            targets = [(entry, vals) for _, entry, vals in pairs]
        else:
            targets = [(entry, outs) for _, entry, outs in self._out_targets(key, out, "pushpull", listed,
                                                                               PUSHPULL_DENSE)]

        def run() -> None:
            self._apply_pushes(pairs)
            self._fill_outs([(outs, entry) for entry, outs in targets])
        result = self._submit("pushpull", [k for k, _, _ in pairs], priority, run, block, timeout)
        return result if not block else None

    # -- broadcast -------------------------------------------------------------------------
    def broadcast(self, key: Any, value: Any, out: Any = None, priority: int = 0, *, block: bool = True,
                  timeout: float | None = None, root_rank: int = 0) -> Any:  # KVStoreBase's overloads type the calls
        """Store ``value`` under ``key`` and copy it into every ``out``.

        Works for new keys (they are created) and existing ones (overwritten), any number
        of times.

        Args:
            key: a key or a list of keys.
            value: one array per key.
            out: per key an array or a list of arrays; None only stores.
            root_rank: 0, this process's rank (the only one).

        Raises:
            ShapeMismatchError, DTypeMismatchError: ``value`` or an out does not match
                an existing key.
            InvalidArgumentError: ``root_rank`` is not 0.
        """
        self._check_open("broadcast")
        self._root_rank(root_rank)
        keys, single = self._key_list(key)
        dense_only = "broadcast takes dense values and outs (init makes a row-sparse key; row_sparse_pull reads it)"
        values = pair_up(keys, single, value, "value", dense_only)
        outs = pair_up(keys, single, out, "out", dense_only) if out is not None else [(k, []) for k in keys]
        new_keys: list[Key] = []
        plan: list[tuple[Key, Any, list[Any]]] = []
        for (k, vals), (_, k_outs) in zip(values, outs):
            if len(vals) != 1:
                raise InvalidArgumentError(f"broadcast of key {k!r} got {len(vals)} values; give exactly one")
            entry = self._entries.get(k)
            if entry is None:
                new_keys.append(k)
                meta = describe(vals[0])
                probe = _Entry(None, meta, meta)
                self._check_like(k, probe, k_outs, "broadcast")
            else:
                self._check_like(k, entry, vals + k_outs, "broadcast")
            plan.append((k, vals[0], k_outs))
        fresh = set(new_keys)
        if new_keys:
            self.init(new_keys, [v for k, v, _ in plan if k in fresh])
        pinned_values = {k: (None if k in fresh else v) for k, v, _ in plan}

        def run() -> None:
            entries = [self._entries[k] for k, _, _ in plan]
            fan_out_many([([e.value], pinned_values[k]) for (k, _, _), e in zip(plan, entries)
                          if pinned_values[k] is not None], self._kernels)
            for e in entries:
                if e.rows is not None:  # a dense value overwrote a row-sparse key: every row
                    e.rows = all_rows(e)
            fan_out_many([(k_outs, e.value) for (_, _, k_outs), e in zip(plan, entries)], self._kernels)
        result = self._submit("broadcast", keys, priority, run, block, timeout)
        return result if not block else None

    # -- row_sparse_pull -------------------------------------------------------------------
    def row_sparse_pull(self, key: Any, out: Any = None, priority: int = 0, row_ids: Any = None, *,
                        block: bool = True, timeout: float | None = None) -> Any:
        """Pull only the rows ``row_ids`` of a stored array with 2 or more dimensions.

        Row ids are de-duplicated and sorted. Each ``out`` is row-sparse (a RowSparse or a
        torch sparse COO tensor: it then holds exactly the requested rows, MXNet's
        result), full-shaped (the requested rows are copied, every other row is set to
        zero — the dense form of MXNet's result) or compact, with one row per unique
        requested id. An out of another floating dtype gets the rows cast.

        Args:
            key: a key or a list of keys.
            out: like :meth:`pull`; None returns new values (full-shaped arrays; row-sparse ones for row-sparse keys).
            row_ids: an int array or sequence; or a list with one per out. For a key
                list, a list with one entry per key.

        Raises:
            InvalidArgumentError: missing or out-of-range row ids, a 0-d/1-d stored value,
                or a mismatching number of row-id sets.
            ShapeMismatchError, DTypeMismatchError: an out has the wrong shape or dtype.
        """
        self._check_open("row_sparse_pull")
        keys, single = self._key_list(key)
        entries = [self._record(k, "row_sparse_pull") for k in keys]
        new = None
        if out is None and any(e.rows is not None for e in entries):  # a row-sparse key gives a row-sparse value
            new = [empty_sparse(e.origin) if e.rows is not None else empty(e.origin) for e in entries]
            out = new[0] if single else new
        plan = plan_row_pulls(keys, single, [e.meta for e in entries], [e.origin for e in entries], out, row_ids,
                              sparse=True)

        def run() -> Any:
            result = apply_row_plan(plan, [e.value for e in entries], single, self._kernels)
            return result if new is None else (new[0] if single else new)
        result = self._submit("row_sparse_pull", keys, priority, run, block, timeout)
        return result if (not block or plan.returns_new or new is not None) else None

    # -- updater / optimizer ---------------------------------------------------------------
    def set_updater(self, updater: UpdateFn) -> None:
        """Install ``updater(key, merged, stored)``, called on every push instead of assignment.

        ``merged`` is the sum of the pushed values; the updater must change ``stored``
        in place. Keys are passed as they were given (int or str). If it raises, the
        exception propagates out of ``push`` and no stored value changes (the updater
        works on a copy that replaces the stored value only on success).

        Waits for queued operations first.

        Raises:
            InvalidTypeError: ``updater`` is not callable.
        """
        self._check_open("set_updater")
        if not callable(updater):
            raise InvalidTypeError(f"updater must be callable, got {type(updater).__qualname__}")
        self.wait()
        self._updater = updater
        self._builtin_updater = False

    def set_optimizer(self, optimizer: Optimizer) -> None:
        """Run ``optimizer`` (a :class:`pskv.optimizer.Optimizer`) on every push.

        Pushed values are treated as gradients; the stored values are the weights.
        Setting an optimizer again keeps the per-key optimizer state (momentum, ...)
        and takes the new hyperparameters.

        Raises:
            InvalidTypeError: ``optimizer`` is not a pskv optimizer.
        """
        self._check_open("set_optimizer")
        if not isinstance(optimizer, Optimizer):
            raise InvalidTypeError(f"set_optimizer needs a pskv.optimizer.Optimizer, got {type(optimizer).__qualname__}")
        self.wait()
        self._updater = install_optimizer(self._updater if self._builtin_updater else None, optimizer)
        self._builtin_updater = True

    def _optimizer_updater(self, op: str) -> Any:
        if not self._builtin_updater:
            raise OptimizerStateError(f"cannot {op}: no optimizer is set (call set_optimizer first)")
        return self._updater

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Write the optimizer state (and config, if ``dump_optimizer``) to ``fname``.

        The file is a safetensors file (no pickle); see ``docs/optimizers.md``.

        Raises:
            OptimizerStateError: no optimizer is set, or the file cannot be written (naming it).
        """
        self._check_open("save_optimizer_states")
        updater = self._optimizer_updater("save optimizer states")
        self.wait()
        with file_errors("save_optimizer_states", fname):
            updater.save_states(fname, dump_optimizer=dump_optimizer)

    def load_optimizer_states(self, fname: str) -> None:
        """Restore optimizer state saved by :meth:`save_optimizer_states`.

        If the file holds a dumped optimizer config and no optimizer is set, that
        optimizer is installed; a dumped config also replaces the current one.

        Raises:
            OptimizerStateError: the file is missing, unreadable or not a pskv state file, or no
                optimizer is set and the file holds none.
        """
        self._check_open("load_optimizer_states")
        self.wait()
        with file_errors("load_optimizer_states", fname):
            if self._builtin_updater:
                self._updater.load_states(fname)  # type: ignore[union-attr]
                return
            self._updater = updater_from_states(fname, no_config=OptimizerStateError(
                f"cannot load {fname}: the store has no optimizer and the file holds no optimizer "
                "config (call set_optimizer first, or save with dump_optimizer=True)"))
        self._builtin_updater = True

    def restore_rows(self, key: Any, ids: Any, rows: Any) -> None:
        """Make the row-sparse ``key`` hold exactly ``rows`` at the sorted unique ``ids`` (its present rows
        from now on; every other row zero), as a training checkpoint saved them (:mod:`pskv.parallel.checkpoint`).

        Runs in the key's order behind queued operations; the optimizer state is not touched.

        Raises:
            UnknownKeyError: no such key.
            InvalidArgumentError: a dense key, or ids not sorted, unique and in range, or rows that do not fit.
        """
        self._check_open("restore rows")
        keys, _ = self._key_list(key)
        entry = self._record(keys[0], "restore rows")
        if entry.rows is None:
            raise InvalidArgumentError(f"key {keys[0]!r} is dense: only a row-sparse key's rows are restored")
        value = RowSparse(ids, rows, entry.meta.shape)  # checks the ids and the rows' shape

        def run() -> None:
            entry.rows = replace_rows(entry.value, entry.rows, [value])  # type: ignore[arg-type]
        self._submit("restore rows", keys[:1], 0, run, True, None)

    # -- closing -------------------------------------------------------------------------------
    def close(self) -> None:
        """Finish queued work, release threads and buffers. Idempotent.

        Raises:
            OperationTimeoutError: queued work did not finish within the default timeout.
            Exception: the first error of a non-blocking operation nobody waited on.
        """
        if self._closed:
            return
        self._closed = True
        try:
            self._engine.close(self._config.default_timeout)
        finally:
            self._kernels.close()
            self._entries = {}

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._entries)} keys"
        return f"<pskv.LocalStore type={self._type!r} {state}>"

