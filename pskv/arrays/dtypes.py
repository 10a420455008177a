"""The dtype table: canonical dtype names shared by NumPy, PyTorch and (later) the wire.

pskv names dtypes by strings (``"float32"``, ``"bfloat16"``, ...). NumPy has no
bfloat16, so bfloat16 values must be PyTorch tensors; where NumPy holds them (a server's
part on the wire, an optimizer-state file, the ``bf16`` compressor), they are ``uint16``
bit patterns, converted by :func:`f32_to_bf16_bits` / :func:`bf16_bits_to_f32`.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from pskv.errors import UnsupportedValueError

__all__ = ["SUPPORTED_DTYPES", "FLOAT_DTYPES", "bf16_bits_to_f32", "f32_to_bf16_bits", "itemsize", "numpy_dtype",
           "torch_dtype", "is_float"]

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


# The bfloat16 conversion, NumPy's one copy. Two other kernels compute the same rounding on
# purpose, not as copies: the Numba one (compression/kernels.py, ``bf16_compress``) fuses it
# with error feedback in one pass over the values, and the torch one (compression/
# ontorch_ops.py) runs on the tensor's device, in int32 since torch has no uint32 shifts.


def bf16_bits_to_f32(bits: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """bfloat16 bit patterns (``uint16``) to float32 values (exact: bfloat16 is float32's top half)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """float32 values to bfloat16 bit patterns (``uint16``), rounding to nearest even.

    A float32 that holds a bfloat16 value (its low 16 bits zero) converts exactly. NaN
    is not kept canonical and values past the largest bfloat16 round to infinity: a
    caller that must saturate clips first (the ``bf16`` compressor does).
    """
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)
