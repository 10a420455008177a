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


def _accumulate(grad: np.ndarray[Any, Any], residual: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
    """``residual + grad`` in float32, in the residual (a new array without one)."""
    if residual is None:
        return np.array(grad, np.float32, copy=True)
    np.add(residual, grad, out=residual)
    return residual


def _table(levels: np.ndarray[Any, Any], bits: int) -> np.ndarray[Any, Any]:
    """Per byte value, the ``8 // bits`` levels its codes stand for (the first code in the high bits)."""
    per = 8 // bits
    codes = (np.arange(256)[:, None] >> (8 - bits * (np.arange(per) + 1))) & ((1 << bits) - 1)
    return levels[codes].astype(np.float32)


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
        r = _accumulate(grad, residual)
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
        r = _accumulate(grad, residual)
        payload = np.packbits(r > self.threshold)  # big-endian within a byte: the first value in the high bit
        np.subtract(r, _decode(self._table, payload, r.size), out=r)  # r - 1 or r - (-1): MXNet's residual
        return payload

    def decompress(self, payload: Any, n: int) -> np.ndarray[Any, Any]:
        return _decode(self._table, self._bytes(payload, n), n)
