"""Row-sparse values in the single-process stores: merging pushes, filling outs, casting copies.

The ``local`` and ``device`` stores keep a row-sparse key's table dense (rows not present
are zero) and remember which rows are present (``None``: a dense key, every row). A push
of row-sparse values without an updater touches only the rows present before and after
(:func:`replace_rows`), so it costs the rows, not the table; with an optimizer whose
``lazy_update`` is set, a push of row-sparse values is summed by row (:func:`merge_rows`)
and updates only those rows (``Optimizer.update_rows``). A
row-sparse value is a :class:`~pskv.arrays.rowsparse.RowSparse` or a PyTorch sparse COO
tensor; its rows are added into the table where it lives (a CUDA tensor's on its device).

The functions on a store's keys (:class:`RowKey`: :func:`store_pushes`, :func:`join_rows`,
:func:`present_value`, ...) keep a key's present rows in step with its table, so
:class:`~pskv.kvstore.local.LocalStore` calls one line for them. The distributed stores'
row-sparse keys are :mod:`pskv.kvstore.dist_rows`; row ids of ``row_sparse_pull``
:mod:`pskv.kvstore.row_ids`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from pskv.arrays import ArrayMeta, CpuKernels, describe, is_torch, sum_into, sum_into_many, to_numpy, torch_dtype
from pskv.arrays.rowsparse import RowSparse, any_row_sparse, coo_parts, is_row_sparse

__all__ = ["sparse_parts", "value_device", "merge_into", "merge_rows", "add_present", "replace_rows", "nonzero_rows", "gather_rows",
           "scatter_rows", "zero_rows", "cast_copy", "fill_sparse_out", "as_sparse_like", "RowKey", "sparse_meta",
           "all_rows", "present_rows", "store_pushes", "join_rows", "present_value", "empty_sparse"]


def sparse_parts(v: Any) -> tuple[np.ndarray[Any, Any], Any]:
    """``(sorted unique int64 row ids, their rows)`` of a row-sparse value (rows where they live)."""
    if isinstance(v, RowSparse):
        return v.indices, v.data
    return coo_parts(v)


def value_device(v: Any) -> str:
    """Where a value's data live (``'cpu'`` for a RowSparse)."""
    return "cpu" if isinstance(v, RowSparse) else describe(v).device


def _torch() -> Any:
    return sys.modules["torch"]


def zero_rows(dst: Any) -> None:
    """Set every element of a dense array to zero."""
    if isinstance(dst, np.ndarray):
        dst[...] = 0
    else:
        dst.detach().zero_()


def scatter_rows(dst: Any, ids: np.ndarray[Any, Any], data: Any, add: bool) -> None:
    """``dst[ids] (+)= data`` on ``dst``'s device, cast to its dtype; ``ids`` unique."""
    if isinstance(dst, np.ndarray):
        rows = to_numpy(data) if is_torch(data) else data
        if add:
            dst[ids] += rows
        else:
            dst[ids] = rows
        return
    torch = _torch()
    d = dst.detach()
    index = torch.from_numpy(ids).to(d.device)
    src = torch.from_numpy(np.ascontiguousarray(data)) if isinstance(data, np.ndarray) else data.detach()
    src = src.to(d.device, d.dtype)
    if add:
        d.index_add_(0, index, src)
    else:
        d.index_copy_(0, index, src)


def gather_rows(src: Any, ids: np.ndarray[Any, Any]) -> Any:
    """``src[ids]`` as a new array of ``src``'s kind, on its device."""
    if isinstance(src, np.ndarray):
        return src[ids]
    t = src.detach()
    return t.index_select(0, _torch().from_numpy(ids).to(t.device))


def merge_into(dst: Any, values: Sequence[Any], kernels: CpuKernels) -> np.ndarray[Any, Any] | None:
    """``dst[...] = sum(values)`` for dense and row-sparse values; the rows present, None for all.

    The rows of the row-sparse values are added by index (the union of their rows, a
    row in several values summed); a dense value covers every row.
    """
    dense = [v for v in values if not is_row_sparse(v)]
    parts = [sparse_parts(v) for v in values if is_row_sparse(v)]
    if dense:
        sum_into(dst, dense, kernels)
    else:
        zero_rows(dst)
    for ids, data in parts:
        scatter_rows(dst, ids, data, add=True)
    if dense:
        return None
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return np.unique(np.concatenate([ids for ids, _ in parts]))


def merge_rows(like: Any, values: Sequence[Any]) -> tuple[np.ndarray[Any, Any], Any]:
    """The sum of row-sparse ``values`` as ``(sorted unique ids, their rows)``, without the table.

    The rows are of ``like``'s kind, device and dtype (a new array unless a single value's
    rows already are); a row in several values is summed. Costs the rows pushed.
    """
    parts = [sparse_parts(v) for v in values]
    if len(parts) == 1:
        ids, data = parts[0]
        return ids, _like_rows(like, data)
    ids = np.unique(np.concatenate([i for i, _ in parts])) if parts else np.zeros(0, dtype=np.int64)
    shape = (len(ids),) + tuple(like.shape[1:])
    if isinstance(like, np.ndarray):
        out: Any = np.zeros(shape, dtype=like.dtype)
    else:
        out = like.new_zeros(shape)
    for pids, data in parts:
        scatter_rows(out, np.searchsorted(ids, pids), data, add=True)
    return ids, out


def add_present(present: np.ndarray[Any, Any], ids: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The sorted union of sorted unique ``present`` and ``ids``: ``present`` itself when it holds every id.

    A binary search per id; only ids not yet present cost a copy of ``present``.
    """
    pos = np.searchsorted(present, ids)
    inside = pos < len(present)
    found = np.zeros(len(ids), dtype=bool)
    found[inside] = present[pos[inside]] == ids[inside]
    if found.all():
        return present
    new = ~found
    return np.insert(present, pos[new], ids[new])


def _like_rows(like: Any, data: Any) -> Any:
    """``data`` on ``like``'s backend, device and dtype (itself when it already is)."""
    if isinstance(like, np.ndarray):
        host = to_numpy(data) if is_torch(data) else data
        return host if host.dtype == like.dtype else host.astype(like.dtype)
    src = _torch().from_numpy(np.ascontiguousarray(data)) if isinstance(data, np.ndarray) else data.detach()
    return src.to(like.device, like.dtype)


def replace_rows(dst: Any, present: np.ndarray[Any, Any], values: Sequence[Any]) -> np.ndarray[Any, Any]:
    """A row-sparse table whose rows outside ``present`` are zero becomes the sum of row-sparse
    ``values``, touching only the rows present before and after; returns the new present rows."""
    if isinstance(dst, np.ndarray):
        dst[present] = 0
    else:
        d = dst.detach()
        d.index_fill_(0, _torch().from_numpy(present).to(d.device), 0)
    parts = [sparse_parts(v) for v in values]
    for ids, data in parts:
        scatter_rows(dst, ids, data, add=True)
    return np.unique(np.concatenate([ids for ids, _ in parts])) if parts else np.zeros(0, dtype=np.int64)


def nonzero_rows(table: Any) -> np.ndarray[Any, Any]:
    """The rows of a dense table holding a non-zero value (sorted int64)."""
    n = table.shape[0]
    if isinstance(table, np.ndarray):
        return np.flatnonzero(table.reshape(n, -1).any(axis=1)).astype(np.int64)
    return table.detach().reshape(n, -1).ne(0).any(dim=1).nonzero().reshape(-1).cpu().numpy().astype(np.int64)


def as_sparse_like(table: Any, rows: np.ndarray[Any, Any]) -> Any:
    """The rows ``rows`` of a dense ``table`` as a row-sparse value of its kind: a RowSparse for a
    NumPy table, a coalesced sparse COO tensor (on the table's device) for a tensor."""
    data = gather_rows(table, rows)
    if isinstance(table, np.ndarray):
        return RowSparse(rows, np.array(data), table.shape)
    torch = _torch()
    index = torch.from_numpy(rows.reshape(1, -1).copy()).to(data.device)
    return torch.sparse_coo_tensor(index, data, tuple(table.shape), is_coalesced=True, check_invariants=False)


def cast_copy(dst: Any, src: Any, kernels: CpuKernels | None = None) -> None:
    """``dst[...] = src`` across kinds, devices and floating dtypes (shapes already match)."""
    if isinstance(dst, np.ndarray):
        np.copyto(dst, to_numpy(src), casting="unsafe")
        return
    dst.detach().copy_(_torch().from_numpy(np.ascontiguousarray(src)) if isinstance(src, np.ndarray) else src.detach())


def fill_sparse_out(out: Any, table: Any, rows: np.ndarray[Any, Any]) -> None:
    """Make the row-sparse ``out`` hold exactly the rows ``rows`` of the dense ``table`` (cast to its dtype)."""
    data = gather_rows(table, rows)
    if isinstance(out, RowSparse):
        host = to_numpy(data) if is_torch(data) else data
        out._assign(rows, np.array(host, dtype=out.data.dtype))
        return
    torch = _torch()
    if isinstance(data, np.ndarray):
        data = torch.from_numpy(np.ascontiguousarray(data))
    index = torch.from_numpy(rows.reshape(1, -1).copy())
    src = torch.sparse_coo_tensor(index, data.cpu(), tuple(out.shape), is_coalesced=True, check_invariants=False)
    out.copy_(src)


# -- a store's keys ------------------------------------------------------------------------------
class RowKey(Protocol):
    """A key of a single-process store as seen here: its table, what the table and the value given to
    ``init`` are, and its present rows (sorted; None: a dense key, every row)."""

    value: Any
    meta: ArrayMeta
    origin: ArrayMeta
    rows: np.ndarray[Any, Any] | None


def sparse_meta(value: Any) -> ArrayMeta:
    """What a row-sparse value stands for: a NumPy array for a RowSparse, else the tensor's kind and device."""
    if isinstance(value, RowSparse):
        return ArrayMeta("numpy", value.shape, value.dtype, "cpu")
    return describe(value)


def all_rows(key: RowKey) -> np.ndarray[Any, Any]:
    """Every row id of ``key``'s table."""
    return np.arange(key.meta.shape[0], dtype=np.int64)


def present_rows(key: RowKey) -> np.ndarray[Any, Any]:
    """``key``'s present rows (every row of a dense key)."""
    return all_rows(key) if key.rows is None else key.rows


def store_pushes(stored: Sequence[tuple[Any, RowKey, list[Any]]], kernels: CpuKernels) -> None:
    """Store each key's pushed values without an updater: dense ones summed into the table in one batch
    (a row-sparse key then has every row), row-sparse ones by row — on a row-sparse key they replace
    the rows present before (:func:`replace_rows`), on a dense key they are added (:func:`merge_into`)."""
    plain: list[tuple[Any, RowKey, list[Any]]] = []
    sparse: list[tuple[Any, RowKey, list[Any]]] = []
    for one in stored:  # the common case: every push dense
        (sparse if any_row_sparse(one[2]) else plain).append(one)
    sum_into_many([(key.value, vals) for _, key, vals in plain], kernels)
    for _, key, _ in plain:
        if key.rows is not None:
            key.rows = all_rows(key)
    for _, key, vals in sparse:
        if key.rows is not None and all(map(is_row_sparse, vals)):
            key.rows = replace_rows(key.value, key.rows, vals)  # only rows present before or after
        else:
            rows = merge_into(key.value, vals, kernels)
            if key.rows is not None:
                key.rows = all_rows(key) if rows is None else rows


def join_rows(pairs: Sequence[tuple[Any, RowKey, list[Any]]], pushed: Sequence[np.ndarray[Any, Any] | None]) -> None:
    """After an update: the rows pushed, and any row the update made non-zero, join a row-sparse key's present rows.

    (An update costs the table anyway; afterwards the rows not present are zero again, which
    a push without updater relies on.)
    """
    for (_, key, _), rows in zip(pairs, pushed):
        if key.rows is not None:
            joined = all_rows(key) if rows is None else np.union1d(key.rows, rows)
            if len(joined) < key.meta.shape[0]:
                joined = np.union1d(joined, nonzero_rows(key.value))
            key.rows = joined


def present_value(key: RowKey) -> Any:
    """A row-sparse key's present rows as a new row-sparse value of the kind (and device) it was made with."""
    assert key.rows is not None
    if key.origin.backend == "numpy":
        table = key.value
        host = table if isinstance(table, np.ndarray) else np.array(table.detach().cpu().numpy())
        return as_sparse_like(host, key.rows)
    return as_sparse_like(key.value, key.rows).to(key.origin.device)


def empty_sparse(meta: ArrayMeta) -> Any:
    """A row-sparse value without rows of the kind (and device) ``meta`` describes."""
    if meta.backend == "numpy":
        return RowSparse.zeros(meta.shape, meta.dtype)
    torch = _torch()
    index = torch.zeros((1, 0), dtype=torch.int64)
    data = torch.zeros((0,) + meta.shape[1:], dtype=torch_dtype(meta.dtype))
    return torch.sparse_coo_tensor(index, data, meta.shape, is_coalesced=True, check_invariants=False).to(meta.device)
