"""Argument checks shared by every store: arrays against a key's value, priorities."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pskv.arrays import ArrayMeta, is_float, signature
from pskv.arrays.dtypes import NUMPY_NAMES
from pskv.arrays.rowsparse import RowSparse
from pskv.errors import DTypeMismatchError, InvalidTypeError, ShapeMismatchError

__all__ = ["check_like", "check_priority"]


def check_like(key: Any, meta: ArrayMeta, arrays: Sequence[Any], op: str, casts: bool = False) -> None:
    """Every array of ``arrays`` has the shape and dtype of ``meta`` (the key's value).

    Arrays may be row-sparse (a RowSparse or a torch sparse COO tensor): their dense
    shape counts. ``casts`` (outs of the single-process stores): an out of another
    floating dtype than a floating key's is accepted (the copy casts, as MXNet's and
    ``torch.Tensor.copy_``); integer against floating stays a mismatch.

    Raises:
        ShapeMismatchError, DTypeMismatchError: naming the key, the operation and both sides.
        UnsupportedValueError: an array is not a supported NumPy array or tensor.
    """
    for a in arrays:
        if type(a) is np.ndarray:  # the common case: no call (an unsupported dtype goes to signature's error)
            shape, dtype = a.shape, NUMPY_NAMES.get(a.dtype)
            if dtype is None:
                shape, dtype = signature(a)
        else:
            shape, dtype = (a.shape, a.dtype) if isinstance(a, RowSparse) else signature(a)
        if shape != meta.shape:
            raise ShapeMismatchError(key, op, meta.shape, shape)
        if dtype != meta.dtype and not (casts and is_float(dtype) and is_float(meta.dtype)):
            raise DTypeMismatchError(key, op, meta.dtype, dtype)


def check_priority(priority: object) -> int:
    """``priority`` as an int.

    Raises:
        InvalidTypeError: it is not an int (bool is refused).
    """
    if type(priority) is int:  # every call asks
        return priority
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise InvalidTypeError(f"priority must be an int, got {type(priority).__qualname__}")
    return priority
