"""``Compression``: what a tensor is sent as in ``allreduce(compression=)`` (Horovod's interface).

A compressor's ``compress(tensor)`` returns ``(sent, ctx)`` and ``decompress(received, ctx)``
the tensor the caller gets back. ``Compression.none`` sends the tensor as it is;
``Compression.fp16`` sends floating-point tensors as float16 (half the bytes) and casts
the result back, as Horovod's does. pskv's own gradient compressors (2-bit, top-k, ...:
:mod:`pskv.compression`) keep residuals per key on the workers and are decoded by the
servers, so they are a store setting (``store().set_gradient_compression``), not a
per-call compressor.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]


class Compressor:
    """The interface: compress a tensor with the context needed to decompress it."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The tensor to send and a context for :meth:`decompress`."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The received tensor as the caller's."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression (the default): the tensor itself."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """``(tensor, None)``."""
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """``tensor``."""
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16; others as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """A float16 copy of a floating-point tensor (the tensor itself otherwise), and its dtype."""
        sent = tensor.to(torch.float16) if tensor.dtype.is_floating_point else tensor
        return sent, tensor.dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The received tensor cast back to the dtype it was compressed from."""
        return tensor.to(ctx) if ctx.is_floating_point else tensor


class Compression:
    """The compressors by name, as Horovod's ``hvd.Compression``."""

    none = NoneCompressor
    fp16 = FP16Compressor
