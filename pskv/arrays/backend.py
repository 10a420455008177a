"""NumPy / PyTorch adapter: describe, allocate, copy and sum arrays of either kind.

This is the only core module that touches ``torch``. It never imports torch itself:
a value can only be a tensor if the caller already imported torch, so the module is
looked up in ``sys.modules``. NumPy-only users never pay torch's import time.

CPU tensors (except bfloat16) share memory with NumPy views, so CPU arithmetic runs
through :class:`~pskv.arrays.kernels.CpuKernels` whatever the caller's array kind.
bfloat16 and CUDA tensors use torch operations.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pskv.arrays.dtypes import NUMPY_NAMES, SUPPORTED_DTYPES, numpy_dtype, torch_dtype
from pskv.arrays.kernels import CpuKernels
from pskv.errors import UnsupportedValueError

__all__ = [
    "Array",
    "ArrayMeta",
    "describe",
    "signature",
    "is_array",
    "is_torch",
    "empty",
    "clone",
    "copy_into",
    "sum_into",
    "fan_out_many",
    "sum_into_many",
    "take_rows",
    "wire_view",
    "from_wire",
    "to_numpy",
]

Array = Any  # numpy.ndarray or torch.Tensor; kept as Any so torch stays optional for typing
CPU = "cpu"


@dataclass(frozen=True, slots=True)
class ArrayMeta:
    """What pskv needs to know about an array: kind, shape, dtype name and device."""

    backend: str  # "numpy" or "torch"
    shape: tuple[int, ...]
    dtype: str
    device: str  # "cpu", "cuda:0", ...

    @property
    def size(self) -> int:
        """Number of elements."""
        n = 1
        for d in self.shape:
            n *= d
        return n


def _torch_module() -> Any:
    return sys.modules.get("torch")


def is_torch(x: object) -> bool:
    """True if ``x`` is a ``torch.Tensor`` (False when torch was never imported)."""
    torch = _torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def is_array(x: object) -> bool:
    """True if ``x`` is a NumPy array or a PyTorch tensor."""
    return isinstance(x, np.ndarray) or is_torch(x)


_TORCH_NAMES: dict[Any, str] = {}


def _torch_name(dt: Any) -> str | None:
    if not _TORCH_NAMES:
        torch = _torch_module()
        for name in SUPPORTED_DTYPES:
            _TORCH_NAMES[torch_dtype(name)] = name
        del torch
    return _TORCH_NAMES.get(dt)


def describe(x: object) -> ArrayMeta:
    """Describe ``x``.

    Raises:
        UnsupportedValueError: ``x`` is not an array, or its dtype is not supported.
    """
    if isinstance(x, np.ndarray):
        name = NUMPY_NAMES.get(x.dtype)
        if name is None:
            raise UnsupportedValueError(
                f"unsupported NumPy dtype {x.dtype}; supported: {', '.join(SUPPORTED_DTYPES)}"
            )
        return ArrayMeta("numpy", x.shape, name, CPU)
    if is_torch(x):
        name = _torch_name(x.dtype)  # type: ignore[attr-defined]
        if name is None:
            raise UnsupportedValueError(
                f"unsupported torch dtype {x.dtype}; supported: {', '.join(SUPPORTED_DTYPES)}"  # type: ignore[attr-defined]
            )
        dev = x.device  # type: ignore[attr-defined]
        device = CPU if dev.type == "cpu" else str(dev)
        return ArrayMeta("torch", tuple(x.shape), name, device)  # type: ignore[attr-defined]
    raise UnsupportedValueError(
        f"values must be numpy.ndarray or torch.Tensor, got {type(x).__module__}.{type(x).__qualname__}"
    )


def signature(x: object) -> tuple[tuple[int, ...], str]:
    """``(shape, dtype name)`` of ``x`` — the cheap part of :func:`describe`, for hot paths.

    Raises:
        UnsupportedValueError: as :func:`describe`.
    """
    if isinstance(x, np.ndarray):
        name = NUMPY_NAMES.get(x.dtype)
        if name is not None:
            return x.shape, name
    elif is_torch(x):
        name = _torch_name(x.dtype)  # type: ignore[attr-defined]
        if name is not None:
            return tuple(x.shape), name  # type: ignore[attr-defined]
    m = describe(x)  # raises the precise error
    return m.shape, m.dtype


def _numpy_view(x: Array) -> np.ndarray[Any, Any] | None:
    """A NumPy view sharing memory with ``x``, or None (CUDA or bfloat16 tensors)."""
    if isinstance(x, np.ndarray):
        return x
    if x.device.type == "cpu" and x.dtype is not _torch_module().bfloat16:
        return x.detach().numpy()  # type: ignore[no-any-return]
    return None


def empty(meta: ArrayMeta, device: str | None = None, backend: str | None = None, pin: bool = False) -> Array:
    """A new uninitialised array shaped like ``meta`` (optionally on another device / kind)."""
    device = meta.device if device is None else device
    backend = meta.backend if backend is None else backend
    if backend == "numpy" and device == CPU:
        return np.empty(meta.shape, dtype=numpy_dtype(meta.dtype))
    torch = _torch_module()
    pin = pin and device == CPU and torch.cuda.is_available()
    return torch.empty(meta.shape, dtype=torch_dtype(meta.dtype), device=device, pin_memory=pin)


def clone(x: Array, meta: ArrayMeta | None = None, device: str | None = None) -> Array:
    """An independent copy of ``x`` of the same kind (on ``device`` if given)."""
    meta = describe(x) if meta is None else meta
    out = empty(meta, device=device)
    copy_into(out, x)
    return out


def to_numpy(x: Array) -> np.ndarray[Any, Any]:
    """A NumPy array with the values of ``x`` (a view when possible, else a copy).

    bfloat16 tensors come back as float32.
    """
    view = _numpy_view(x)
    if view is not None:
        return view
    torch = _torch_module()
    t = x.detach()
    if t.dtype is torch.bfloat16:
        t = t.float()
    return t.cpu().numpy()  # type: ignore[no-any-return]


def _as_torch(x: Array, device: str) -> Any:
    """``x`` as a tensor on ``device`` (zero-copy for CPU NumPy arrays)."""
    torch = _torch_module()
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    t = x.detach()
    if str(t.device) != device and not (device == CPU and t.device.type == "cpu"):
        t = t.to(device, non_blocking=True)
    return t


def copy_into(dst: Array, src: Array, kernels: CpuKernels | None = None) -> None:
    """``dst[...] = src`` across kinds and devices. Shapes and dtypes must already match."""
    dv = _numpy_view(dst)
    if dv is not None:
        sv = _numpy_view(src)
        if sv is None:  # CUDA or bfloat16 source into a NumPy-viewable destination
            sv = src.detach().cpu().numpy()
        if kernels is None:
            np.copyto(dv, sv)
        else:
            kernels.copy(dv, sv)
        return
    torch_dst = dst.detach()
    torch_dst.copy_(_as_torch(src, CPU) if isinstance(src, np.ndarray) else src.detach())


def _numpy_sources(srcs: Sequence[Array]) -> list[np.ndarray[Any, Any]]:
    """NumPy views of the sources; CUDA tensors are copied to the CPU (same dtype as dst)."""
    views = []
    for s in srcs:
        v = _numpy_view(s)
        views.append(v if v is not None else s.detach().cpu().numpy())
    return views


def fan_out_many(pairs: Sequence[tuple[Sequence[Array], Array]], kernels: CpuKernels) -> None:
    """For every ``(dsts, src)``: copy ``src`` into each array of ``dsts``, as one batch.

    Shapes and dtypes must already match.
    """
    jobs = []
    for dsts, src in pairs:
        sv = _numpy_view(src)
        for d in dsts:
            dv = _numpy_view(d)
            if dv is not None and sv is not None:
                jobs.append((dv, [sv]))
            else:
                copy_into(d, src)
    kernels.run(jobs)


def sum_into_many(pairs: Sequence[tuple[Array, Sequence[Array]]], kernels: CpuKernels) -> None:
    """For every ``(dst, srcs)``: ``dst[...] = sum(srcs)``, as one batch (see :func:`sum_into`)."""
    jobs = []
    for dst, srcs in pairs:
        dv = _numpy_view(dst)
        if dv is not None:
            jobs.append((dv, _numpy_sources(srcs)))
        else:
            _torch_sum(dst, srcs)
    kernels.run(jobs)


def sum_into(dst: Array, srcs: Sequence[Array], kernels: CpuKernels) -> None:
    """``dst[...] = sum(srcs)``, computed on ``dst``'s device.

    Sources on other devices are copied to ``dst``'s device first. ``dst`` may be
    ``srcs[0]`` (then it is summed in place).
    """
    sum_into_many([(dst, srcs)], kernels)


def _torch_sum(dst: Array, srcs: Sequence[Array]) -> None:
    torch = _torch_module()
    d = dst if not isinstance(dst, np.ndarray) else torch.from_numpy(dst)
    d = d.detach()
    device = CPU if d.device.type == "cpu" else str(d.device)
    first = _as_torch(srcs[0], device)
    if first.data_ptr() != d.data_ptr():
        d.copy_(first)
    for s in srcs[1:]:
        d.add_(_as_torch(s, device))


def wire_view(x: Array) -> np.ndarray[Any, Any]:
    """A flat NumPy view of a CPU array's raw elements (bfloat16 tensors as uint16 bits)."""
    v = _numpy_view(x)
    if v is not None:
        return v.reshape(-1)
    torch = _torch_module()
    t = x.detach()
    if t.device.type != "cpu" or t.dtype is not torch.bfloat16:
        raise UnsupportedValueError("wire_view needs a CPU array")
    return t.reshape(-1).view(torch.int16).numpy().view(np.uint16)  # type: ignore[no-any-return]


def from_wire(frame: np.ndarray[Any, Any], meta: ArrayMeta) -> Array:
    """A CPU array of ``meta``'s kind viewing a received frame (bfloat16 from uint16 bits)."""
    if meta.backend == "numpy":
        return frame
    torch = _torch_module()
    if meta.dtype == "bfloat16":
        return torch.from_numpy(frame.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(frame)


def take_rows(src: Array, rows: np.ndarray[Any, Any], dst: Array) -> None:
    """Write ``src[rows]`` into the same rows of ``dst`` and zero every other row."""
    sv = _numpy_view(src)
    dv = _numpy_view(dst)
    if sv is not None and dv is not None:
        dv[...] = 0
        dv[rows] = sv[rows]
        return
    torch = _torch_module()
    d = dst.detach()
    index = torch.from_numpy(rows).to(d.device)
    s = _as_torch(src, str(d.device) if d.device.type != "cpu" else CPU)
    d.zero_()
    d.index_copy_(0, index, s.index_select(0, index.to(s.device)))
