"""``2bit`` and ``1bit`` on PyTorch tensors where they live (a CUDA device), value for value.

The ``device`` store sums a key's values on their device; compressing them through
NumPy would copy each one to the host and back. These functions do the quantizers'
arithmetic with torch operations on the tensors' own device — ``r += grad``, the codes,
the packing, ``r -= decoded`` — in float32 as MXNet's kernels, so payloads and
residuals equal the NumPy path's bit for bit (``tests/unit/test_compression.py`` checks
it on CPU tensors; on CUDA where a device is present).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pskv.compression.base import Compressor
from pskv.compression.quantize import OneBit, TwoBit

__all__ = ["compress", "decompress", "supports"]

_TABLES: dict[tuple[int, str], Any] = {}  # (id of a compressor's table, device) -> the table there


def supports(compressor: Compressor) -> bool:
    """Whether ``compressor`` runs on torch tensors here (MXNet's two quantizers)."""
    return isinstance(compressor, (TwoBit, OneBit))


def _bits(compressor: Compressor) -> int:
    return 2 if isinstance(compressor, TwoBit) else 1


def _table(compressor: Compressor, device: Any) -> Any:
    """The compressor's decoding table (per byte, its values) on ``device`` (made once)."""
    import torch
    key = (id(compressor._table), str(device))  # type: ignore[attr-defined]
    table = _TABLES.get(key)
    if table is None:
        table = _TABLES[key] = torch.from_numpy(compressor._table).to(device)  # type: ignore[attr-defined]
    return table


def compress(compressor: Compressor, grad: Any, residual: Any) -> Any:
    """The payload (a uint8 tensor on ``grad``'s device) of ``grad`` (float32, 1-D) with ``residual`` (updated)."""
    import torch
    r = residual
    r.add_(grad)
    t = torch.tensor(np.float32(compressor.threshold), device=r.device)  # type: ignore[attr-defined]
    bits = _bits(compressor)
    per = 8 // bits
    n = r.numel()
    nbytes = compressor.payload_bytes(n)
    codes = torch.zeros(nbytes * per, dtype=torch.uint8, device=r.device)
    if bits == 2:  # 11: +t, 10: -t, 00: 0
        codes[:n] = (r >= t).to(torch.uint8) * 3 | (r <= -t).to(torch.uint8) * 2
    else:  # 1: +1, 0: -1
        codes[:n] = (r > t).to(torch.uint8)
    blocks = codes.view(nbytes, per)
    payload = torch.zeros(nbytes, dtype=torch.uint8, device=r.device)
    for j in range(per):  # the first value in the high bits
        payload |= blocks[:, j] << (8 - bits * (j + 1))
    r.sub_(decompress(compressor, payload, n))  # r - t, r - (-t), r - 0 (2bit); r - 1, r - (-1) (1bit)
    return payload


def decompress(compressor: Compressor, payload: Any, n: int) -> Any:
    """The ``n`` float32 values (on ``payload``'s device) a payload stands for.

    Raises:
        InvalidArgumentError: the payload's length is not ``payload_bytes(n)``.
    """
    from pskv.errors import InvalidArgumentError
    if payload.numel() != compressor.payload_bytes(n):
        raise InvalidArgumentError(f"gradient compression {compressor.type!r}: a payload of {payload.numel()} "
                                   f"bytes for {n} elements (expected {compressor.payload_bytes(n)})")
    return _table(compressor, payload.device)[payload.long()].reshape(-1)[:n]
