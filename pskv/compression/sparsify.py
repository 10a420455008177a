"""BytePS's compressors: ``onebit`` (sign with scaling), ``topk``, ``randomk``, ``dithering``.

Each takes ``ef`` (default ``True``): with it, ``compress`` adds the residual first and
leaves in it what the payload does not carry (error feedback, BytePS's ``vanilla``
type); with ``ef=False`` the residual is neither read nor written. Every payload's
size depends only on the element count and the parameters, and its numbers are
little-endian:

* ``onebit``: ``scale`` = mean of ``|r|`` (one float32), then one bit per value, the
  first in the high bit: 1 for ``r < 0``. Decodes to ``-scale`` or ``+scale``.
* ``topk``: the ``k`` values of largest ``|r|``: ``k`` uint32 indices (strictly
  increasing), then their ``k`` float32 values, exact; zeros elsewhere. ``k >= 1`` is a
  count (at most ``n``); ``0 < k < 1`` a fraction of ``n``: ``floor(k * n + 0.5)``
  values, at least one.
* ``randomk``: ``k`` values chosen at random (as ``topk``'s ``k``), sent like
  ``topk``'s, the indices included: a receiver needs no generator and any sender's
  payload decodes on its own (replays too). ``seed`` makes the choice reproducible: a
  compressor made with the same parameters chooses the same indices call after call.
  Values are sent as they are (BytePS's; not scaled by ``n / k``).
* ``dithering``: ``norm`` = ``max(|r|)`` (``norm='max'``, the default) or ``||r||_2``
  (``'l2'``), one float32, then per value a sign bit (1: negative) and a level in
  ``0..s`` (``s`` levels of ``|r| / norm``, linear), stochastically rounded so that
  the decoded ``sign * level * norm / s`` equals ``r`` in expectation; each value's
  ``1 + bit_length(s)`` bits run from the sign down, the first value in the high bits.
  The draws come from a generator seeded by ``seed``. ``norm='l2'`` takes ``ef=False``
  only: its rounding error, about ``sqrt(n) / s`` times the values', would make the
  residual grow without bound.
"""

from __future__ import annotations

import abc
import math
from typing import Any, ClassVar

import numpy as np

from pskv.compression import kernels
from pskv.compression.base import Compressor, register
from pskv.errors import InvalidArgumentError

__all__ = ["Dithering", "FeedbackCompressor", "RandomK", "ScaledSign", "TopK"]

_F32 = np.dtype("<f4")
_U32 = np.dtype("<u4")
_SIGN_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).astype(bool)  # per byte, its 8 bits
# topk on arrays of at least this many values first keeps the values above a floor estimated from
# an even sample of _SAMPLE of them, then selects among those (one pass instead of a partition of
# the whole array: ResNet-50's list, 25.6M values, 86 -> ~25 ms)
_SELECT_FROM = 1 << 17
_SAMPLE = 1 << 14


class FeedbackCompressor(Compressor):
    """A compressor with an ``ef`` parameter (error feedback on or off) and integer / choice parameters."""

    defaults: ClassVar[dict[str, Any]] = {"ef": True}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        value = self._params["ef"]
        if isinstance(value, str) and value.lower() in ("true", "false"):  # MXNet passes strings
            value = value.lower() == "true"
        if not isinstance(value, (bool, np.bool_)):
            raise InvalidArgumentError(f"gradient compression {self.type!r}: ef must be true or false, got {value!r}")
        self.ef = self._params["ef"] = bool(value)

    def _int(self, name: str, low: int, high: int) -> int:
        """Parameter ``name`` as an integer in ``[low, high]``, checked."""
        value = self._params[name]
        number = self._float(name, low=low, high=high)
        if not number.is_integer():
            raise InvalidArgumentError(f"gradient compression {self.type!r}: {name} must be an integer in "
                                       f"[{low}, {high}], got {value!r}")
        self._params[name] = int(number)
        return int(number)

    def _start(self, grad: np.ndarray[Any, Any], residual: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
        """What to compress: ``residual + grad`` in the residual with error feedback, else ``grad``."""
        if self.ef and residual is not None:
            np.add(residual, grad, out=residual)
            return residual
        return np.asarray(grad, np.float32)

    def _keep(self, r: np.ndarray[Any, Any], residual: np.ndarray[Any, Any] | None,
              decoded: np.ndarray[Any, Any]) -> None:
        """Error feedback: the residual keeps ``r - decoded``."""
        if self.ef and residual is not None:
            np.subtract(r, decoded, out=residual)


@register
class ScaledSign(FeedbackCompressor):
    """BytePS's ``onebit``: the signs, scaled by the mean magnitude."""

    type: ClassVar[str] = "onebit"

    def payload_bytes(self, n: int) -> int:
        return 4 + (n + 7) // 8

    def compress(self, grad: np.ndarray[Any, Any], residual: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
        if kernels.usable():  # one fused pass for the scale, one for the signs (Numba)
            ef = self.ef and residual is not None
            values = residual if ef else np.asarray(grad, np.float32)
            return kernels.scaled_sign_compress(values, grad, ef)  # type: ignore[arg-type]
        r = self._start(grad, residual)
        scale = np.float32(np.abs(r).mean(dtype=np.float64)) if r.size else np.float32(0)
        negative = r < 0
        payload = np.concatenate([np.array([scale], _F32).view(np.uint8), np.packbits(negative)])
        self._keep(r, residual, np.where(negative, -scale, scale))
        return payload

    def decompress(self, payload: Any, n: int) -> np.ndarray[Any, Any]:
        data = self._bytes(payload, n)
        scale = data[:4].view(_F32)[0].astype(np.float32)
        table = np.where(_SIGN_BITS, -scale, scale).astype(np.float32)  # per byte, its 8 values
        return np.take(table, data[4:], axis=0).reshape(-1)[:n]


class _Sparse(FeedbackCompressor):
    """``k`` of the values with their indices: ``k`` uint32 indices (increasing), then ``k`` float32 values."""

    defaults: ClassVar[dict[str, Any]] = {"k": 0.01, "ef": True}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        value = self._params["k"]
        k = self._float("k", positive=True)
        if k >= 1 and not k.is_integer():
            raise InvalidArgumentError(f"gradient compression {self.type!r}: k must be an integer >= 1 (a count) "
                                       f"or a fraction in (0, 1), got {value!r}")
        self.k = self._params["k"] = int(k) if k >= 1 else k

    def count(self, n: int) -> int:
        """How many values a payload of ``n`` elements carries."""
        if n <= 0:
            return 0
        return min(n, int(self.k)) if isinstance(self.k, int) else min(n, max(1, math.floor(self.k * n + 0.5)))

    def payload_bytes(self, n: int) -> int:
        return 8 * self.count(n)

    @abc.abstractmethod
    def _indices(self, r: np.ndarray[Any, Any], k: int) -> np.ndarray[Any, Any]:
        """The ``k`` indices to send (any order)."""

    def compress(self, grad: np.ndarray[Any, Any], residual: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
        r = self._start(grad, residual)
        k = self.count(r.size)
        index = np.sort(self._indices(r, k)).astype(_U32)
        values = r[index].astype(_F32)
        if self.ef and residual is not None:
            residual[index] = 0  # what was sent, exactly; the rest stays
        return np.concatenate([index.view(np.uint8), values.view(np.uint8)])

    def decompress(self, payload: Any, n: int) -> np.ndarray[Any, Any]:
        data = self._bytes(payload, n)
        k = self.count(n)
        index = data[:4 * k].view(_U32)
        if k and (index[-1] >= n or (k > 1 and (np.diff(index.astype(np.int64)) <= 0).any())):
            raise InvalidArgumentError(f"gradient compression {self.type!r}: the indices of a payload of {n} "
                                       f"elements must increase and stay below {n}")
        out = np.zeros(n, np.float32)
        out[index] = data[4 * k:].view(_F32)
        return out


@register
class TopK(_Sparse):
    """``topk``: the ``k`` values of largest magnitude, exact."""

    type: ClassVar[str] = "topk"

    def _indices(self, r: np.ndarray[Any, Any], k: int) -> np.ndarray[Any, Any]:
        n = r.size
        if k >= n:
            return np.arange(n)
        candidates = self._candidates(r, k) if n >= _SELECT_FROM and 4 * k <= n else None
        if candidates is None:
            return np.argpartition(np.abs(r), n - k)[n - k:]
        return candidates[np.argpartition(np.abs(r[candidates]), candidates.size - k)[candidates.size - k:]]

    @staticmethod
    def _candidates(r: np.ndarray[Any, Any], k: int) -> np.ndarray[Any, Any] | None:
        """The indices (in order) of every value whose magnitude reaches a floor estimated, from an
        even sample, to let about ``2k`` through — a superset of the top ``k`` when at least ``k``
        pass — or None when fewer than ``k`` or more than ``8k`` pass (ties, a skewed sample)."""
        n = r.size
        sample = np.abs(r[::n // _SAMPLE])
        floor = np.partition(sample, sample.size - 1 - (2 * k * sample.size) // n)[sample.size - 1 - (2 * k * sample.size) // n]
        cap = 8 * k
        if kernels.usable():
            out = np.empty(cap, np.int64)
            count = kernels.magnitude_at_least(r, floor, out)
            candidates = out[:count]
        else:
            candidates = np.flatnonzero(np.abs(r) >= floor)
            count = candidates.size
        return candidates if k <= count <= cap else None


@register
class RandomK(_Sparse):
    """``randomk``: ``k`` values chosen by a seeded generator, sent with their indices."""

    type: ClassVar[str] = "randomk"
    defaults: ClassVar[dict[str, Any]] = {"k": 0.01, "seed": 0, "ef": True}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.seed = self._int("seed", 0, 2**63 - 1)
        self._rng = np.random.default_rng(self.seed)

    def _indices(self, r: np.ndarray[Any, Any], k: int) -> np.ndarray[Any, Any]:
        return self._rng.choice(r.size, k, replace=False)


@register
class Dithering(FeedbackCompressor):
    """BytePS's ``dithering``: ``s`` linear levels of ``|r| / norm``, stochastically rounded (unbiased)."""

    type: ClassVar[str] = "dithering"
    defaults: ClassVar[dict[str, Any]] = {"s": 2, "norm": "max", "seed": 0, "ef": True}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.s = self._int("s", 1, 255)
        if self._params["norm"] not in ("max", "l2"):
            raise InvalidArgumentError(f"gradient compression {self.type!r}: norm must be 'max' or 'l2', "
                                       f"got {self._params['norm']!r}")
        self.norm: str = self._params["norm"]
        if self.norm == "l2" and self.ef:
            raise InvalidArgumentError(f"gradient compression {self.type!r}: norm 'l2' needs ef=false (its rounding "
                                       f"error grows with sqrt(n) / s beyond the values: error feedback diverges)")
        self.seed = self._int("seed", 0, 2**63 - 1)
        self.bits = 1 + self.s.bit_length()  # per value: the sign, then the level
        self._rng = np.random.default_rng(self.seed)

    def payload_bytes(self, n: int) -> int:
        return 4 + (n * self.bits + 7) // 8

    def compress(self, grad: np.ndarray[Any, Any], residual: np.ndarray[Any, Any] | None) -> np.ndarray[Any, Any]:
        if kernels.usable() and self.norm == "max":  # two compiled passes, the same draws
            ef = self.ef and residual is not None
            r = residual if ef and residual is not None else np.asarray(grad, np.float32)
            norm = kernels.add_max_abs(r, grad, ef) if r.size else np.float32(0)
            payload = np.zeros(self.payload_bytes(r.size), np.uint8)
            payload[:4] = np.array([norm], _F32).view(np.uint8)
            kernels.dither(r, ef, norm, self.s, self.bits, self._rng.random(r.size, np.float32), payload[4:])
            return payload
        r = self._start(grad, residual)
        magnitude = np.abs(r)
        if not r.size:
            norm = np.float32(0)
        elif self.norm == "max":
            norm = magnitude.max()
        else:
            norm = np.float32(np.sqrt(np.dot(r.astype(np.float64), r)))
        scaled = magnitude / norm * np.float32(self.s) if norm > 0 else np.zeros(r.size, np.float32)
        level = np.floor(scaled)
        level += self._rng.random(r.size, np.float32) < scaled - level  # up with probability of the fraction
        level = np.minimum(level, self.s).astype(np.uint16)
        negative = r < 0
        bits = np.empty((r.size, self.bits), bool)
        bits[:, 0] = negative
        for j in range(1, self.bits):  # the level's bits, highest first
            bits[:, j] = (level >> (self.bits - 1 - j)) & 1
        payload = np.concatenate([np.array([norm], _F32).view(np.uint8), np.packbits(bits.reshape(-1))])
        if self.ef and residual is not None:
            self._keep(r, residual, self._values(negative, level, norm))
        return payload

    def _values(self, negative: np.ndarray[Any, Any], level: np.ndarray[Any, Any], norm: Any) -> np.ndarray[Any, Any]:
        step = np.float32(norm) / np.float32(self.s)
        values = level.astype(np.float32) * step
        return np.where(negative, -values, values)

    def decompress(self, payload: Any, n: int) -> np.ndarray[Any, Any]:
        data = self._bytes(payload, n)
        norm = data[:4].view(_F32)[0]
        if kernels.usable():
            values = kernels.undither(data[4:], n, self.s, self.bits, norm)
            if values is None:
                raise InvalidArgumentError(f"gradient compression {self.type!r}: a payload of {n} elements with a "
                                           f"level above s={self.s}")
            return values
        bits = np.unpackbits(data[4:], count=n * self.bits).reshape(n, self.bits)
        level = np.zeros(n, np.uint16)
        for j in range(1, self.bits):
            level <<= 1
            level |= bits[:, j]
        if n and level.max() > self.s:
            raise InvalidArgumentError(f"gradient compression {self.type!r}: a payload of {n} elements with a level "
                                       f"above s={self.s}")
        return self._values(bits[:, 0].astype(bool), level, norm)
