"""Scratch buffers for the update rules: reused across calls, never part of the saved state.

An update rule needs a few temporaries the size of the array it updates (a scaled
gradient, ``sqrt(v) + eps``, ...). Allocating them on every call costs an allocation
(for large arrays, fresh pages to fault in) and cold memory for every temporary. A
:class:`Workspace` keeps, per thread, one flat buffer per *slot* and dtype (and device,
and CUDA stream), grown to the largest size asked for, and hands out views of it shaped
like the arrays being updated. Slots are numbered by the rule; a view of slot ``i`` is
only valid until slot ``i`` is asked for again with another shape, which the rules never
do within one call.

The buffers belong to the optimizer object (one workspace each; a copy of the optimizer
starts with none), so they are dropped with it; they are never saved (the
:class:`~pskv.optimizer.Updater` saves only the optimizer's state arrays). Memory cost,
per thread: NumPy rules run over large arrays block by block (``base._BLOCK_BYTES``), so
a NumPy slot holds at most two blocks (1 MB); a torch slot holds the largest list of
tensors updated together (one key, or all keys of a list call), in its dtype and device.
Rules use one or two slots (FTRL four, plus a bool mask).

CUDA buffers are keyed by the current stream as well: work on one stream is ordered, so
a buffer reused on the same stream cannot be overwritten while a kernel still reads it.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["Workspace", "NumpyScratch", "TorchScratch"]

_MAX_CACHED = 4096  # cached views / scratch handles per thread before the caches are cleared
_SLOTS = 8  # slots a NumpyScratch remembers views for


class _Pool:
    """One thread's buffers; ``generation`` changes whenever a buffer is replaced."""

    __slots__ = ("buffers", "views", "handles", "generation")

    def __init__(self) -> None:
        self.buffers: dict[Any, Any] = {}
        self.views: dict[Any, Any] = {}
        self.handles: dict[Any, NumpyScratch] = {}
        self.generation = 0

    def replaced(self) -> None:
        self.generation += 1
        self.views.clear()  # views of the replaced buffer must not be handed out again


class Workspace:
    """Per-thread pools of flat scratch buffers and of views into them."""

    __slots__ = ("_local",)

    def __init__(self) -> None:
        self._local = threading.local()

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return (Workspace, ())  # a copy (copy.deepcopy, pickle) starts with no buffers

    def _pool(self) -> _Pool:
        try:
            return self._local.pool  # type: ignore[no-any-return]
        except AttributeError:
            pool = self._local.pool = _Pool()
            return pool

    def clear(self) -> None:
        """Drop this thread's buffers (they are recreated on demand)."""
        self._local.__dict__.clear()

    # ------------------------------------------------------------------ NumPy
    def numpy_view(self, slot: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        """A C-contiguous array of ``shape`` and ``dtype`` in slot ``slot`` (contents undefined)."""
        pool = self._pool()
        vkey = (slot, shape, dtype)
        view = pool.views.get(vkey)
        if view is not None:
            return view  # type: ignore[no-any-return]
        n = math.prod(shape)
        bkey = (slot, dtype)
        buf = pool.buffers.get(bkey)
        if buf is None or buf.size < n:
            buf = np.empty(max(n, 1), dtype=dtype)
            pool.buffers[bkey] = buf
            pool.replaced()
        if len(pool.views) >= _MAX_CACHED:
            pool.views.clear()
        view = buf[:n].reshape(shape)
        pool.views[vkey] = view
        return view

    def numpy(self, like: np.ndarray[Any, Any]) -> NumpyScratch:
        """Scratch arrays shaped like ``like`` (its dtype unless another is asked for)."""
        pool = self._pool()
        hkey = (like.shape, like.dtype)
        handle = pool.handles.get(hkey)
        if handle is None:
            if len(pool.handles) >= _MAX_CACHED:
                pool.handles.clear()
            handle = pool.handles[hkey] = NumpyScratch(self, pool, like.shape, like.dtype)
        return handle

    # ------------------------------------------------------------------ torch
    def torch_views(
        self, slot: int, shapes: tuple[Any, ...], numels: Sequence[int], dtype: Any, device: Any
    ) -> list[Any]:
        """Disjoint tensors of ``shapes`` in slot ``slot`` on ``device`` (contents undefined)."""
        torch = sys.modules["torch"]
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None
        pool = self._pool()
        bkey = ("torch", slot, dtype, device, stream)
        vkey = (bkey, shapes)
        out = pool.views.get(vkey)
        if out is not None:
            return out  # type: ignore[no-any-return]
        total = sum(numels)
        buf = pool.buffers.get(bkey)
        if buf is None or buf.numel() < total:
            buf = torch.empty(max(total, 1), dtype=dtype, device=device)
            pool.buffers[bkey] = buf
            pool.replaced()
        if len(pool.views) >= _MAX_CACHED:
            pool.views.clear()
        out, offset = [], 0
        for shape, n in zip(shapes, numels, strict=True):
            out.append(buf[offset : offset + n].view(shape))
            offset += n
        pool.views[vkey] = out
        return out

    def torch(self, likes: Sequence[Any]) -> TorchScratch:
        """Scratch tensor lists shaped like ``likes`` (same device; their dtype unless another is asked for)."""
        return TorchScratch(self, likes)


class NumpyScratch:
    """``scratch(slot)``: a scratch array of the bound shape and dtype (``scratch(slot, dtype)``: another dtype).

    A handle is cached per thread, shape and dtype, and remembers its views until a
    buffer of its thread is replaced.
    """

    __slots__ = ("_ws", "_pool", "shape", "dtype", "_views", "_generation")

    def __init__(self, ws: Workspace, pool: _Pool, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        self._ws, self._pool, self.shape, self.dtype = ws, pool, shape, dtype
        self._views: list[Any] = [None] * _SLOTS
        self._generation = pool.generation

    def __call__(self, slot: int, dtype: Any = None) -> np.ndarray[Any, Any]:
        if dtype is None:
            if self._generation == self._pool.generation:
                view = self._views[slot]
                if view is not None:
                    return view  # type: ignore[no-any-return]
            else:
                self._views = [None] * _SLOTS
                self._generation = self._pool.generation
            view = self._ws.numpy_view(slot, self.shape, self.dtype)
            if self._generation == self._pool.generation:  # the lookup did not replace a buffer
                self._views[slot] = view
            return view
        return self._ws.numpy_view(slot, self.shape, np.dtype(dtype))


class TorchScratch:
    """``scratch(slot)``: a list of scratch tensors, one per tensor of the bound list."""

    __slots__ = ("_ws", "shapes", "numels", "dtype", "device")

    def __init__(self, ws: Workspace, likes: Sequence[Any]) -> None:
        self._ws = ws
        self.shapes = tuple(t.shape for t in likes)
        self.numels = [t.numel() for t in likes]
        self.dtype = likes[0].dtype
        self.device = likes[0].device

    def __call__(self, slot: int, dtype: Any = None) -> list[Any]:
        return self._ws.torch_views(slot, self.shapes, self.numels, self.dtype if dtype is None else dtype, self.device)
