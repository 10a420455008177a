"""Casting compressors: ``fp16`` and ``bf16``, two bytes a value (half of float32's).

* ``fp16``: IEEE half precision (NumPy's cast: round to nearest, ties to even).
* ``bf16``: the high 16 bits of the float32, rounded to nearest, ties to even (the
  float32 bits plus ``0x7fff`` plus the lowest kept bit, then shifted: vectorised);
  a NaN stays a NaN.

Values beyond the format's largest finite one are sent as that (``±65504`` for fp16,
``±3.3895e38`` for bf16) rather than as infinities, so that error feedback keeps the
rest. With ``ef`` (default ``True``) the residual is added first and keeps the
rounding error; with ``ef=False`` it is neither read nor written. Payloads are
little-endian.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import numpy as np

from pskv.arrays.dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from pskv.compression import kernels
from pskv.compression.base import register
from pskv.compression.sparsify import FeedbackCompressor

__all__ = ["BFloat16", "Float16"]

_F16 = np.dtype("<f2")
_U16 = np.dtype("<u2")
_F16_MAX = np.float32(np.finfo(np.float16).max)
_BF16_MAX = np.array([0x7F7F0000], np.uint32).view(np.float32)[0]
_BF16_NAN = np.uint16(0x7FC0)
_F16_TABLE: list[np.ndarray[Any, Any]] = []


def _f16_table() -> np.ndarray[Any, Any]:
    """float32 of every half-precision code (NumPy's cast; 65536 values, made once): gathering from it
    decodes faster than casting, and the compiled loop reads the residual's values from it."""
    if not _F16_TABLE:
        _F16_TABLE.append(np.arange(65536, dtype=np.uint32).astype(np.uint16).view(_F16).astype(np.float32))
    return _F16_TABLE[0]


class _Cast(FeedbackCompressor):
    """Two bytes a value; the rounding error goes to the residual."""

    def payload_bytes(self, n: int) -> int:
        return 2 * n

    @abc.abstractmethod
    def _encode(self, r: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """The 16-bit values of ``r``."""

    @abc.abstractmethod
    def _fused(self, values: np.ndarray[Any, Any], grad: np.ndarray[Any, Any], ef: bool) -> np.ndarray[Any, Any]:
        """The 16-bit values of ``values + grad`` (with ``ef``, ``values`` is the residual: it becomes the sum, then
        keeps the rounding error; else ``values`` is what to send, read only) — one compiled pass."""

    def compress(self, grad: np.ndarray[Any, Any], residual: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
        if kernels.usable():
            ef = self.ef and residual is not None
            return self._fused(residual if ef else np.asarray(grad, np.float32), grad, ef).view(np.uint8)  # type: ignore[arg-type]
        r = self._start(grad, residual)
        payload = self._encode(r).view(np.uint8)
        if self.ef and residual is not None:
            self._keep(r, residual, self.decompress(payload, r.size))
        return payload


@register
class Float16(_Cast):
    """``fp16``: IEEE half precision."""

    type: ClassVar[str] = "fp16"

    def _encode(self, r: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return np.clip(r, -_F16_MAX, _F16_MAX).astype(_F16)

    def _fused(self, values: np.ndarray[Any, Any], grad: np.ndarray[Any, Any], ef: bool) -> np.ndarray[Any, Any]:
        return kernels.f16_compress(values, grad, ef, _F16_MAX, _f16_table())

    def decompress(self, payload: Any, n: int) -> np.ndarray[Any, Any]:
        return np.take(_f16_table(), self._bytes(payload, n).view(_U16))  # NumPy's cast of each code, gathered


@register
class BFloat16(_Cast):
    """``bf16``: bfloat16, float32's exponent with 8 bits of significand."""

    type: ClassVar[str] = "bf16"

    def _encode(self, r: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        rounded = f32_to_bf16_bits(np.clip(r, -_BF16_MAX, _BF16_MAX))  # no overflow: |value| <= the max
        return np.where(np.isnan(r), _BF16_NAN, rounded).astype(_U16)

    def _fused(self, values: np.ndarray[Any, Any], grad: np.ndarray[Any, Any], ef: bool) -> np.ndarray[Any, Any]:
        return kernels.bf16_compress(values, grad, ef, _BF16_MAX)

    def decompress(self, payload: Any, n: int) -> np.ndarray[Any, Any]:
        return bf16_bits_to_f32(self._bytes(payload, n).view(_U16))
