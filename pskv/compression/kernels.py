"""Fused compression loops, compiled by Numba when it is installed.

The NumPy versions in :mod:`pskv.compression.quantize`, :mod:`~pskv.compression.sparsify`
and :mod:`~pskv.compression.cast` make several passes over a gradient (add, compare,
pack, the residual's update); these do it in one loop with the same float32 arithmetic,
so their payloads and residuals are bit for bit those of the NumPy path
(``tests/unit/test_compression.py`` and ``test_compressors.py`` run both) — except
``onebit``'s scale, a float64 mean whose summation order differs (pairwise in NumPy,
sequential here), which can move its float32 rounding by one unit in rare cases.
Decoding stays NumPy: a gather from a small table (``np.take``) is faster than a loop.
Measured on the ResNet-50 gradient list (25.6M elements) on this project's 2-core VM,
compress in ms: 2bit 21 here against 54 in NumPy; the other types' figures are in
docs/benchmarks.md.

Numba is optional (``pip install 'pskv[fast]'``; the ``test`` extra installs it): without
it :data:`AVAILABLE` is False and the NumPy path runs. Set :data:`ENABLED` to False to
force the NumPy path. The compressors ask :func:`usable` before each value: its first call
starts compiling every loop on a thread of its own (about half a second, seconds on a loaded
machine or a cold cache; cached on disk where the package directory is writable), and the
NumPy path runs until they are ready.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from typing import Any

import numpy as np

__all__ = ["AVAILABLE", "ENABLED", "add_max_abs", "bf16_compress", "dither", "f16_compress", "magnitude_at_least",
           "quantize_1bit", "quantize_2bit", "scaled_sign_compress", "undither", "usable", "warm"]

#: Numba is installed (it is imported, and the loops compiled, at the first compressed value of a process:
#: importing it costs a third of a second, which a process that never compresses does not pay).
AVAILABLE = importlib.util.find_spec("numba") is not None
#: Use the compiled loops when available (tests turn them off to run the NumPy path).
ENABLED = True


def _quantize_2bit(r: Any, grad: Any, t: Any, out: Any) -> None:  # pragma: no cover - compiled
    n = r.size
    neg = -t
    for b in range(n // 4):  # whole bytes: no bounds check, no branch (the compiler vectorizes it)
        byte = 0
        for j in range(4):
            i = 4 * b + j
            v = r[i] + grad[i]  # float32 throughout, as MXNet's kernel
            p = v >= t
            q = v <= neg
            byte |= ((3 * p) | (2 * q)) << (6 - 2 * j)
            # v - t, v + t or v: (v - 1*t) + 0*t, (v - 0*t) + 1*t, ... each step exact in float32
            r[i] = (v - np.float32(p) * t) + np.float32(q) * t
        out[b] = byte
    if n % 4:
        byte = 0
        for i in range(n - n % 4, n):
            v = r[i] + grad[i]
            p = v >= t
            q = v <= neg
            byte |= ((3 * p) | (2 * q)) << (6 - 2 * (i % 4))
            r[i] = (v - np.float32(p) * t) + np.float32(q) * t
        out[n // 4] = byte


def _quantize_1bit(r: Any, grad: Any, t: Any, out: Any) -> None:  # pragma: no cover - compiled
    n = r.size
    one = np.float32(1.0)
    for b in range(n // 8):
        byte = 0
        for j in range(8):
            i = 8 * b + j
            v = r[i] + grad[i]
            p = v > t
            byte |= p << (7 - j)
            r[i] = v - one if p else v + one  # v - 1 or v + 1, as MXNet
        out[b] = byte
    if n % 8:
        byte = 0
        for i in range(n - n % 8, n):
            v = r[i] + grad[i]
            p = v > t
            byte |= p << (7 - i % 8)
            r[i] = v - one if p else v + one
        out[n // 8] = byte


def _add_abs_sum(r: Any, grad: Any, ef: bool) -> float:  # pragma: no cover - compiled
    total = 0.0
    if ef:
        for i in range(r.size):
            v = r[i] + grad[i]
            r[i] = v
            total += abs(v)
    else:
        for i in range(r.size):
            total += abs(r[i])
    return total


def _scaled_sign(r: Any, scale: Any, ef: bool, out: Any) -> None:  # pragma: no cover - compiled
    n = r.size
    whole = n // 8
    if ef:
        for b in range(whole):  # whole bytes: the loops MXNet's 1bit kernel runs as fast
            byte = 0
            for j in range(8):
                v = r[8 * b + j]
                negative = v < 0
                byte |= negative << (7 - j)
                r[8 * b + j] = v + scale if negative else v - scale
            out[b] = byte
    else:
        for b in range(whole):
            byte = 0
            for j in range(8):
                byte |= (r[8 * b + j] < 0) << (7 - j)
            out[b] = byte
    if n % 8:
        byte = 0
        for i in range(whole * 8, n):
            v = r[i]
            negative = v < 0
            byte |= negative << (7 - (i - whole * 8))
            if ef:
                r[i] = v + scale if negative else v - scale
        out[whole] = byte


def _f16_compress(r: Any, grad: Any, ef: bool, limit: Any, table: Any, out: Any) -> None:  # pragma: no cover - compiled
    one = np.empty(1, np.float32)  # a scalar's bits through a one-element array
    bits = one.view(np.uint32)
    for i in range(r.size):
        v = r[i] + grad[i] if ef else r[i]
        one[0] = min(max(v, -limit), limit) if v == v else v  # saturated; a NaN stays
        u = bits[0]
        sign = (u >> 16) & 0x8000
        a = u & 0x7FFFFFFF
        if a > 0x7F800000:  # NaN: quiet, the high bits of its payload kept
            h = 0x7E00 | ((a >> 13) & 0x3FF)
        elif a >= 0x38800000:  # a normal half: rebias, round to nearest even
            h = (a - 0x38000000 + 0xFFF + ((a >> 13) & 1)) >> 13
        else:  # a subnormal half (or zero): |v| * 2**24 (exact), rounded to nearest even
            h = np.uint32(np.rint(abs(one[0]) * np.float32(16777216.0)))
        code = np.uint16(sign | h)
        out[i] = code
        if ef:
            r[i] = v - table[code]


def _bf16_compress(r: Any, grad: Any, ef: bool, limit: Any, out: Any) -> None:  # pragma: no cover - compiled
    one = np.empty(1, np.float32)
    bits = one.view(np.uint32)
    for i in range(r.size):
        v = r[i] + grad[i] if ef else r[i]
        if v != v:  # NaN
            out[i] = np.uint16(0x7FC0)
            if ef:
                r[i] = v
            continue
        one[0] = min(max(v, -limit), limit)
        u = bits[0]
        code = (u + (0x7FFF + ((u >> 16) & 1))) >> 16  # no overflow: |value| <= the largest finite bf16
        out[i] = np.uint16(code)
        if ef:
            bits[0] = code << 16
            r[i] = v - one[0]


def _add_max_abs(r: Any, grad: Any, ef: bool) -> Any:  # pragma: no cover - compiled
    """With ``ef``: ``r += grad``. The largest ``|r|`` (NaN if any value is NaN, as ``np.max``)."""
    top = np.float32(0)
    nan = False
    for i in range(r.size):
        v = r[i] + grad[i] if ef else r[i]
        if ef:
            r[i] = v
        if v != v:
            nan = True
        elif abs(v) > top:
            top = abs(v)
    return np.float32(np.nan) if nan else top


def _dither(r: Any, ef: bool, norm: Any, s: int, bits: int, uniform: Any, out: Any) -> None:  # pragma: no cover
    """Per value of ``r``: the sign bit and the level (stochastically rounded with ``uniform``), ``bits`` bits a
    value from the high bit of ``out`` on; with ``ef`` ``r`` keeps what the level does not carry."""
    levels = np.float32(s)
    step = norm / levels
    scale = norm > 0
    acc = np.uint64(0)
    held = 0
    pos = 0
    for i in range(r.size):
        v = r[i]
        level = np.float32(0)
        if scale:
            scaled = abs(v) / norm * levels
            level = np.floor(scaled)
            if uniform[i] < scaled - level:
                level += np.float32(1)
            if level > levels:
                level = levels
        negative = v < 0
        code = (np.uint64(negative) << np.uint64(bits - 1)) | np.uint64(level)
        acc = (acc << np.uint64(bits)) | code
        held += bits
        while held >= 8:
            held -= 8
            out[pos] = np.uint8((acc >> np.uint64(held)) & np.uint64(0xFF))
            pos += 1
        if ef:
            value = level * step
            r[i] = v - (-value if negative else value)
    if held:
        out[pos] = np.uint8((acc << np.uint64(8 - held)) & np.uint64(0xFF))


def _undither(data: Any, n: int, s: int, bits: int, norm: Any, out: Any) -> bool:  # pragma: no cover - compiled
    """The values of a dithering payload's codes; False if a level is above ``s`` (``out`` then partly written)."""
    step = norm / np.float32(s)
    mask = np.uint64((1 << (bits - 1)) - 1)
    acc = np.uint64(0)
    held = 0
    pos = 0
    for i in range(n):
        while held < bits:
            acc = ((acc << np.uint64(8)) | np.uint64(data[pos])) & np.uint64(0xFFFFFFFF)
            pos += 1
            held += 8
        held -= bits
        code = (acc >> np.uint64(held)) & ((mask << np.uint64(1)) | np.uint64(1))
        level = code & mask
        if level > np.uint64(s):
            return False
        value = np.float32(level) * step
        out[i] = -value if code >> np.uint64(bits - 1) else value
    return True


def _magnitude_at_least(r: Any, floor: Any, out: Any) -> int:  # pragma: no cover - compiled
    count = 0
    cap = out.size
    for i in range(r.size):
        if abs(r[i]) >= floor:
            if count < cap:
                out[count] = i
            count += 1
    return count



def quantize_2bit(r: np.ndarray[Any, Any], grad: np.ndarray[Any, Any], t: np.float32,
                  out: np.ndarray[Any, Any]) -> None:
    """``r += grad``, MXNet's 2-bit codes of ``r`` into ``out`` (``(n + 3) // 4`` bytes), ``r`` keeps the rest."""
    _loop("_quantize_2bit")(r, grad, t, out)


def quantize_1bit(r: np.ndarray[Any, Any], grad: np.ndarray[Any, Any], t: np.float32,
                  out: np.ndarray[Any, Any]) -> None:
    """``r += grad``, MXNet 2.0's 1-bit codes of ``r`` into ``out`` (``(n + 7) // 8`` bytes), ``r`` keeps the rest."""
    _loop("_quantize_1bit")(r, grad, t, out)



_LOOPS = (_quantize_2bit, _quantize_1bit, _add_abs_sum, _scaled_sign, _f16_compress, _bf16_compress, _magnitude_at_least,
          _add_max_abs, _dither, _undither)
_compiled: dict[str, Any] = {}
_compiling = threading.Lock()
_warm = threading.Event()  # every loop compiled for the types pskv calls it with
_warming: list[threading.Thread] = []


def usable() -> bool:
    """Whether a value is compressed with the compiled loops now: Numba installed, :data:`ENABLED`, and
    the loops compiled.

    The first call starts importing Numba and compiling the loops on a thread of its own, and the
    NumPy path runs until they are ready (the same values, bit for bit). Importing and compiling
    take seconds on a loaded machine, on a cold cache; in a server that compresses its replies
    that would have been its network thread, whose heartbeats would stop (a job's
    ``PS_HEARTBEAT_TIMEOUT`` of 3 s was passed that way).
    """
    if not (AVAILABLE and ENABLED):
        return False
    if _warm.is_set():
        return True
    with _compiling:
        if not _warming:
            # not a daemon: a process that ends meanwhile waits for it (as it waited for the compiling before),
            # rather than leave a thread inside LLVM while the interpreter shuts down
            thread = threading.Thread(target=_warm_or_log, name="pskv-compile", daemon=False)
            _warming.append(thread)
            thread.start()
    return False


def _warm_or_log() -> None:
    try:
        warm()
    except Exception as exc:  # noqa: BLE001 - the NumPy path stays (the same values), said once
        logging.getLogger("pskv.compression").warning("Numba's loops did not compile (%s: %s); compressing "
                                                      "with NumPy", type(exc).__name__, exc)


def warm() -> None:
    """Import Numba and compile every loop for the types pskv passes, in this thread (waits for them)."""
    f32, grad, table = np.zeros(8, np.float32), np.ones(8, np.float32), np.zeros(1 << 16, np.float32)
    t = np.float32(0.5)
    quantize_2bit(f32.copy(), grad, t, np.zeros(2, np.uint8))
    quantize_1bit(f32.copy(), grad, t, np.zeros(1, np.uint8))
    for ef in (True, False):
        scaled_sign_compress(f32.copy(), grad, ef)
        f16_compress(f32.copy(), grad, ef, t, table)
        bf16_compress(f32.copy(), grad, ef, t)
        norm = add_max_abs(f32.copy(), grad, ef)
        dither(f32.copy(), ef, norm, 1, 2, np.zeros(8, np.float32), np.zeros(2, np.uint8))
    magnitude_at_least(grad, t, np.zeros(8, np.int64))
    readonly = np.zeros(2, np.uint8)
    readonly.flags.writeable = False  # a received payload (np.frombuffer of bytes): a type of its own to Numba
    for data in (np.zeros(2, np.uint8), readonly):
        undither(data, 8, 1, 2, t)
    _warm.set()


def _loop(name: str) -> Any:
    """The compiled loop ``name``; the first call in a process imports Numba and compiles every loop (cached on disk)."""
    loop = _compiled.get(name)
    if loop is None:
        with _compiling:
            if not _compiled:
                import numba  # optional and slow to import: only where a value is compressed

                jit = numba.njit(cache=True, nogil=True)
                _compiled.update({f.__name__: jit(f) for f in _LOOPS})
        loop = _compiled[name]
    return loop


def scaled_sign_compress(r: np.ndarray[Any, Any], grad: np.ndarray[Any, Any], ef: bool) -> np.ndarray[Any, Any]:
    """``onebit``'s payload of ``r + grad`` (with ``ef``: ``r`` becomes that, then keeps the rest; else ``r`` is
    the values, read only): the scale (mean ``|value|``) then the sign bits."""
    n = r.size
    scale = np.float32(_loop("_add_abs_sum")(r, grad, ef) / n) if n else np.float32(0)
    payload = np.empty(4 + (n + 7) // 8, np.uint8)
    payload[:4] = np.array([scale], "<f4").view(np.uint8)
    _loop("_scaled_sign")(r, scale, ef, payload[4:])
    return payload


def f16_compress(r: np.ndarray[Any, Any], grad: np.ndarray[Any, Any], ef: bool, limit: np.float32,
                 table: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``fp16``'s codes of ``r + grad`` saturated at ``limit`` (``table``: float32 of every code, for the residual)."""
    out = np.empty(r.size, "<u2")
    _loop("_f16_compress")(r, grad, ef, limit, table, out)
    return out


def bf16_compress(r: np.ndarray[Any, Any], grad: np.ndarray[Any, Any], ef: bool, limit: np.float32) -> np.ndarray[Any, Any]:
    """``bf16``'s codes of ``r + grad`` saturated at ``limit``."""
    out = np.empty(r.size, "<u2")
    _loop("_bf16_compress")(r, grad, ef, limit, out)
    return out


def magnitude_at_least(r: np.ndarray[Any, Any], floor: np.float32, out: np.ndarray[Any, Any]) -> int:
    """The indices of ``r`` with ``|r| >= floor``, in order, into ``out`` (as many as fit); their count."""
    return int(_loop("_magnitude_at_least")(r, floor, out))


def add_max_abs(r: np.ndarray[Any, Any], grad: np.ndarray[Any, Any], ef: bool) -> np.float32:
    """With ``ef``, ``r += grad``; then the largest ``|r|`` (NaN if one is NaN): dithering's ``max`` norm."""
    return np.float32(_loop("_add_max_abs")(r, grad, ef))


def dither(r: np.ndarray[Any, Any], ef: bool, norm: np.float32, s: int, bits: int,
           uniform: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> None:
    """Dithering's codes of ``r`` into ``out`` (with ``ef``, ``r`` keeps the rest): see :mod:`.sparsify`."""
    _loop("_dither")(r, ef, norm, s, bits, uniform, out)


def undither(data: np.ndarray[Any, Any], n: int, s: int, bits: int, norm: np.float32) -> np.ndarray[Any, Any] | None:
    """The ``n`` values of dithering codes ``data`` (after the norm), or None if a level is above ``s``."""
    out = np.empty(n, np.float32)
    return out if _loop("_undither")(data, n, s, bits, norm, out) else None
