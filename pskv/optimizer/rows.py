"""Row-sparse optimizer updates: the rows a gradient holds, checked and applied (lazily or densely).

A row-sparse gradient (sorted unique row ids and their rows) reaches an optimizer
through :meth:`Optimizer.update_rows <pskv.optimizer.Optimizer.update_rows>` or the
:class:`~pskv.optimizer.Updater`. :func:`check_rows` validates it against the weight
with bounded work (one pass over the ids, none over the weight); :func:`update_rows`
applies it: with the optimizer's ``lazy_update`` (MXNet's lazy update) the dense rule
runs on the picked rows only, else on a dense gradient whose missing rows are zero.
The rules themselves stay in :mod:`pskv.optimizer.base`: this module only gathers and
scatters rows, on the weight's own backend and device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from pskv.arrays import Array, ArrayMeta, describe, is_torch, to_numpy
from pskv.errors import (
    DTypeMismatchError,
    InvalidArgumentError,
    InvalidTypeError,
    ShapeMismatchError,
    UnsupportedValueError,
)
from pskv.optimizer import _math
from pskv.partition import Key

if TYPE_CHECKING:  # the optimizer calls in here, never the other way at import
    from pskv.optimizer.base import Optimizer, State

__all__ = ["check_rows", "update_rows"]


def _take_rows(a: Array, ids: np.ndarray[Any, Any]) -> Array:
    """``a[ids]`` (a new array on ``a``'s backend and device)."""
    if isinstance(a, np.ndarray):
        return a[ids]
    return a.index_select(0, _math.torch_ops().from_numpy(ids).to(a.device))


def _put_rows(a: Array, ids: np.ndarray[Any, Any], rows: Array) -> None:
    """``a[ids] = rows`` in place (``rows`` on ``a``'s backend, device and dtype)."""
    if isinstance(a, np.ndarray):
        a[ids] = rows
    else:
        a.index_copy_(0, _math.torch_ops().from_numpy(ids).to(a.device), rows)


def check_rows(key: Key, meta: ArrayMeta, indices: Any, grad_rows: Array) -> tuple[np.ndarray[Any, Any], Array]:
    """Validate a row-sparse gradient for a weight described by ``meta``; ``(int64 ids, rows next to the weight)``.

    ``indices`` must be integers (a 1-D NumPy array or tensor), sorted, unique and in
    ``[0, rows)``; ``grad_rows`` must have shape ``(len(indices),) + meta.shape[1:]`` and
    the weight's dtype. Bounded work: one pass over the ids, none over the weight.

    Raises:
        InvalidTypeError: ``indices`` are not an integer array.
        InvalidArgumentError: not 1-D, not sorted and unique, out of range, or a weight without rows.
        UnsupportedValueError: ``grad_rows`` is not a supported array.
        ShapeMismatchError, DTypeMismatchError: ``grad_rows`` does not fit the weight.
    """
    what = f"row-sparse update of key {key!r}"
    if not meta.shape:
        raise InvalidArgumentError(f"{what}: the weight is a scalar; it has no rows")
    ids = to_numpy(indices) if is_torch(indices) else indices
    if not isinstance(ids, np.ndarray) or ids.dtype.kind not in "iu":
        kind = f"dtype {ids.dtype}" if isinstance(ids, np.ndarray) else type(indices).__qualname__
        raise InvalidTypeError(f"{what}: row ids must be an integer array, got {kind}")
    if ids.ndim != 1:
        raise InvalidArgumentError(f"{what}: row ids must be 1-D, got shape {ids.shape}")
    ids = ids.astype(np.int64, copy=False)
    rows = meta.shape[0]
    if ids.size:
        if ids.size > 1:
            bad = np.flatnonzero(ids[1:] <= ids[:-1])
            if bad.size:
                i = int(bad[0])
                raise InvalidArgumentError(f"{what}: row ids must be sorted and unique; ids[{i}] = {int(ids[i])} "
                                           f"is followed by {int(ids[i + 1])}")
        if ids[0] < 0 or ids[-1] >= rows:
            out = ids[(ids < 0) | (ids >= rows)]
            raise InvalidArgumentError(f"{what}: row ids {out[:8].tolist()} out of range for {rows} rows "
                                       f"(valid: 0..{rows - 1})")
    try:
        gmeta = describe(grad_rows)
    except UnsupportedValueError as exc:
        raise UnsupportedValueError(f"{what}: gradient rows: {exc}") from None
    want = (len(ids),) + tuple(meta.shape[1:])
    if tuple(gmeta.shape) != want:
        raise ShapeMismatchError(key, f"row-sparse update ({len(ids)} rows)", want, tuple(gmeta.shape))
    if gmeta.dtype != meta.dtype:
        raise DTypeMismatchError(key, "row-sparse update", meta.dtype, gmeta.dtype)
    return ids, _math.to_backend(grad_rows, meta)


def update_rows(optimizer: Optimizer, key: Key, meta: ArrayMeta, weight: Array, indices: Any, grad_rows: Array,
                state: State) -> None:
    """Apply one update from a row-sparse gradient: the rows ``indices`` hold ``grad_rows``, others zero.

    With ``optimizer.lazy_update`` (MXNet's lazy update) only the rows ``indices`` of
    ``weight`` and of every state array shaped like it change: the rule runs on those rows
    as the dense rule would on a weight made of them, with the key's one update count
    (Adam's bias correction uses it, as MXNet's lazy Adam does). Every other row, and its
    state, stays bit for bit. Without ``lazy_update`` this is the dense update of the
    gradient with the missing rows zero. Either way the key's update count grows by one,
    even for no rows.

    Rows travel through the weight's own backend: NumPy fancy indexing, or
    ``index_select`` / ``index_copy_`` on the tensor's device.

    Args:
        optimizer: the optimizer whose rule runs (its :meth:`~pskv.optimizer.Optimizer.update`).
        key: the store key, checked.
        meta: the weight's description (a floating-point weight).
        weight: the full weight, rows first (e.g. shape ``(R, D)``), updated in place.
        indices: sorted, unique int row ids ``< R`` (a 1-D NumPy array or int tensor).
        grad_rows: the gradient rows, shape ``(len(indices),) + weight.shape[1:]``,
            the weight's dtype (any backend or device: moved next to the weight).
        state: what ``create_state`` returned for this key and weight (already checked
            to hold as many arrays as the rule keeps).

    Raises:
        InvalidTypeError: ``indices`` are not integers.
        InvalidArgumentError: ``indices`` not sorted and unique, or out of range.
        ShapeMismatchError, DTypeMismatchError: ``grad_rows`` does not fit.
    """
    ids, grad_rows = check_rows(key, meta, indices, grad_rows)
    arrays = () if state is None else tuple(state)
    w = _math.detach(weight)
    if not optimizer.lazy_update:
        dense = _math.zeros_like(w)
        _put_rows(dense, ids, grad_rows)
        optimizer.update(key, weight, dense, state)
        return
    shape = tuple(w.shape)
    picked = [tuple(a.shape) == shape for a in arrays]
    w_rows = _take_rows(w, ids)
    st_rows = tuple(_take_rows(_math.detach(a), ids) if p else a for a, p in zip(arrays, picked, strict=True))
    optimizer.update(key, w_rows, grad_rows, st_rows if arrays else state)
    _put_rows(w, ids, w_rows)
    for a, r, p in zip(arrays, st_rows, picked, strict=True):
        if p:
            _put_rows(_math.detach(a), ids, r)
