"""Every compressor's arithmetic in torch operations, on the tensors' own device.

The payloads are those the NumPy classes document (:mod:`pskv.compression.quantize`,
:mod:`~pskv.compression.sparsify`, :mod:`~pskv.compression.cast`), byte for byte: a
float32 or an index is written in the tensor's byte order, little-endian on every
platform torch runs CUDA on. :mod:`pskv.compression.ontorch` dispatches here; this
module imports torch, so it is imported only once a tensor is there to compress.

Each ``compress_*`` takes ``r``, what to compress (the residual itself, ``grad`` already
added, with error feedback; else ``grad``), and ``keep``, whether ``r`` is that residual
and must be left holding what the payload does not carry. Each ``decompress_*`` takes
the payload's bytes, their length already checked.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np
import torch

from pskv.compression.base import Compressor
from pskv.errors import InvalidArgumentError

__all__ = ["compress_bf16", "compress_dithering", "compress_fp16", "compress_onebit", "compress_quantized",
           "compress_randomk", "compress_topk", "decompress_bf16", "decompress_dithering", "decompress_fp16",
           "decompress_onebit", "decompress_quantized", "decompress_sparse"]

_F16_MAX = 65504.0
_BF16_MAX = float(np.array([0x7F7F0000], np.uint32).view(np.float32)[0])
_BF16_NAN = 0x7FC0


# -- per compressor and device: decoding tables and generators ------------------------------------
class _State:
    """What one compressor keeps per device: its decoding table, its generator (seeded by ``seed``)."""

    def __init__(self) -> None:
        self.tables: dict[str, torch.Tensor] = {}
        self.generators: dict[str, torch.Generator] = {}


_STATES: dict[int, _State] = {}  # id(compressor) -> its state, dropped with the compressor
_LOCK = threading.Lock()


def _state(compressor: Compressor) -> _State:
    state = _STATES.get(id(compressor))
    if state is None:
        with _LOCK:
            state = _STATES.get(id(compressor))
            if state is None:
                state = _STATES[id(compressor)] = _State()
                weakref.finalize(compressor, _STATES.pop, id(compressor), None)  # an id is reused after collection
    return state


def _generator(compressor: Compressor, device: torch.device) -> torch.Generator:
    """The compressor's generator on ``device``: seeded by its ``seed`` on first use, then advancing call after call."""
    generators = _state(compressor).generators
    with _LOCK:
        gen = generators.get(str(device))
        if gen is None:
            gen = generators[str(device)] = torch.Generator(device=device)
            gen.manual_seed(compressor.seed)  # type: ignore[attr-defined]
    return gen


# -- bits and bytes -------------------------------------------------------------------------------
def _pack(bits: torch.Tensor) -> torch.Tensor:
    """``bits`` (0/1, any integer or bool dtype) eight to a byte, the first in the high bit (``np.packbits``)."""
    m = bits.numel()
    padded = torch.zeros((m + 7) // 8 * 8, dtype=torch.uint8, device=bits.device)
    padded[:m] = bits
    blocks = padded.view(-1, 8)
    out = blocks[:, 0] << 7
    for j in range(1, 8):  # eight bit positions, each a whole-tensor operation
        out |= blocks[:, j] << (7 - j)
    return out


def _unpack(data: torch.Tensor, count: int) -> torch.Tensor:
    """The first ``count`` bits of ``data`` (uint8), the high bit of each byte first (``np.unpackbits``)."""
    shifts = torch.arange(7, -1, -1, dtype=torch.uint8, device=data.device)
    return ((data[:, None] >> shifts) & 1).reshape(-1)[:count]


def _pack_codes(codes: torch.Tensor, width: int) -> torch.Tensor:
    """``width``-bit codes one after another, each from its high bit, the first code in the first byte's high bits."""
    if 8 % width == 0:  # whole codes to a byte: OR them in place, ``8 // width`` positions
        per = 8 // width
        padded = torch.zeros((codes.numel() + per - 1) // per * per, dtype=torch.uint8, device=codes.device)
        padded[:codes.numel()] = codes
        blocks = padded.view(-1, per)
        out = blocks[:, 0] << (8 - width)
        for j in range(1, per):
            out |= blocks[:, j] << (8 - width * (j + 1))
        return out
    bits = torch.empty(codes.numel(), width, dtype=torch.uint8, device=codes.device)
    for j in range(width):  # a code's bits, its highest first
        bits[:, j] = (codes >> (width - 1 - j)) & 1
    return _pack(bits.reshape(-1))


def _unpack_codes(data: torch.Tensor, count: int, width: int) -> torch.Tensor:
    """``count`` codes of ``width`` bits (int32) packed by :func:`_pack_codes`."""
    if 8 % width == 0:  # whole codes in a byte: ``8 // width`` shifts of every byte
        shifts = torch.arange(8 - width, -1, -width, dtype=torch.uint8, device=data.device)
        return ((data[:, None] >> shifts) & ((1 << width) - 1)).reshape(-1)[:count].to(torch.int32)
    bits = _unpack(data, count * width).view(count, width)
    codes = bits[:, 0].to(torch.int32)
    for j in range(1, width):
        codes = (codes << 1) | bits[:, j]
    return codes


def _bytes_of(x: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes (uint8, 1-D)."""
    return x.contiguous().reshape(-1).view(torch.uint8)


def _read(data: torch.Tensor, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
    """``data[start:stop]`` (uint8) read as ``dtype`` values (copied where the slice is not aligned for them)."""
    part = data[start:stop]
    if part.storage_offset() % dtype.itemsize:
        part = part.clone()
    return part.view(dtype)


def _float_bytes(value: torch.Tensor) -> torch.Tensor:
    """A float32 scalar tensor's four bytes."""
    return _bytes_of(value.to(torch.float32).reshape(1))


# -- MXNet's 2bit and 1bit -------------------------------------------------------------------------
def _table(compressor: Compressor, device: torch.device) -> torch.Tensor:
    """The quantizer's decoding table (per byte, its values) on ``device`` (made once)."""
    tables = _state(compressor).tables
    table = tables.get(str(device))
    if table is None:
        table = tables[str(device)] = torch.from_numpy(compressor._table).to(device)  # type: ignore[attr-defined]
    return table


def compress_quantized(compressor: Compressor, bits: int, r: torch.Tensor, keep: bool) -> torch.Tensor:
    """``2bit`` (``bits`` 2: codes 11 for ``+t``, 10 for ``-t``, 00) or ``1bit`` (1: ``r > t``), in float32 as MXNet."""
    t = torch.tensor(np.float32(compressor.threshold), device=r.device)  # type: ignore[attr-defined]
    if bits == 2:
        payload = _pack_codes((r >= t).to(torch.uint8) * 3 | (r <= -t).to(torch.uint8) * 2, 2)
    else:
        payload = _pack(r > t)
    if keep:
        r.sub_(decompress_quantized(compressor, payload, r.numel()))  # r - t, r + t, r (2bit); r - 1, r + 1 (1bit)
    return payload


def decompress_quantized(compressor: Compressor, data: torch.Tensor, n: int) -> torch.Tensor:
    return _table(compressor, data.device)[data.long()].reshape(-1)[:n]


# -- BytePS's onebit, topk, randomk, dithering -----------------------------------------------------
def compress_onebit(compressor: Compressor, r: torch.Tensor, keep: bool) -> torch.Tensor:
    """``scale`` (the mean of ``|r|``, summed in float64 as NumPy's, then float32), then a bit a value: 1 for ``r < 0``."""
    n = r.numel()
    scale = (r.abs().sum(dtype=torch.float64) / n).to(torch.float32) if n else r.new_zeros(())
    negative = r < 0
    if keep:
        r.sub_(torch.where(negative, -scale, scale))
    return torch.cat([_float_bytes(scale), _pack(negative)])


def decompress_onebit(compressor: Compressor, data: torch.Tensor, n: int) -> torch.Tensor:
    scale = _read(data, 0, 4, torch.float32)[0]
    return torch.where(_unpack(data[4:], n).bool(), -scale, scale)


def _sparse_payload(r: torch.Tensor, index: torch.Tensor, keep: bool) -> torch.Tensor:
    """``index`` (any order) sorted, as uint32, then the values of ``r`` there; with ``keep`` they leave ``r``."""
    index = index.sort().values
    values = r[index]
    if keep:
        r[index] = 0  # what was sent, exactly; the rest stays
    low = _bytes_of(index.to(torch.int64)).view(-1, 8)[:, :4]  # uint32: an int64's four low bytes (little-endian)
    return torch.cat([low.reshape(-1), _bytes_of(values)])


def compress_topk(compressor: Compressor, r: torch.Tensor, keep: bool) -> torch.Tensor:
    """The ``k`` values of largest ``|r|`` (ties may pick other indices than NumPy's ``argpartition``)."""
    n = r.numel()
    k = compressor.count(n)  # type: ignore[attr-defined]
    index = torch.arange(n, device=r.device) if k >= n else torch.topk(r.abs(), k, sorted=False).indices
    return _sparse_payload(r, index, keep)


def compress_randomk(compressor: Compressor, r: torch.Tensor, keep: bool) -> torch.Tensor:
    """``k`` values at indices drawn by the compressor's generator on ``r``'s device (:func:`_choose`)."""
    n = r.numel()
    k = compressor.count(n)  # type: ignore[attr-defined]
    return _sparse_payload(r, _choose(n, k, _generator(compressor, r.device), r.device), keep)


def _choose(n: int, k: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """``k`` distinct indices below ``n``, every ``k``-subset equally likely.

    For ``k <= n / 4``: about ``1.5 k`` draws with replacement, their distinct values (a
    uniformly random set, by symmetry, given its size), then a random ``k`` of those —
    ``O(k log k)`` instead of permuting all ``n`` (4M elements on a CPU core: 240 ms).
    Otherwise, or if four tries left fewer than ``k`` distinct, a permutation's first ``k``.
    """
    if k and 4 * k <= n:
        m = k + k // 2 + 16
        for _ in range(4):
            drawn = torch.unique(torch.randint(n, (m,), generator=gen, device=device))
            if drawn.numel() >= k:
                return drawn[torch.randperm(drawn.numel(), generator=gen, device=device)[:k]]
            m *= 2
    return torch.randperm(n, generator=gen, device=device)[:k]


def decompress_sparse(compressor: Compressor, data: torch.Tensor, n: int) -> torch.Tensor:
    """``topk`` / ``randomk``: zeros but at the indices, checked (increasing, below ``n``) as the NumPy decoder does."""
    k = compressor.count(n)  # type: ignore[attr-defined]
    out = torch.zeros(n, dtype=torch.float32, device=data.device)
    if not k:
        return out
    low = data[:4 * k].view(k, 4).to(torch.int64)
    index = low[:, 0] | (low[:, 1] << 8) | (low[:, 2] << 16) | (low[:, 3] << 24)
    if bool((index[-1] >= n) | (index[1:] <= index[:-1]).any()):
        raise InvalidArgumentError(f"gradient compression {compressor.type!r}: the indices of a payload of {n} "
                                   f"elements must increase and stay below {n}")
    out[index] = _read(data, 4 * k, 8 * k, torch.float32)
    return out


def compress_dithering(compressor: Compressor, r: torch.Tensor, keep: bool) -> torch.Tensor:
    """``norm``, then per value its sign and a level in ``0..s``, rounded up with the probability of its fraction."""
    s, width = compressor.s, compressor.bits  # type: ignore[attr-defined]
    n = r.numel()
    magnitude = r.abs()
    if not n:
        norm = r.new_zeros(())
    elif compressor.norm == "max":  # type: ignore[attr-defined]
        norm = magnitude.max()
    else:
        r64 = r.to(torch.float64)
        norm = torch.sqrt(torch.dot(r64, r64)).to(torch.float32)
    scaled = torch.where(norm > 0, magnitude / norm * s, 0.0)  # float32: |r| / norm, then times s, as NumPy
    level = torch.floor(scaled)
    draws = torch.rand(n, generator=_generator(compressor, r.device), device=r.device, dtype=torch.float32)
    level += draws < scaled - level
    level = torch.clamp(level, max=s).to(torch.int32)
    negative = r < 0
    payload = torch.cat([_float_bytes(norm), _pack_codes((negative.to(torch.int32) << (width - 1)) | level, width)])
    if keep:
        r.sub_(_levels(compressor, negative, level, norm))
    return payload


def _levels(compressor: Compressor, negative: torch.Tensor, level: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    step = norm / compressor.s  # type: ignore[attr-defined]  # float32 / float32(s), as NumPy
    values = level.to(torch.float32) * step
    return torch.where(negative, -values, values)


def decompress_dithering(compressor: Compressor, data: torch.Tensor, n: int) -> torch.Tensor:
    """Signs and levels; a level above ``s`` is refused as the NumPy decoder does."""
    s, width = compressor.s, compressor.bits  # type: ignore[attr-defined]
    codes = _unpack_codes(data[4:], n, width)
    level = codes & ((1 << (width - 1)) - 1)
    if n and bool(level.max() > s):
        raise InvalidArgumentError(f"gradient compression {compressor.type!r}: a payload of {n} elements with a level "
                                   f"above s={s}")
    return _levels(compressor, (codes >> (width - 1)).bool(), level, _read(data, 0, 4, torch.float32)[0])


# -- fp16 and bf16 ---------------------------------------------------------------------------------
def compress_fp16(compressor: Compressor, r: torch.Tensor, keep: bool) -> torch.Tensor:
    """IEEE half (torch's cast: round to nearest even, as NumPy's), saturating at ``±65504``."""
    payload = _bytes_of(torch.clamp(r, -_F16_MAX, _F16_MAX).to(torch.float16))
    if keep:
        r.sub_(decompress_fp16(compressor, payload, r.numel()))
    return payload


def decompress_fp16(compressor: Compressor, data: torch.Tensor, n: int) -> torch.Tensor:
    return _read(data, 0, 2 * n, torch.float16).to(torch.float32)


def compress_bf16(compressor: Compressor, r: torch.Tensor, keep: bool) -> torch.Tensor:
    """cast.py's integer rounding (the bits plus ``0x7fff`` plus the lowest kept bit), in int32; NaN as ``0x7fc0``.

    In int32 the sum cannot overflow where it matters: a clamped value's bits are at most
    ``0x7f7f0000`` (positive) or negative as int32, and the high 16 bits of the
    two's-complement sum are those of cast.py's uint32 sum. NaNs are replaced.
    """
    bits = torch.clamp(r, -_BF16_MAX, _BF16_MAX).view(torch.int32)
    rounded = ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).to(torch.int16)  # int16: the low 16 bits kept
    payload = _bytes_of(torch.where(torch.isnan(r), torch.tensor(_BF16_NAN, dtype=torch.int16, device=r.device),
                                    rounded))
    if keep:
        r.sub_(decompress_bf16(compressor, payload, r.numel()))
    return payload


def decompress_bf16(compressor: Compressor, data: torch.Tensor, n: int) -> torch.Tensor:
    """Each value's two bytes as a float32's high half (its low half zero)."""
    words = torch.zeros(n, 4, dtype=torch.uint8, device=data.device)
    words[:, 2:] = data.view(n, 2)  # little-endian: the high half in bytes 2 and 3
    return words.view(torch.float32).reshape(-1)
