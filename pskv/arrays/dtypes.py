"""The dtype table: canonical dtype names shared by NumPy, PyTorch and (later) the wire.

pskv names dtypes by strings (``"float32"``, ``"bfloat16"``, ...). NumPy has no
bfloat16, so bfloat16 values must be PyTorch tensors.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from pskv.errors import UnsupportedValueError

__all__ = ["SUPPORTED_DTYPES", "FLOAT_DTYPES", "itemsize", "numpy_dtype", "torch_dtype", "is_float"]

SUPPORTED_DTYPES: Final[tuple[str, ...]] = (
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "int32",
    "int64",
)
FLOAT_DTYPES: Final[frozenset[str]] = frozenset({"float16", "bfloat16", "float32", "float64"})

_ITEMSIZE: Final[dict[str, int]] = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "int32": 4,
    "int64": 8,
}

# numpy dtype object -> canonical name (dict lookup on the hot path)
NUMPY_NAMES: Final[dict[np.dtype[Any], str]] = {
    np.dtype(np.float16): "float16",
    np.dtype(np.float32): "float32",
    np.dtype(np.float64): "float64",
    np.dtype(np.int32): "int32",
    np.dtype(np.int64): "int64",
}
_NUMPY_BY_NAME: Final[dict[str, np.dtype[Any]]] = {v: k for k, v in NUMPY_NAMES.items()}


def itemsize(name: str) -> int:
    """Bytes per element of the dtype ``name``."""
    return _ITEMSIZE[name]


def is_float(name: str) -> bool:
    """True for the floating-point dtypes."""
    return name in FLOAT_DTYPES


def numpy_dtype(name: str) -> np.dtype[Any]:
    """The NumPy dtype for ``name``.

    Raises:
        UnsupportedValueError: for bfloat16 (NumPy has none) or an unknown name.
    """
    try:
        return _NUMPY_BY_NAME[name]
    except KeyError:
        if name == "bfloat16":
            raise UnsupportedValueError("bfloat16 values need PyTorch tensors (NumPy has no bfloat16)") from None
        raise UnsupportedValueError(f"unsupported dtype {name!r}; supported: {', '.join(SUPPORTED_DTYPES)}") from None


def torch_dtype(name: str) -> Any:
    """The ``torch.dtype`` for ``name`` (imports torch).

    Raises:
        UnsupportedValueError: for an unknown name.
    """
    import torch

    table = {
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
        "float32": torch.float32,
        "float64": torch.float64,
        "int32": torch.int32,
        "int64": torch.int64,
    }
    try:
        return table[name]
    except KeyError:
        raise UnsupportedValueError(f"unsupported dtype {name!r}; supported: {', '.join(SUPPORTED_DTYPES)}") from None
