"""Argument checks shared by every store: arrays against a key's value, priorities."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pskv.arrays import ArrayMeta, signature
from pskv.errors import DTypeMismatchError, InvalidTypeError, ShapeMismatchError

__all__ = ["check_like", "check_priority"]


def check_like(key: Any, meta: ArrayMeta, arrays: Sequence[Any], op: str) -> None:
    """Every array of ``arrays`` has the shape and dtype of ``meta`` (the key's value).

    Raises:
        ShapeMismatchError, DTypeMismatchError: naming the key, the operation and both sides.
        UnsupportedValueError: an array is not a supported NumPy array or tensor.
    """
    for a in arrays:
        shape, dtype = signature(a)
        if shape != meta.shape:
            raise ShapeMismatchError(key, op, meta.shape, shape)
        if dtype != meta.dtype:
            raise DTypeMismatchError(key, op, meta.dtype, dtype)


def check_priority(priority: object) -> int:
    """``priority`` as an int.

    Raises:
        InvalidTypeError: it is not an int (bool is refused).
    """
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise InvalidTypeError(f"priority must be an int, got {type(priority).__qualname__}")
    return priority
