"""Row-sparse keys of the distributed stores, on the worker: values to rows, rows to outs.

The servers store a row-sparse key by row ranges (:mod:`pskv.worker.rows`,
:mod:`pskv.server.rows`); this module is the store's side of it, with no protocol in
sight:

* :func:`key_meta` — what a row-sparse value (or a :class:`~pskv.arrays.tables.TableInit`)
  given to ``init`` stands for;
* :func:`summed_rows` — a push's values of one key (one per device; row-sparse or dense)
  summed by row on this worker, as the local store sums them: sorted unique ids and a
  NumPy ``(n, width)`` array of their rows (MXNet's dist stores also reduce locally first);
* :func:`fill` — received rows into an out: a row-sparse out holds exactly the rows asked
  for, a full-shaped dense out gets them with every other row zero, a compact one row
  per id (casting between floating dtypes, as ``row_sparse_pull`` does);
* :func:`new_sparse_out` — an empty row-sparse value of a key's kind (``pull(out=None)``,
  ``row_sparse_pull(out=None)`` fill it).

:class:`DistRows` is the store's owner of its row-sparse keys: the
:class:`~pskv.arrays.tables.TableInit` stand-ins and the rows of an ``init``, the rows of a
push, a pull's present rows and ``row_sparse_pull``, sent through the worker's
:class:`~pskv.worker.rows.RowRequests` (``KVWorker.rows``); :class:`~pskv.kvstore.dist.DistStore`
calls it in one line where a call has row-sparse keys or outs. The servers' side is
:mod:`pskv.server.rows`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pskv.arrays import ArrayMeta, CpuKernels, describe, empty, is_torch, to_numpy
from pskv.arrays.rowsparse import RowSparse, any_row_sparse, is_row_sparse
from pskv.arrays.tables import TableInit
from pskv.errors import NotSupportedError
from pskv.kvstore.engine import Deferred
from pskv.kvstore.keys import Key
from pskv.kvstore.local_rows import (
    cast_copy,
    fill_sparse_out,
    scatter_rows,
    sparse_parts,
    zero_rows,
)
from pskv.kvstore.row_ids import RowPlan, apply_row_plan, plan_row_pulls
from pskv.kvstore.staging import is_quick
from pskv.worker import Exchange, KeyLayout, KVWorker

__all__ = ["DistRows", "PresentRows", "RowInit", "key_meta", "summed_rows", "fill", "fill_all", "new_sparse_out", "densified"]

#: A row-sparse key of an ``init``: its layout, the rows given (sorted unique ids, rows ``(n, width)``)
#: and the TableInit the servers draw it from (None: zeros).
RowInit = tuple[KeyLayout, np.ndarray[Any, Any], np.ndarray[Any, Any], "TableInit | None"]

_NO_ROWS = np.zeros(0, np.int64)  # a pull of present rows names none


def key_meta(key: Any, value: Any) -> ArrayMeta:
    """What a row-sparse value or a TableInit given to ``init`` stands for (kind, device, shape, dtype).

    Raises:
        NotSupportedError: bfloat16, no rows or empty rows (the servers store rows of at least one element).
    """
    if isinstance(value, (RowSparse, TableInit)):
        meta = ArrayMeta("numpy", value.shape, value.dtype, "cpu")
    else:
        meta = describe(value)
    if meta.dtype == "bfloat16" or not meta.shape[0] or meta.size == 0:
        raise NotSupportedError(f"init of key {key!r}: the distributed stores keep row-sparse keys of at least one "
                                f"row of at least one element, not bfloat16; got {meta.dtype} {meta.shape}")
    return meta


def _host(data: Any) -> np.ndarray[Any, Any]:
    return to_numpy(data) if is_torch(data) else np.asarray(data)


def summed_rows(values: Sequence[Any], meta: ArrayMeta) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The sum of ``values`` (row-sparse or dense, of the key ``meta`` describes) by row:
    ``(sorted unique int64 ids, rows (n, width) of the key's dtype)`` on the CPU."""
    width = meta.size // meta.shape[0]
    dtype = np.dtype(meta.dtype)
    parts = []
    for v in values:
        if is_row_sparse(v):
            ids, data = sparse_parts(v)
        else:
            ids, data = np.arange(meta.shape[0], dtype=np.int64), v
        parts.append((ids, _host(data).reshape(-1, width).astype(dtype, copy=False)))
    if len(parts) == 1:
        return parts[0]
    ids = np.concatenate([i for i, _ in parts])
    rows = np.concatenate([r for _, r in parts])
    unique, inverse = np.unique(ids, return_inverse=True)
    out = np.zeros((unique.size, width), dtype)
    np.add.at(out, inverse, rows)
    return unique, out


def new_sparse_out(meta: ArrayMeta) -> Any:
    """An empty row-sparse value of the key's kind: a RowSparse, or a sparse COO tensor on its device."""
    if meta.backend == "numpy":
        return RowSparse.zeros(meta.shape, meta.dtype)
    torch = sys.modules["torch"]
    dtype = getattr(torch, meta.dtype)
    return torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64), torch.zeros((0,) + tuple(meta.shape[1:]),
                                   dtype=dtype), tuple(meta.shape), device=meta.device, is_coalesced=True,
                                   check_invariants=False)


def fill(out: Any, mode: str, shape: tuple[int, ...], union: np.ndarray[Any, Any], rows: np.ndarray[Any, Any],
         wanted: np.ndarray[Any, Any]) -> None:
    """Write the rows ``wanted`` (a subset of ``union``, whose rows ``rows`` are) into ``out``.

    ``mode`` as :class:`pskv.kvstore.row_ids.RowPlan`'s steps: ``"sparse"``, ``"full"``, ``"compact"``.
    """
    picked = rows[np.searchsorted(union, wanted)].reshape((wanted.size,) + tuple(shape[1:]))
    if mode == "sparse":
        if isinstance(out, RowSparse):
            out._assign(wanted, np.array(picked, dtype=out.data.dtype))
            return
        torch = sys.modules["torch"]
        index = torch.from_numpy(wanted.reshape(1, -1).copy())
        values = torch.from_numpy(np.ascontiguousarray(picked))
        out.copy_(torch.sparse_coo_tensor(index, values, tuple(out.shape), is_coalesced=True,
                                          check_invariants=False))
    elif mode == "full":
        zero_rows(out)
        scatter_rows(out, wanted, picked, add=False)
    else:
        cast_copy(out, picked)


def fill_all(out: Any, value: Any) -> None:
    """A row-sparse ``out`` holds every row of a dense key's pulled ``value``."""
    fill_sparse_out(out, value, np.arange(value.shape[0], dtype=np.int64))


def densified(values: Sequence[Any]) -> list[Any]:
    """``values`` with row-sparse ones made dense (a push of them to a dense key: summed like dense ones);
    ``values`` itself when none is (every dense push asks)."""
    if not any_row_sparse(values):
        return values if isinstance(values, list) else list(values)
    out = []
    for v in values:
        if isinstance(v, RowSparse):
            out.append(v.todense())
        elif is_row_sparse(v):
            out.append(v.to_dense())
        else:
            out.append(v)
    return out


def _no_rows(rec: KeyLayout) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """What a key none of whose servers answered rows holds: no ids, no rows."""
    return np.zeros(0, np.int64), np.zeros((0, rec.row_width))


class PresentRows:
    """A pull's row-sparse side in flight: the present rows of row-sparse keys, asked for, and the
    row-sparse outs they (or a dense key's value) go to.

    Args:
        worker: the worker whose row requests carry it.
        asked: the row pull (None: no row-sparse key asked).
        present: per row-sparse key asked (index into the call's keys), its layout.
        outs: ``(index of the key, a row-sparse out)`` to fill.
    """

    def __init__(self, worker: KVWorker, asked: Exchange | None, present: dict[int, KeyLayout],
                 outs: Sequence[tuple[int, Any]]) -> None:
        self._worker = worker
        self._asked = asked
        self._present = present
        self._outs = outs
        self.replies = asked.replies if asked is not None else []

    def finish(self, values: dict[int, Any], recs: Sequence[KeyLayout], timeout: float | None,
               new: bool) -> dict[int, Any]:
        """Wait for the rows; fill the row-sparse outs (a dense key's from its pulled ``values``).

        Returns: ``new``: a new row-sparse value of each row-sparse key's present rows, by index.
        """
        got = self._worker.rows.values(self._asked, timeout) if self._asked is not None else {}
        rows = {i: got[id(rec)] if id(rec) in got else _no_rows(rec) for i, rec in self._present.items()}
        for i, o in self._outs:
            if i in rows:  # a row-sparse key: its present rows
                fill(o, "sparse", recs[i].meta.shape, rows[i][0], rows[i][1], rows[i][0])
            else:  # a dense key: every row
                fill_all(o, values[id(recs[i])])
        made = {}
        if new:
            for i, rec in self._present.items():
                made[i] = value = new_sparse_out(rec.meta)
                fill(value, "sparse", rec.meta.shape, rows[i][0], rows[i][1], rows[i][0])
        return made


class DistRows:
    """The row-sparse keys of one distributed store, on its worker.

    Args:
        worker: the store's worker layer (its ``rows`` send the requests).
        kernels: the store's CPU kernels (dense keys' values into ``row_sparse_pull``'s outs).
    """

    def __init__(self, worker: KVWorker, kernels: CpuKernels) -> None:
        self._worker = worker
        self._kernels = kernels
        self._nothing = PresentRows(worker, None, {}, ())  # a pull without row-sparse keys or outs

    # -- init -------------------------------------------------------------------------------
    def layout(self, key: Key, value: Any, summed: bool, refuse: Callable[[Key, ArrayMeta, bool, str], None]
               ) -> KeyLayout:
        """The layout of a new row-sparse key from its init value (split by server row ranges).

        Raises:
            NotSupportedError: the servers cannot keep it (:func:`key_meta`), or ``refuse`` (the store's rule on
                gradient compression) does: a key not ``summed`` under compression.
        """
        meta = key_meta(key, value)
        if not summed:
            refuse(key, meta, True, "init")
        return self._worker.layout(key, meta, sparse=True)

    @staticmethod
    def tables(key: Any, value: Any) -> tuple[Any, dict[int, TableInit]]:
        """``value`` with each :class:`TableInit` replaced by an empty RowSparse of its shape (by ``id``: the
        table), so an ``init`` checks and lays it out as any row-sparse value; the servers draw it."""
        found: dict[int, TableInit] = {}

        def swap(v: Any) -> Any:
            if isinstance(v, TableInit):
                stand_in = RowSparse.zeros(v.shape, v.dtype)
                found[id(stand_in)] = v
                return stand_in
            return v
        if isinstance(key, (list, tuple)) and isinstance(value, (list, tuple)):
            return [swap(v) for v in value], found
        return swap(value), found

    @staticmethod
    def staged(pairs: Sequence[tuple[Key, KeyLayout, list[Any]]], tables: dict[int, TableInit],
               summed: bool) -> list[RowInit]:
        """The row-sparse keys among an ``init``'s ``pairs``, their values summed by row (``summed``: keys whose
        rounds store the plain sum)."""
        out = []
        for _, rec, vals in pairs:
            if rec.sparse:
                rec.summed = summed
                out.append((rec, *summed_rows(vals, rec.meta), tables.get(id(vals[0]))))
        return out

    def init(self, items: Sequence[RowInit], summed: bool) -> None:
        """Create the keys ``items`` on their servers (rows only; a TableInit is drawn by the servers)."""
        if items:
            self._worker.rows.init([(rec, ids, rows, None if table is None else table.init)
                                    for rec, ids, rows, table in items], summed=summed)

    # -- push / pull ------------------------------------------------------------------------
    def push(self, items: Sequence[tuple[Key, KeyLayout, list[Any]]], sent: Exchange | None, priority: int,
             timeout: float | None, quiet: bool) -> Exchange:
        """Push the values of row-sparse keys, summed on this worker by row (each server gets the rows of its
        range), with the dense push ``sent`` of the same call (if any) in the exchange returned."""
        more = self._worker.rows.push([(rec, *summed_rows(vals, rec.meta)) for _, rec, vals in items],
                                      priority, timeout, quiet)
        if sent is not None:
            more.messages += sent.messages
            more.replies += sent.replies
        return more

    def pull_present(self, recs: Sequence[KeyLayout], present: Sequence[int], outs: Sequence[tuple[int, Any]],
                     priority: int, timeout: float | None) -> PresentRows:
        """Ask for the present rows of the row-sparse keys ``recs[i]`` for ``i`` in ``present``; ``outs``:
        ``(index of the key, a row-sparse out)`` to fill once they arrive (:meth:`PresentRows.finish`)."""
        if not present and not outs:
            return self._nothing
        asked = self._worker.rows.pull([(recs[i], _NO_ROWS) for i in present], priority, timeout, present=True) \
            if present else None
        return PresentRows(self._worker, asked, {i: recs[i] for i in present}, outs)

    def row_sparse_pull(self, keys: Sequence[Key], single: bool, recs: Sequence[KeyLayout], out: Any,
                        row_ids: Any, priority: int, timeout: float | None
                        ) -> tuple[Callable[[], Deferred], bool, list[Any] | None]:
        """``row_sparse_pull`` of checked keys: ``(start, quick, made)`` for the store's engine.

        A row-sparse key's servers send only the rows asked for; a dense key's value travels
        whole. ``made``: the new values (``out=None``: row-sparse ones for row-sparse keys).
        """
        metas = [rec.meta for rec in recs]
        made = None
        if out is None:  # new values: row-sparse for row-sparse keys, as the local store
            made = [new_sparse_out(rec.meta) if rec.sparse else empty(rec.meta) for rec in recs]
        plan = plan_row_pulls(keys, single, metas, metas, made[0] if made and single else made if made else out,
                              row_ids, sparse=True)
        dense = [i for i, rec in enumerate(recs) if not rec.sparse]
        wanted: dict[int, Any] = {}  # per row-sparse key: the union of its outs' rows
        for i, _, rows, _ in plan.steps:
            if recs[i].sparse:
                wanted[i] = rows if i not in wanted else np.union1d(wanted[i], rows)
        quick = not wanted and is_quick(recs, [a for _, k_outs in plan.outs for a in k_outs if not is_row_sparse(a)])
        worker = self._worker
        dense_plan = RowPlan(plan.outs, [s for s in plan.steps if not recs[s[0]].sparse], False)

        def start() -> Deferred:
            sent = worker.pull([recs[i] for i in dense], priority, timeout) if dense else None
            asked = worker.rows.pull([(recs[i], ids) for i, ids in wanted.items()], priority, timeout) \
                if wanted else None

            def finish() -> Any:
                if sent is not None:
                    values = worker.values(sent, timeout)
                    apply_row_plan(dense_plan, [values.get(id(rec)) for rec in recs], False, self._kernels)
                got = worker.rows.values(asked, timeout) if asked is not None else {}
                for i, o, rows, mode in plan.steps:
                    if recs[i].sparse:
                        ids, data = got.get(id(recs[i]), (wanted[i][:0], np.zeros((0, recs[i].row_width))))
                        fill(o, mode, recs[i].meta.shape, ids, data, rows)
                if made is not None:
                    return made[0] if single else made
                return None
            replies = (sent.replies if sent is not None else []) + (asked.replies if asked is not None else [])
            return Deferred(replies, finish, inline=quick)
        return start, quick, made
