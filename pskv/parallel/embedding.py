"""Embedding tables that live in the store: ``Embedding`` and ``EmbeddingBag`` over a row-sparse key.

The table is a row-sparse key of a pskv store (on the servers for the ``dist_*`` stores),
never a dense ``torch.nn.Parameter`` on the worker. Each forward takes the batch's ids,
finds the unique ones, ``row_sparse_pull``\\ s exactly those rows and looks them up; the
backward pass produces the gradient of those rows (duplicates summed by autograd) and
pushes it to the store as a row-sparse value, where the store's optimizer
(``set_optimizer``, e.g. the :class:`~pskv.parallel.Trainer`'s with
``update_on_kvstore``) updates only those rows (``Optimizer.update_rows``, lazily).

One push per step: the table counts the forwards that need a gradient and pushes once
all their gradients are in (all replicas of a :class:`DataParallelExecutorGroup` in one
push, which the store sums). Under a :class:`~pskv.parallel.Trainer` the trainer also
makes sure every step pushes exactly once (an empty push if nothing was touched, so
synchronous rounds complete) and waits for it in ``step()``.

Replicas share the table: ``copy.deepcopy`` of a module (what the group does) keeps the
same :class:`StoreTable`, and a second module built for the same store and key (a
replica factory) attaches to it instead of creating the key again.

Prefetching: :meth:`StoreTable.prefetch` (``emb.prefetch(next_ids)``) starts a
non-blocking ``row_sparse_pull`` of the next batch's rows; while a step is open (a
forward waits for its push) the pull is started right after that push is submitted, so
the store's per-key order makes it read the updated rows and the numbers are those of
no prefetch. :class:`PrefetchingIter` wraps a data iterator and does this for every batch.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - torch's own spelling

from pskv.arrays.rowsparse import RowSparse
from pskv.arrays.tables import TableInit
from pskv.errors import InvalidArgumentError, InvalidTypeError, ShapeMismatchError
from pskv.kvstore import KVStoreBase
from pskv.parallel.data import begin_epoch

__all__ = ["Embedding", "EmbeddingBag", "StoreTable", "PrefetchingIter", "store_tables"]

_DTYPES = {torch.float16: "float16", torch.float32: "float32", torch.float64: "float64"}
#: The initializer of a table created without ``init`` (torch.nn.Embedding's N(0, 1)).
DEFAULT_INIT: dict[str, Any] = {"type": "normal", "mean": 0.0, "std": 1.0, "seed": 0}

# store -> (its lock, key -> its table), so that replicas built by a factory share one table. The
# global lock is never held across kv.init (a collective: other workers may be threads of this process).
_TABLES: weakref.WeakKeyDictionary[Any, tuple[threading.Lock, dict[Any, StoreTable]]] = weakref.WeakKeyDictionary()
_TABLES_LOCK = threading.Lock()


def wait_handles(handles: Iterable[Any], errors: Iterable[BaseException] = ()) -> None:
    """Wait for every handle; raise the first of ``errors`` (kept earlier) or of the handles' errors."""
    failure: BaseException | None = next(iter(errors), None)
    for h in handles:
        try:
            h.wait()
        except BaseException as exc:
            failure = failure or exc
    if failure is not None:
        raise failure


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidArgumentError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


class _Prefetch:
    """One prefetched pull: sorted unique ids, their rows (CPU), the pull's handle, the push it follows."""

    __slots__ = ("ids", "rows", "handle", "generation", "lock", "ready")

    def __init__(self, ids: np.ndarray[Any, Any], rows: torch.Tensor, handle: Any, generation: int) -> None:
        self.ids = ids
        self.rows = rows
        self.handle = handle
        self.generation = generation
        self.lock = threading.Lock()
        self.ready = False

    def wait(self) -> torch.Tensor:
        with self.lock:
            if not self.ready and self.handle is not None:
                self.handle.wait()
            self.ready = True
        return self.rows


class StoreTable:
    """The shared handle of one embedding table in a store: pulls, pushes, prefetches, counts.

    Built by :class:`Embedding` / :class:`EmbeddingBag` (use them); one per ``(store,
    key)``. ``stats`` counts what moved: ``pulls``, ``rows_pulled``, ``pushes``,
    ``rows_pushed``, ``prefetch_hits``, ``prefetch_misses``, and ``pull_wait_s``: seconds
    forwards spent waiting for rows (a pull, or a prefetch not yet in).

    Attributes:
        scale: gradients are multiplied by it before a push (the Trainer sets it for a
            batch of another size than the one the store's ``rescale_grad`` is for).
        auto_push: push as soon as every forward's gradient is in (else at :meth:`flush`;
            a Trainer over a plain module pushes at ``step()``).
    """

    def __init__(self, kv: KVStoreBase, key: Any, num_embeddings: int, embedding_dim: int, dtype: torch.dtype,
                 name: str, priority: int = 0) -> None:
        self.kv = kv
        self.key = key
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.dtype = dtype
        self.name = name
        self.priority = priority
        self.scale = 1.0
        self.auto_push = True
        self._lock = threading.Lock()
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []  # (unique ids on CPU, gradient rows)
        self._outstanding = 0  # forwards of this step whose gradient has not come yet
        self._pushed_this_step = False
        self._handles: list[Any] = []
        self._errors: list[BaseException] = []
        self._generation = 0  # pushes submitted so far
        self._prefetch: _Prefetch | None = None
        self._queued: np.ndarray[Any, Any] | None = None  # ids to prefetch once this step's push is submitted
        self.stats: dict[str, float] = dict.fromkeys(("pulls", "rows_pulled", "pushes", "rows_pushed",
                                                      "prefetch_hits", "prefetch_misses", "pull_wait_s"), 0)

    def __deepcopy__(self, memo: dict[int, Any]) -> StoreTable:  # replicas share the table
        return self

    def __repr__(self) -> str:
        return (f"StoreTable(key={self.key!r}, shape=({self.num_embeddings}, {self.embedding_dim}), "
                f"dtype={_DTYPES[self.dtype]}, store={self.kv.type!r})")

    @property
    def what(self) -> str:
        """How errors name this table: the module class and the store key."""
        return f"{self.name} (store key {self.key!r})"

    # -- ids -------------------------------------------------------------------------------
    def check_ids(self, ids: Any) -> torch.Tensor:
        """``ids`` as an integer tensor whose values are row ids of this table.

        Raises:
            InvalidTypeError: not a tensor or NumPy array of integers.
            InvalidArgumentError: an id is negative or ``>= num_embeddings``.
        """
        if isinstance(ids, np.ndarray):
            ids = torch.from_numpy(ids)
        if not isinstance(ids, torch.Tensor) or ids.is_sparse:
            raise InvalidTypeError(f"{self.what}: ids must be a dense integer tensor, got {type(ids).__name__}")
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise InvalidTypeError(f"{self.what}: ids must be integers, got dtype {ids.dtype}")
        if ids.numel():
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= self.num_embeddings:
                flat = ids.reshape(-1)
                bad = flat[(flat < 0) | (flat >= self.num_embeddings)][:8].tolist()
                raise InvalidArgumentError(f"{self.what}: ids {bad} out of range for {self.num_embeddings} rows "
                                           f"(valid: 0..{self.num_embeddings - 1})")
        return ids

    # -- forward ---------------------------------------------------------------------------
    def lookup(self, ids: torch.Tensor, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rows, inverse)``: the batch's unique rows on ``ids``' device and each id's position in them.

        With ``train`` the rows require a gradient, which is pushed when it comes.
        """
        unique, inverse = torch.unique(ids, sorted=True, return_inverse=True)
        unique_cpu = unique.to("cpu", torch.int64)
        host = self._rows_for(unique_cpu.numpy())
        rows = host.to(ids.device) if host.device != ids.device else host
        if train:
            rows = rows.detach().requires_grad_(True)
            with self._lock:
                self._outstanding += 1
            rows.register_hook(self._gradient_hook(unique_cpu))
        return rows, inverse

    def rows(self, ids: Any) -> torch.Tensor:
        """The current rows ``ids`` (any shape; a tensor of shape ``ids.shape + (dim,)``, no gradient)."""
        ids = self.check_ids(ids)
        with torch.no_grad():
            rows, inverse = self.lookup(ids, train=False)
            return rows[inverse]

    def _rows_for(self, ids: np.ndarray[Any, Any]) -> torch.Tensor:
        """Rows ``ids`` (sorted unique) on the CPU: from a prefetch that covers them and is current, else pulled."""
        pf = self._prefetch
        if pf is not None and pf.generation == self._generation and len(ids) <= len(pf.ids):
            pos = np.searchsorted(pf.ids, ids)
            if len(ids) == 0 or (pos[-1] < len(pf.ids) and bool(np.all(pf.ids[pos] == ids))):
                start = time.perf_counter()
                rows = pf.wait()
                with self._lock:
                    self.stats["prefetch_hits"] += 1
                    self.stats["pull_wait_s"] += time.perf_counter() - start
                return rows if len(ids) == len(pf.ids) else rows.index_select(0, torch.from_numpy(pos))
        if pf is not None:
            with self._lock:
                self.stats["prefetch_misses"] += 1
        rows = torch.empty((len(ids), self.embedding_dim), dtype=self.dtype)
        if len(ids):
            start = time.perf_counter()
            self.kv.row_sparse_pull(self.key, out=rows, row_ids=ids, priority=self.priority)
            with self._lock:
                self.stats["pulls"] += 1
                self.stats["rows_pulled"] += len(ids)
                self.stats["pull_wait_s"] += time.perf_counter() - start
        return rows

    # -- backward --------------------------------------------------------------------------
    def _gradient_hook(self, unique: torch.Tensor) -> Callable[[torch.Tensor], None]:
        def arrived(grad: torch.Tensor) -> None:
            with self._lock:
                self._pending.append((unique, grad.detach()))
                self._outstanding -= 1
                due = self._outstanding == 0 and self.auto_push
            if due:
                try:
                    self._push()
                except BaseException as exc:  # raised by flush()/wait(): never lost inside autograd
                    with self._lock:
                        self._errors.append(exc)
        return arrived

    def _push(self, empty: bool = False) -> None:
        """Push the gradients that came (one value per forward; the store sums them), or an empty one."""
        with self._lock:
            pending, self._pending = self._pending, []
            self._outstanding = 0
            if not pending and not empty:
                return
            self._pushed_this_step = True
            scale = self.scale
        shape = (self.num_embeddings, self.embedding_dim)
        values = []
        for unique, grad in pending:
            g = grad if scale == 1.0 else grad * scale
            index = unique.to(g.device).reshape(1, -1)
            values.append(torch.sparse_coo_tensor(index, g, shape, is_coalesced=True, check_invariants=False))
        if not values:
            values.append(torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64),
                                                  torch.zeros((0, self.embedding_dim), dtype=self.dtype), shape,
                                                  is_coalesced=True, check_invariants=False))
        handle = self.kv.push(self.key, values if len(values) > 1 else values[0], priority=self.priority, block=False)
        with self._lock:
            self._handles.append(handle)
            self._generation += 1
            self.stats["pushes"] += 1
            self.stats["rows_pushed"] += sum(int(u.numel()) for u, _ in pending)
            queued, self._queued = self._queued, None
            self._prefetch = None
        if queued is not None:
            self._start_prefetch(queued)

    # -- steps -----------------------------------------------------------------------------
    def begin_step(self) -> None:
        """A new step starts (the Trainer calls it at every forward of its group)."""
        with self._lock:
            if self._outstanding == 0 and not self._pending:
                self._pushed_this_step = False

    def flush(self, push_empty: bool = False) -> None:
        """Push the gradients that came and have not been pushed; with ``push_empty``, make sure
        this step pushed once (an empty push if nothing was touched: a synchronous round needs
        every worker's push)."""
        with self._lock:
            need_empty = push_empty and not self._pushed_this_step
        self._push(empty=need_empty)

    def end_step(self) -> None:
        """The Trainer's step ends: the next forward opens a new one."""
        with self._lock:
            self._pushed_this_step = False

    def wait(self) -> None:
        """Wait for the pushes submitted so far; raise the first error of one."""
        with self._lock:
            handles, self._handles = self._handles, []
            errors, self._errors = self._errors, []
        wait_handles(handles, errors)

    # -- prefetch --------------------------------------------------------------------------
    def prefetch(self, ids: Any) -> None:
        """Start pulling the rows ``ids`` (the next batch's) without waiting.

        While a forward of this step waits for its push, the pull starts right after that
        push is submitted (so it reads the updated rows); otherwise at once. A forward
        whose unique ids are among them uses these rows, as long as no push came in
        between; any other forward pulls as usual.
        """
        ids = self.check_ids(ids)
        unique = np.unique(ids.reshape(-1).to("cpu", torch.int64).numpy())
        with self._lock:
            if self._outstanding or self._pending:
                self._queued = unique
                return
        self._start_prefetch(unique)

    def forget_prefetch(self) -> None:
        """Drop a prefetch and the ids queued for one: the table's rows were replaced (a checkpoint loaded)."""
        with self._lock:
            self._prefetch = None
            self._queued = None
            self._generation += 1

    def prefetch_after_push(self, ids: Any) -> None:
        """Pull the rows ``ids`` as soon as the next push is submitted (a data iterator calls it
        before handing out the current batch, for the batch after it)."""
        ids = self.check_ids(ids)
        unique = np.unique(ids.reshape(-1).to("cpu", torch.int64).numpy())
        with self._lock:
            self._queued = unique

    def _start_prefetch(self, unique: np.ndarray[Any, Any]) -> None:
        rows = torch.empty((len(unique), self.embedding_dim), dtype=self.dtype)
        handle = None
        if len(unique):
            handle = self.kv.row_sparse_pull(self.key, out=rows, row_ids=unique, priority=self.priority, block=False)
        with self._lock:
            self._prefetch = _Prefetch(unique, rows, handle, self._generation)
            self.stats["pulls"] += 1 if len(unique) else 0
            self.stats["rows_pulled"] += len(unique)


def _table_init(init: Any, num: int, dim: int, dtype: torch.dtype, what: str) -> Any:
    """What ``kv.init`` gets: a RowSparse of a dense array's rows, or a TableInit."""
    if init is None:
        init = DEFAULT_INIT
    if isinstance(init, Mapping):
        return TableInit((num, dim), _DTYPES[dtype], init)
    if isinstance(init, TableInit):
        if init.shape != (num, dim) or init.dtype != _DTYPES[dtype]:
            raise ShapeMismatchError(what, "init", (num, dim), init.shape)
        return init
    if isinstance(init, torch.Tensor):
        init = init.detach().to("cpu", dtype).numpy()
    if not isinstance(init, np.ndarray):
        raise InvalidTypeError(f"{what}: init must be a dense array, a TableInit or an initializer dict, "
                               f"got {type(init).__name__}")
    if init.shape != (num, dim):
        raise ShapeMismatchError(what, "init", (num, dim), tuple(init.shape))
    return RowSparse.from_dense(np.ascontiguousarray(init, dtype=np.dtype(_DTYPES[dtype])))


def _attach(kv: Any, key: Any, num: int, dim: int, dtype: torch.dtype, init: Any, create: bool, name: str,
            priority: int) -> StoreTable:
    """The table of ``(kv, key)``: the existing one (a replica), or a new one (creating the key if ``create``)."""
    if not isinstance(kv, KVStoreBase):
        raise InvalidTypeError(f"{name}: kv must be a pskv store, got {type(kv).__name__}")
    if dtype not in _DTYPES:
        raise InvalidArgumentError(f"{name}: dtype must be one of {sorted(map(str, _DTYPES))}, got {dtype}")
    with _TABLES_LOCK:
        lock, tables = _TABLES.setdefault(kv, (threading.Lock(), {}))
    with lock:
        table = tables.get(key)
        if table is not None:
            if (table.num_embeddings, table.embedding_dim, table.dtype) != (num, dim, dtype):
                raise ShapeMismatchError(key, name, (table.num_embeddings, table.embedding_dim), (num, dim))
            return table
        table = StoreTable(kv, key, num, dim, dtype, name, priority)
        if create:
            value = _table_init(init, num, dim, dtype, table.what)
            if isinstance(value, TableInit) and not kv.store_type.distributed:
                value = RowSparse.from_dense(value.todense())  # a single-process store holds the table here anyway
            kv.init(key, value)
        tables[key] = table
        return table


class _StoreModule(torch.nn.Module):
    """What Embedding and EmbeddingBag share: the table, its checks, prefetch and flush."""

    table: StoreTable

    def __init__(self, num_embeddings: int, embedding_dim: int, kv: KVStoreBase, key: Any, init: Any,
                 dtype: torch.dtype, create: bool, priority: int) -> None:
        super().__init__()
        num = _positive("num_embeddings", num_embeddings)
        dim = _positive("embedding_dim", embedding_dim)
        self.num_embeddings = num
        self.embedding_dim = dim
        self.table = _attach(kv, key, num, dim, dtype, init, create, type(self).__name__, priority)

    @property
    def kv(self) -> KVStoreBase:
        """The store holding the table."""
        return self.table.kv

    @property
    def key(self) -> Any:
        """The table's store key."""
        return self.table.key

    def _rows(self, ids: Any) -> tuple[torch.Tensor, torch.Tensor]:
        ids = self.table.check_ids(ids)
        return self.table.lookup(ids, train=self.training and torch.is_grad_enabled())

    def prefetch(self, ids: Any) -> None:
        """Start pulling the rows of ``ids`` (the next batch's): see :meth:`StoreTable.prefetch`."""
        self.table.prefetch(ids)

    def flush(self) -> None:
        """Push the gradients not pushed yet and wait for every push (raises a push's error)."""
        self.table.flush()
        self.table.wait()

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, key={self.table.key!r}, store={self.table.kv.type!r}"


class Embedding(_StoreModule):
    """``torch.nn.Embedding`` whose table is a row-sparse key of a pskv store.

    Args:
        num_embeddings: the table's number of rows.
        embedding_dim: the table's width (values per row).
        kv: the store (``local``, ``device``, ``dist_sync``, ``dist_async``...).
        key: the table's store key.
        init: a dense ``(num_embeddings, embedding_dim)`` array or tensor (small tables:
            its rows are sent), a :class:`~pskv.TableInit` or an initializer dict
            (``{'type': 'normal', 'std': 0.01, 'seed': 0}``: a distributed store's
            servers draw the rows, the table never exists on a worker). Default: N(0, 1)
            with seed 0.
        dtype: float16, float32 (default) or float64.
        create: ``kv.init`` the key (a collective in a distributed store: every worker
            builds its modules in the same order); False attaches to an existing key.
        priority: the priority of the table's pulls and pushes.

    ``forward(ids)`` returns ``ids.shape + (embedding_dim,)``. The gradient is pushed to
    the store; the store's optimizer updates the rows.

    Raises:
        InvalidArgumentError, InvalidTypeError, ShapeMismatchError: bad arguments; in
            forward, ids that are not integers or out of range (naming the key).
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, kv: KVStoreBase, key: Any, *, init: Any = None,
                 dtype: torch.dtype = torch.float32, create: bool = True, priority: int = 0) -> None:
        super().__init__(num_embeddings, embedding_dim, kv, key, init, dtype, create, priority)

    def forward(self, ids: Any) -> torch.Tensor:
        rows, inverse = self._rows(ids)
        return F.embedding(inverse, rows)


_BAG_MODES = ("sum", "mean")


class EmbeddingBag(_StoreModule):
    """``torch.nn.EmbeddingBag`` (``mode='sum'`` or ``'mean'``) whose table is a row-sparse key of a store.

    Same arguments as :class:`Embedding`, plus ``mode``. ``forward(ids, offsets=None,
    per_sample_weights=None)`` as ``torch.nn.EmbeddingBag``'s: 2-D ``ids`` (one bag per
    row) or 1-D ``ids`` with ``offsets``; ``per_sample_weights`` with ``mode='sum'``.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, kv: KVStoreBase, key: Any, *, mode: str = "mean",
                 init: Any = None, dtype: torch.dtype = torch.float32, create: bool = True, priority: int = 0) -> None:
        if mode not in _BAG_MODES:
            raise InvalidArgumentError(f"EmbeddingBag mode must be one of {_BAG_MODES}, got {mode!r}")
        super().__init__(num_embeddings, embedding_dim, kv, key, init, dtype, create, priority)
        self.mode = mode

    def forward(self, ids: Any, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        rows, inverse = self._rows(ids)
        return F.embedding_bag(inverse, rows, offsets, mode=self.mode, per_sample_weights=per_sample_weights)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mode={self.mode!r}"


def store_tables(modules: Iterable[torch.nn.Module]) -> list[StoreTable]:
    """The distinct store tables of the embedding modules in ``modules`` (and their submodules)."""
    found: dict[int, StoreTable] = {}
    for module in modules:
        for m in module.modules():
            if isinstance(m, _StoreModule):
                found.setdefault(id(m.table), m.table)
    return list(found.values())


class PrefetchingIter:
    """Wraps a data iterator: before handing out a batch, asks each table to prefetch the next batch's rows.

    Args:
        data: batches (an ``NDArrayIter``, a DataLoader, a list...); ``reset`` /
            ``set_epoch`` / ``len`` are passed on.
        lookups: ``{module: ids_of}`` — for each :class:`Embedding` / :class:`EmbeddingBag`,
            a function giving the ids it will see in a batch (for a group: the whole
            batch's).

    The pull for batch ``t + 1`` starts as soon as step ``t``'s push of that table is
    submitted (during backward), and runs while the rest of the step does.
    """

    def __init__(self, data: Iterable[Any], lookups: Mapping[_StoreModule, Callable[[Any], Any]]) -> None:
        if not lookups:
            raise InvalidArgumentError("PrefetchingIter needs at least one {module: ids_of} entry")
        for m, f in lookups.items():
            if not isinstance(m, _StoreModule) or not callable(f):
                raise InvalidTypeError("PrefetchingIter lookups map Embedding/EmbeddingBag modules to functions "
                                       f"batch -> ids, got {type(m).__name__}: {type(f).__name__}")
        self.data = data
        self.lookups = dict(lookups)

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.data)
        try:
            current = next(it)
        except StopIteration:
            return
        for upcoming in it:
            for module, ids_of in self.lookups.items():
                module.table.prefetch_after_push(ids_of(upcoming))
            yield current
            current = upcoming
        yield current

    def __len__(self) -> int:
        return len(self.data)  # type: ignore[arg-type]

    def reset(self) -> None:
        if hasattr(self.data, "reset"):
            self.data.reset()

    def set_epoch(self, epoch: int) -> None:
        begin_epoch(self.data, epoch)  # a wrapped DataLoader's DistributedSampler gets set_epoch too

