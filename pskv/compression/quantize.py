"""MXNet's quantizers: ``2bit`` (MXNet 1.x) and ``1bit`` (MXNet 2.0), value for value.

Both keep a residual per key and sender and compute in float32 exactly as MXNet's
kernels do (``src/kvstore/gradient_compression-inl.h``), so the values a receiver sums
and the residuals left behind are MXNet's, bit for bit:

* ``2bit``: ``r = residual + grad``; ``r >= threshold`` sends ``+threshold`` (code
  ``11``) and keeps ``r - threshold``; ``r <= -threshold`` sends ``-threshold`` (code
  ``10``) and keeps ``r + threshold``; otherwise sends 0 (``00``) and keeps ``r``. Four
  values per byte, the first in the two high bits: 16x fewer bytes than float32.
* ``1bit``: ``r = residual + grad``; ``r > threshold`` sends ``+1`` (bit 1) and keeps
  ``r - 1``; otherwise sends ``-1`` (bit 0) and keeps ``r + 1``. Eight values per byte,
  the first in the high bit: 32x fewer bytes. (MXNet's values are ±1 whatever the
  threshold; the threshold only splits them. MXNet 1.9.1 has no ``1bit``.)
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from pskv.compression.base import Compressor, register

__all__ = ["OneBit", "TwoBit"]

_SHIFTS = np.array([6, 4, 2, 0], np.uint8)


def _accumulate(grad: np.ndarray[Any, Any], residual: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
    """``residual + grad`` in float32, in the residual (a new array without one)."""
    if residual is None:
        return np.array(grad, np.float32, copy=True)
    np.add(residual, grad, out=residual)
    return residual


@register
class TwoBit(Compressor):
    """MXNet's ``2bit``: three levels (``-threshold``, 0, ``+threshold``) in two bits."""

    type: ClassVar[str] = "2bit"
    defaults: ClassVar[dict[str, Any]] = {"threshold": 0.5}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.threshold = np.float32(self._float("threshold", positive=True))  # MXNet: CHECK_GT(threshold, 0)

    def payload_bytes(self, n: int) -> int:
        return (n + 3) // 4

    def compress(self, grad: np.ndarray[Any, Any], residual: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
        r = _accumulate(grad, residual)
        t = self.threshold
        pos = r >= t
        neg = r <= -t
        np.subtract(r, t, out=r, where=pos)
        np.add(r, t, out=r, where=neg)
        n = r.size
        codes = np.zeros(4 * self.payload_bytes(n), np.uint8)
        codes[:n] = pos.view(np.uint8) * np.uint8(3) | neg.view(np.uint8) * np.uint8(2)
        return np.bitwise_or.reduce(codes.reshape(-1, 4) << _SHIFTS, axis=1).astype(np.uint8)

    def decompress(self, payload: Any, n: int) -> np.ndarray[Any, Any]:
        data = self._bytes(payload, n)
        codes = (data[:, None] >> _SHIFTS) & np.uint8(3)
        levels = np.array([0.0, 0.0, -self.threshold, self.threshold], np.float32)  # 00, 01 (unused), 10, 11
        return levels[codes.reshape(-1)[:n]]


@register
class OneBit(Compressor):
    """MXNet 2.0's ``1bit``: the sign against ``threshold``, as ±1, in one bit."""

    type: ClassVar[str] = "1bit"
    defaults: ClassVar[dict[str, Any]] = {"threshold": 0.5}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.threshold = np.float32(self._float("threshold"))  # MXNet takes any threshold here

    def payload_bytes(self, n: int) -> int:
        return (n + 7) // 8

    def compress(self, grad: np.ndarray[Any, Any], residual: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
        r = _accumulate(grad, residual)
        bits = r > self.threshold
        one = np.float32(1.0)
        np.subtract(r, one, out=r, where=bits)
        np.add(r, one, out=r, where=~bits)
        return np.packbits(bits)  # big-endian within a byte: the first value in the high bit, as MXNet

    def decompress(self, payload: Any, n: int) -> np.ndarray[Any, Any]:
        bits = np.unpackbits(self._bytes(payload, n), count=n)
        return np.where(bits.astype(bool), np.float32(1.0), np.float32(-1.0))
