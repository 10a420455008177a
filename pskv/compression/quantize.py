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

from pskv.compression import kernels
from pskv.compression.base import Compressor, register

__all__ = ["OneBit", "TwoBit"]


def _table(levels: np.ndarray[Any, Any], bits: int) -> np.ndarray[Any, Any]:
    """Per byte value, the ``8 // bits`` levels its codes stand for (the first code in the high bits)."""
    per = 8 // bits
    codes = (np.arange(256)[:, None] >> (8 - bits * (np.arange(per) + 1))) & ((1 << bits) - 1)
    return levels[codes].astype(np.float32)


# Elements compressed at a time: what one pass leaves in the CPU cache for the next (a multiple
# of 8, so every block starts on a byte of either payload). Measured on the ResNet-50 list:
# 2bit 105 -> 54 ms against whole arrays.
BLOCK = 1 << 18


def _blocked(compress: Any, r: np.ndarray[Any, Any], grad: np.ndarray[Any, Any] | None, per_byte: int,
             size: int) -> np.ndarray[Any, Any]:
    """``compress(r_block, grad_block)`` over blocks of :data:`BLOCK` elements, into one payload of ``size`` bytes."""
    n = r.size
    if n <= BLOCK:
        return compress(r, grad)  # type: ignore[no-any-return]
    payload = np.empty(size, np.uint8)
    for start in range(0, n, BLOCK):
        stop = min(start + BLOCK, n)
        payload[start // per_byte: -(-stop // per_byte)] = compress(r[start:stop],
                                                                    None if grad is None else grad[start:stop])
    return payload


def _decode(table: np.ndarray[Any, Any], data: np.ndarray[Any, Any], n: int) -> np.ndarray[Any, Any]:
    """The ``n`` values of a payload: one table row per byte (one gather, no Python loop)."""
    return np.take(table, data, axis=0).reshape(-1)[:n]


@register
class TwoBit(Compressor):
    """MXNet's ``2bit``: three levels (``-threshold``, 0, ``+threshold``) in two bits."""

    type: ClassVar[str] = "2bit"
    defaults: ClassVar[dict[str, Any]] = {"threshold": 0.5}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.threshold = t = np.float32(self._float("threshold", positive=True))  # MXNet: CHECK_GT(threshold, 0)
        self._table = _table(np.array([0.0, 0.0, -t, t], np.float32), 2)  # codes 00, 01 (unused), 10, 11

    def payload_bytes(self, n: int) -> int:
        return (n + 3) // 4

    def compress(self, grad: np.ndarray[Any, Any], residual: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
        if residual is None:
            return _blocked(self._quantize, np.array(grad, np.float32, copy=True), None, 4, self.payload_bytes(grad.size))
        if kernels.usable():  # one fused loop (Numba), the same values
            payload = np.empty(self.payload_bytes(grad.size), np.uint8)
            kernels.quantize_2bit(residual, grad, self.threshold, payload)
            return payload
        return _blocked(self._quantize, residual, grad, 4, self.payload_bytes(grad.size))

    def _quantize(self, r: np.ndarray[Any, Any], grad: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
        """One block: ``r += grad``; the payload; ``r`` keeps what it does not carry."""
        if grad is not None:
            np.add(r, grad, out=r)
        t = self.threshold
        pos = r >= t
        bits = np.empty(2 * r.size, bool)  # per value its code's two bits: 11 (+t), 10 (-t), 00
        np.logical_or(pos, r <= -t, out=bits[0::2])
        bits[1::2] = pos
        payload = np.packbits(bits)  # the first value in the high bits, as MXNet
        np.subtract(r, _decode(self._table, payload, r.size), out=r)  # r - t, r - (-t) or r - 0: MXNet's residual
        return payload

    def decompress(self, payload: Any, n: int) -> np.ndarray[Any, Any]:
        return _decode(self._table, self._bytes(payload, n), n)


@register
class OneBit(Compressor):
    """MXNet 2.0's ``1bit``: the sign against ``threshold``, as ±1, in one bit."""

    type: ClassVar[str] = "1bit"
    defaults: ClassVar[dict[str, Any]] = {"threshold": 0.5}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.threshold = np.float32(self._float("threshold"))  # MXNet takes any threshold here
        self._table = _table(np.array([-1.0, 1.0], np.float32), 1)

    def payload_bytes(self, n: int) -> int:
        return (n + 7) // 8

    def compress(self, grad: np.ndarray[Any, Any], residual: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
        if residual is None:
            return _blocked(self._quantize, np.array(grad, np.float32, copy=True), None, 8, self.payload_bytes(grad.size))
        if kernels.usable():  # one fused loop (Numba), the same values
            payload = np.empty(self.payload_bytes(grad.size), np.uint8)
            kernels.quantize_1bit(residual, grad, self.threshold, payload)
            return payload
        return _blocked(self._quantize, residual, grad, 8, self.payload_bytes(grad.size))

    def _quantize(self, r: np.ndarray[Any, Any], grad: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
        """One block: ``r += grad``; the payload; ``r`` keeps what it does not carry."""
        if grad is not None:
            np.add(r, grad, out=r)
        payload = np.packbits(r > self.threshold)  # big-endian within a byte: the first value in the high bit
        np.subtract(r, _decode(self._table, payload, r.size), out=r)  # r - 1 or r - (-1): MXNet's residual
        return payload

    def decompress(self, payload: Any, n: int) -> np.ndarray[Any, Any]:
        return _decode(self._table, self._bytes(payload, n), n)
