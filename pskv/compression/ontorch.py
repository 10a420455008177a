"""Every compressor on PyTorch tensors where they live (a CUDA device), in the NumPy classes' wire format.

The ``device`` store sums a key's values on their device; compressing them through
NumPy would copy each one to the host and back. :func:`compress` and
:func:`decompress` do a compressor's arithmetic with torch operations on the tensors'
own device (:mod:`pskv.compression.ontorch_ops`; no Python loop over elements), and
their payloads are the bytes the NumPy classes document: a payload made on a tensor
decodes with the compressor's ``decompress`` and a NumPy payload with
:func:`decompress`, and hostile payloads are refused in the same way (length, indices,
levels). Residuals (error feedback, ``ef``) follow the NumPy path's rules.

On CPU tensors the deterministic types give the NumPy path's payloads and residuals bit
for bit (``tests/unit/test_compression_torch.py``): ``2bit`` and ``1bit`` (MXNet's
float32 arithmetic), ``onebit`` (its scale summed in float64, then float32, as NumPy's;
the two sums run in different orders, so in principle the last float64 bit, and in a
vanishing case the float32 scale, may differ), ``topk`` (for distinct magnitudes: among
equal ones torch may keep other indices than NumPy's ``argpartition``), ``fp16`` and
``bf16`` (a NaN stays a NaN; its payload bits may differ on CUDA). ``randomk`` and
``dithering`` draw from a ``torch.Generator`` per compressor and device, seeded by the
compressor's ``seed`` on first use and advancing call after call: the same parameters
give the same payloads call after call on a device, but not NumPy's draws (nor another
device's). Their payloads carry everything a receiver needs (indices, levels), so they
decode anywhere.
"""

from __future__ import annotations

from typing import Any

from pskv.compression.base import Compressor
from pskv.compression.cast import BFloat16, Float16
from pskv.compression.quantize import OneBit, TwoBit
from pskv.compression.sparsify import Dithering, RandomK, ScaledSign, TopK
from pskv.errors import InvalidArgumentError

__all__ = ["compress", "decompress", "supports"]

# each type: the names of its compress and decompress in ontorch_ops (imported with torch, on first use)
_OPS: dict[type[Compressor], tuple[str, str]] = {
    TwoBit: ("compress_quantized", "decompress_quantized"), OneBit: ("compress_quantized", "decompress_quantized"),
    ScaledSign: ("compress_onebit", "decompress_onebit"), TopK: ("compress_topk", "decompress_sparse"),
    RandomK: ("compress_randomk", "decompress_sparse"), Dithering: ("compress_dithering", "decompress_dithering"),
    Float16: ("compress_fp16", "decompress_fp16"), BFloat16: ("compress_bf16", "decompress_bf16"),
}


def supports(compressor: Compressor) -> bool:
    """Whether ``compressor`` runs on torch tensors here: every registered type (not a subclass made elsewhere)."""
    return type(compressor) in _OPS


def _op(compressor: Compressor, which: int) -> Any:
    from pskv.compression import ontorch_ops
    if not supports(compressor):
        raise InvalidArgumentError(f"gradient compression {compressor.type!r}: {type(compressor).__name__} has no "
                                   f"torch implementation")
    return getattr(ontorch_ops, _OPS[type(compressor)][which])


def compress(compressor: Compressor, grad: Any, residual: Any) -> Any:
    """The payload (a uint8 tensor on ``grad``'s device) of ``grad`` (float32 tensor, 1-D).

    With ``residual`` (float32, like ``grad``, same device) the residual is added first and
    left holding what the payload does not carry (updated in place) — for BytePS's types
    only with ``ef`` (with ``ef=False`` it is neither read nor written), as the NumPy path.

    Raises:
        InvalidArgumentError: ``compressor`` is not one of the registered types.
    """
    import torch
    op = _op(compressor, 0)
    flat = grad.reshape(-1)
    feedback = residual is not None and getattr(compressor, "ef", True)
    if feedback:
        r = residual
        r.add_(flat)
    else:
        r = flat.to(torch.float32)  # read only: no op writes what it compresses without feedback
    if isinstance(compressor, (TwoBit, OneBit)):
        return op(compressor, 2 if isinstance(compressor, TwoBit) else 1, r, feedback)
    return op(compressor, r, feedback)


def decompress(compressor: Compressor, payload: Any, n: int) -> Any:
    """The ``n`` float32 values (on ``payload``'s device) a payload (uint8 tensor) stands for.

    Raises:
        InvalidArgumentError: the payload's length is not ``payload_bytes(n)``; for
            ``topk`` / ``randomk`` its indices do not increase or reach ``n``; for
            ``dithering`` a level is above ``s``; ``compressor`` is not a registered type.
    """
    import torch
    op = _op(compressor, 1)
    data = payload.contiguous().reshape(-1)
    if data.dtype != torch.uint8:
        data = data.view(torch.uint8)
    if data.numel() != compressor.payload_bytes(n):
        raise InvalidArgumentError(f"gradient compression {compressor.type!r}: a payload of {data.numel()} "
                                   f"bytes for {n} elements (expected {compressor.payload_bytes(n)})")
    return op(compressor, data, n)
