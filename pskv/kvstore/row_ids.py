"""Row-id handling for ``row_sparse_pull``: normalise, de-duplicate, sort and bounds-check; plan and copy the rows."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pskv.arrays import (
    ArrayMeta,
    CpuKernels,
    copy_into,
    describe,
    empty,
    is_array,
    is_float,
    is_torch,
    signature,
    take_rows,
    to_numpy,
)
from pskv.arrays.rowsparse import is_row_sparse
from pskv.errors import DTypeMismatchError, InvalidArgumentError, InvalidTypeError, ShapeMismatchError
from pskv.kvstore.checks import check_like
from pskv.kvstore.keys import SERVERS_DENSE, Key, pair_up
from pskv.kvstore.local_rows import cast_copy, fill_sparse_out, gather_rows, scatter_rows, zero_rows

__all__ = ["unique_rows", "row_id_sets", "RowPlan", "plan_row_pulls", "apply_row_plan"]


def unique_rows(key: Any, row_ids: Any, num_rows: int) -> np.ndarray[Any, Any]:
    """Sorted unique int64 row ids from an array or a sequence of integers.

    Float arrays are accepted when every value is integral (MXNet's tests pass them).

    Raises:
        InvalidTypeError: ``row_ids`` is not an array or a sequence of numbers.
        InvalidArgumentError: a value is not integral or lies outside ``[0, num_rows)``.
    """
    if is_array(row_ids):
        ids = np.asarray(to_numpy(row_ids)).reshape(-1)
    elif isinstance(row_ids, (list, tuple, range)):
        ids = np.asarray(list(row_ids)).reshape(-1)
    else:
        raise InvalidTypeError(
            f"row_ids for key {key!r} must be an array or a sequence of ints, got {type(row_ids).__qualname__}"
        )
    if ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    if ids.dtype.kind == "f":
        if not np.all(np.isfinite(ids)) or not np.all(ids == np.floor(ids)):
            raise InvalidArgumentError(f"row_ids for key {key!r} must be whole numbers, got {ids[:8].tolist()}")
    elif ids.dtype.kind not in "iu":
        raise InvalidTypeError(f"row_ids for key {key!r} must be integers, got dtype {ids.dtype}")
    if ids.min() < 0 or ids.max() >= num_rows:  # in their own dtype: a cast to int64 first would wrap
        bad = np.unique(ids[(ids < 0) | (ids >= num_rows)])
        raise InvalidArgumentError(
            f"row_ids {bad[:8].tolist()} out of range for key {key!r} with {num_rows} rows (valid: 0..{num_rows - 1})"
        )
    return np.unique(ids.astype(np.int64))


def row_id_sets(key: Any, row_ids: Any, n_outs: int) -> list[Any]:
    """One row-id set per out: a single set is shared by all outs.

    Raises:
        InvalidArgumentError: ``row_ids`` is missing, or the number of sets differs from
            the number of outs.
    """
    if row_ids is None:
        raise InvalidArgumentError(f"row_sparse_pull of key {key!r} needs row_ids")
    if isinstance(row_ids, (list, tuple)) and row_ids and (is_array(row_ids[0]) or isinstance(row_ids[0], (list, tuple, range))):
        if len(row_ids) == 1:
            return list(row_ids) * n_outs
        if len(row_ids) != n_outs:
            raise InvalidArgumentError(
                f"row_sparse_pull of key {key!r}: {len(row_ids)} row_ids sets for {n_outs} outs (give one set, or one per out)"
            )
        return list(row_ids)
    return [row_ids] * n_outs


@dataclass(frozen=True)
class RowPlan:
    """What one ``row_sparse_pull`` call does: per out, the key index, rows and layout."""

    outs: list[tuple[Key, list[Any]]]  # per key: its outs (new arrays when the caller gave none)
    steps: list[tuple[int, Any, np.ndarray[Any, Any], str]]  # (key index, out, rows, "full"/"compact"/"sparse")
    returns_new: bool


def plan_row_pulls(keys: Sequence[Key], single: bool, metas: Sequence[ArrayMeta], origins: Sequence[ArrayMeta],
                   out: Any, row_ids: Any, *, sparse: bool = False) -> RowPlan:
    """Validate a ``row_sparse_pull`` call and plan it (no data is touched).

    Args:
        keys, single: the normalised keys.
        metas: per key, the stored value's description (shape, dtype).
        origins: per key, what ``pull(out=None)`` returns (kind, device).
        out, row_ids: the caller's arguments.
        sparse: the single-process stores: row-sparse outs (filled with exactly the
            requested rows) and outs of another floating dtype (cast) are accepted.

    Raises:
        InvalidArgumentError, ShapeMismatchError, DTypeMismatchError: see the stores.
        NotSupportedError: a row-sparse out where ``sparse`` is False.
    """
    if single:
        per_key_ids = [row_ids]
    else:
        if not isinstance(row_ids, (list, tuple)) or len(row_ids) != len(keys):
            raise InvalidArgumentError(f"row_sparse_pull of {len(keys)} keys needs a list of {len(keys)} row_ids")
        per_key_ids = list(row_ids)
    returns_new = out is None
    outs = ([(k, [empty(o)]) for k, o in zip(keys, origins)] if returns_new
            else pair_up(keys, single, out, "out", None if sparse else SERVERS_DENSE))
    steps = []
    for index, ((k, k_outs), meta, ids) in enumerate(zip(outs, metas, per_key_ids)):
        shape = meta.shape
        if len(shape) < 2:
            raise InvalidArgumentError(f"row_sparse_pull needs a stored array with >= 2 dimensions; key {k!r} has shape {shape}")
        for o, rid in zip(k_outs, row_id_sets(k, ids, len(k_outs))):
            rows = unique_rows(k, rid, shape[0])
            if is_row_sparse(o):
                check_like(k, meta, [o], "row_sparse_pull", casts=True)
                steps.append((index, o, rows, "sparse"))
                continue
            m = describe(o)
            if m.dtype != meta.dtype and not (sparse and is_float(m.dtype) and is_float(meta.dtype)):
                raise DTypeMismatchError(k, "row_sparse_pull", meta.dtype, m.dtype)
            compact = (len(rows),) + shape[1:]
            if m.shape != shape and m.shape != compact:
                raise ShapeMismatchError(k, "row_sparse_pull", shape, m.shape)
            steps.append((index, o, rows, "full" if m.shape == shape else "compact"))
    return RowPlan(outs, steps, returns_new)


def apply_row_plan(plan: RowPlan, values: Sequence[Any], single: bool, kernels: CpuKernels) -> Any:
    """Copy the planned rows of ``values`` (one per key) into the outs; returns new arrays if planned."""
    for index, o, rows, mode in plan.steps:
        src = values[index]
        if mode == "sparse":
            fill_sparse_out(o, src, rows)
        elif signature(o)[1] != signature(src)[1]:  # another floating dtype: cast
            if mode == "full":
                zero_rows(o)
                scatter_rows(o, rows, gather_rows(src, rows), add=False)
            else:
                cast_copy(o, gather_rows(src, rows))
        elif mode == "full":
            take_rows(src, rows, o)
        elif is_torch(src):
            torch = sys.modules["torch"]
            copy_into(o, src.detach().index_select(0, torch.from_numpy(rows).to(src.device)), kernels)
        else:
            copy_into(o, src[rows], kernels)
    if plan.returns_new:
        arrays = [k_outs[0] for _, k_outs in plan.outs]
        return arrays[0] if single else arrays
    return None
