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
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from pskv.arrays import ArrayMeta, describe, is_torch, to_numpy
from pskv.arrays.rowsparse import RowSparse, is_row_sparse
from pskv.arrays.tables import TableInit
from pskv.errors import NotSupportedError
from pskv.kvstore.sparse import (
    cast_copy,
    fill_sparse_out,
    scatter_rows,
    sparse_parts,
    zero_rows,
)

__all__ = ["key_meta", "summed_rows", "fill", "fill_all", "new_sparse_out", "densified"]


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

    ``mode`` as :class:`pskv.kvstore.rows.RowPlan`'s steps: ``"sparse"``, ``"full"``, ``"compact"``.
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
    """``values`` with row-sparse ones made dense (a push of them to a dense key: summed like dense ones)."""
    out = []
    for v in values:
        if isinstance(v, RowSparse):
            out.append(v.todense())
        elif is_row_sparse(v):
            out.append(v.to_dense())
        else:
            out.append(v)
    return out
