"""Row-id handling for ``row_sparse_pull``: normalise, de-duplicate, sort and bounds-check."""

from __future__ import annotations

from typing import Any

import numpy as np

from pskv.arrays import is_array, to_numpy
from pskv.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["unique_rows", "row_id_sets"]


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
    rows = np.unique(ids.astype(np.int64))
    if rows[0] < 0 or rows[-1] >= num_rows:
        bad = rows[(rows < 0) | (rows >= num_rows)]
        raise InvalidArgumentError(
            f"row_ids {bad[:8].tolist()} out of range for key {key!r} with {num_rows} rows (valid: 0..{num_rows - 1})"
        )
    return rows


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
