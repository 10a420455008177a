"""The few array operations the update rules need, for NumPy arrays and torch tensors.

Update rules are written with Python operators (``*``, ``+=``, ...), which NumPy and
torch share; the functions here cover what the two spell differently. Every result
stays on the input's backend, device and dtype. torch is never imported here: a value
can only be a tensor if the caller already imported torch, so it is looked up in
``sys.modules``.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from pskv.arrays import Array, ArrayMeta, numpy_dtype, to_numpy, torch_dtype

__all__ = [
    "detach",
    "sqrt",
    "clip",
    "sign",
    "where",
    "zeros_like",
    "cast",
    "assign",
    "to_backend",
    "copy_cast",
    "torch_ops",
    "mul_into",
    "sqrt_into",
    "clamp_",
]


def _torch() -> Any:
    return sys.modules["torch"]


def detach(x: Array) -> Array:
    """``x`` itself for NumPy, ``x.detach()`` (same storage) for a tensor."""
    return x if isinstance(x, np.ndarray) else x.detach()


def sqrt(x: Array) -> Array:
    """Element-wise square root (new array)."""
    return np.sqrt(x) if isinstance(x, np.ndarray) else x.sqrt()


def clip(x: Array, lo: float, hi: float) -> Array:
    """Element-wise clip of ``x`` to ``[lo, hi]`` (new array)."""
    return np.clip(x, lo, hi) if isinstance(x, np.ndarray) else x.clamp(lo, hi)


def sign(x: Array) -> Array:
    """Element-wise sign: -1, 0 or 1 (new array)."""
    return np.sign(x) if isinstance(x, np.ndarray) else x.sign()


def where(cond: Array, a: Array, b: float) -> Array:
    """``a`` where ``cond`` holds, else the scalar ``b`` (new array, ``a``'s dtype)."""
    if isinstance(a, np.ndarray):
        return np.where(cond, a, np.asarray(b, dtype=a.dtype))
    return _torch().where(cond, a, b)


def zeros_like(x: Array) -> Array:
    """Zeros with the shape, dtype, backend and device of ``x``."""
    return np.zeros_like(x) if isinstance(x, np.ndarray) else x.new_zeros(x.shape)


def cast(x: Array, dtype: str) -> Array:
    """``x`` converted to the dtype named ``dtype`` (always a new array)."""
    if isinstance(x, np.ndarray):
        return x.astype(numpy_dtype(dtype), copy=True)
    return x.to(dtype=torch_dtype(dtype), copy=True)


def assign(dst: Array, src: Array) -> None:
    """``dst[...] = src`` for arrays of the same backend and device (casts dtype)."""
    if isinstance(dst, np.ndarray):
        np.copyto(dst, src, casting="unsafe")
    else:
        dst.copy_(src)


def to_backend(x: Array, meta: ArrayMeta) -> Array:
    """``x`` (same dtype) on the backend and device of ``meta``; ``x`` itself if already there.

    Used to bring a gradient next to its weight; never copies when not needed.
    """
    if meta.backend == "numpy":
        return x if isinstance(x, np.ndarray) else to_numpy(x)
    torch = _torch()
    t = torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x.detach()
    return t if str(t.device) == meta.device else t.to(meta.device)


def copy_cast(dst: Array, src: Array) -> None:
    """``dst[...] = src`` across backends, devices and dtypes (shapes must match).

    ``src`` may be a NumPy array (a loaded state) or a tensor on any device.
    bfloat16 values pass through float32, which holds them exactly.
    """
    if not isinstance(src, np.ndarray):
        if not isinstance(dst, np.ndarray) and src.device == dst.device:
            dst.copy_(src.detach())
            return
        src = to_numpy(src)
    if isinstance(dst, np.ndarray):
        np.copyto(dst, src, casting="unsafe")
    else:
        dst.copy_(_torch().from_numpy(np.ascontiguousarray(src)))


# ---------------------------------------------------------------------------------------
# In-place helpers for lists of torch tensors (one device and dtype per list). Lists of
# one tensor use the plain tensor ops (one kernel, no list overhead); longer lists use
# ``torch._foreach_*``, which loop in C++ (and launch few kernels on CUDA).


def torch_ops() -> Any:
    """The ``torch`` module (for ``torch._foreach_*``); only call it with tensors at hand."""
    return _torch()


def mul_into(dst: list[Array], src: list[Array], scalar: float) -> None:
    """``dst[i][...] = src[i] * scalar`` (``dst`` may be ``src``)."""
    torch = _torch()
    if dst is src or (len(dst) == 1 and dst[0] is src[0]):
        if scalar != 1.0:
            torch._foreach_mul_(dst, scalar)
    elif len(dst) == 1:
        torch.mul(src[0], scalar, out=dst[0])
    else:
        torch._foreach_copy_(dst, src)
        if scalar != 1.0:
            torch._foreach_mul_(dst, scalar)


def sqrt_into(dst: list[Array], src: list[Array]) -> None:
    """``dst[i][...] = sqrt(src[i])``."""
    torch = _torch()
    if len(dst) == 1:
        torch.sqrt(src[0], out=dst[0])
    else:
        torch._foreach_copy_(dst, src)
        torch._foreach_sqrt_(dst)


def clamp_(xs: list[Array], lo: float, hi: float) -> None:
    """``xs[i].clamp_(lo, hi)`` (NaN stays NaN, as ``clamp``)."""
    if len(xs) == 1:
        xs[0].clamp_(lo, hi)
    else:
        torch = _torch()
        torch._foreach_clamp_min_(xs, lo)
        torch._foreach_clamp_max_(xs, hi)
