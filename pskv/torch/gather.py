"""Bytes between ranks on a store that only sums and broadcasts: ``allgather`` and object transport.

pskv's stores offer ``pushpull`` (a sum) and ``broadcast``. An all-gather is a sum in
which each rank fills only its own segment of a zeroed buffer: ``x + 0 + ... + 0 == x``
exactly in integer arithmetic, so the bytes travel as int32 words (padded to 4 bytes).
Buffers are rounded up to a power of two of words so that a store with servers reuses
a few keys per name instead of one per length. Lengths travel first (a small sum), and a
rank's header also carries a checksum of what must agree (a tensor's dtype and trailing
shape): every rank sees every header, so a disagreement fails on every rank alike.
"""

from __future__ import annotations

import zlib
from typing import Any

import torch

from pskv.errors import InvalidArgumentError
from pskv.torch import ops
from pskv.torch.runtime import current

__all__ = ["allgather", "allgather_bytes", "broadcast_bytes", "MAX_BYTES"]

#: The most bytes one rank may send in one ``broadcast_bytes`` / ``allgather_bytes`` call.
MAX_BYTES = 1 << 30

_MIN_WORDS = 16


def _words(n_bytes: int) -> int:
    """int32 words for ``n_bytes``, rounded up to a power of two (at least :data:`_MIN_WORDS`)."""
    words = max(_MIN_WORDS, -(-n_bytes // 4))
    return 1 << (words - 1).bit_length()


def _as_bytes(data: bytes | torch.Tensor) -> torch.Tensor:
    if isinstance(data, torch.Tensor):
        return data.detach().reshape(-1).contiguous().view(torch.uint8).cpu()
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


def allgather_bytes(data: bytes | torch.Tensor, name: str, agree: int = 0) -> list[bytes]:
    """Every rank's ``data``, in rank order, on every rank (a collective of two sums).

    Args:
        data: this rank's bytes (a tensor: its memory).
        name: the name of the call (its keys: ``<name>.sizes``, ``<name>.data.<words>``).
        agree: a number every rank must give alike (e.g. a checksum of a dtype and shape).

    Raises:
        InvalidArgumentError: some rank's data is over :data:`MAX_BYTES` (or its length is negative:
            a broken header), or ranks gave different ``agree`` (on every rank alike).
    """
    job = current()
    size, rank = job.store.num_workers, job.store.rank
    payload = _as_bytes(data)
    header = torch.zeros(size, 2, dtype=torch.int64)
    header[rank, 0], header[rank, 1] = payload.numel(), agree
    ops.allreduce_(header, name=f"{name}.sizes", op=ops.Sum)
    lengths = [int(n) for n in header[:, 0]]
    if max(lengths) > MAX_BYTES or min(lengths) < 0 or len({int(a) for a in header[:, 1]}) > 1:
        raise InvalidArgumentError(f"allgather {name!r}: the ranks' lengths {lengths} (at most {MAX_BYTES}) or "
                                   f"their dtypes and shapes {[int(a) for a in header[:, 1]]} do not agree")
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + -(-n // 4) * 4)
    buffer = torch.zeros(_words(starts[-1]), dtype=torch.int32)
    as_bytes = buffer.view(torch.uint8)
    as_bytes[starts[rank]:starts[rank] + payload.numel()] = payload
    ops.allreduce_(buffer, name=f"{name}.data.{buffer.numel()}", op=ops.Sum)
    return [as_bytes[s:s + n].numpy().tobytes() for s, n in zip(starts, lengths)]


def broadcast_bytes(data: bytes | None, root_rank: int, name: str) -> bytes:
    """Rank ``root_rank``'s ``data`` on every rank (the others pass None; a collective of two broadcasts).

    Raises:
        InvalidArgumentError: the root's data is over :data:`MAX_BYTES` (on every rank alike).
    """
    job = current()
    is_root = job.store.rank == root_rank
    payload = _as_bytes(data or b"") if is_root else torch.empty(0, dtype=torch.uint8)
    length = torch.tensor([payload.numel() if payload.numel() <= MAX_BYTES else -1], dtype=torch.int64)
    ops.broadcast_(length, root_rank, name=f"{name}.sz")
    n = int(length[0])
    if n < 0:
        raise InvalidArgumentError(f"broadcast {name!r}: rank {root_rank}'s object is over {MAX_BYTES} bytes")
    buffer = torch.zeros(_words(n), dtype=torch.int32)
    if is_root:
        buffer.view(torch.uint8)[:n] = payload
    ops.broadcast_(buffer, root_rank, name=f"{name}.t.{buffer.numel()}")
    return buffer.view(torch.uint8)[:n].numpy().tobytes()


class _Allgather(torch.autograd.Function):
    """The rows of every rank; the gradient of this rank's rows is the output's gradient averaged over
    the ranks, at those rows (Horovod's and BytePS's rule)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None) -> torch.Tensor:
        trailing = tuple(tensor.shape[1:])
        agree = zlib.crc32(f"{tensor.dtype}{trailing}".encode())
        parts = allgather_bytes(tensor, f"allgather.{name or 'noname'}", agree)  # one call at a time: keys reused
        rows = [torch.frombuffer(bytearray(p), dtype=tensor.dtype).reshape(-1, *trailing) if p
                else torch.empty(0, *trailing, dtype=tensor.dtype) for p in parts]
        rank = current().store.rank
        ctx.mine = (sum(len(r) for r in rows[:rank]), len(rows[rank]))
        ctx.grad_name = None if name is None else f"allgather.{name}.grad"
        return torch.cat(rows).to(tensor.device)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        start, count = ctx.mine
        averaged = ops.allreduce(grads[0].contiguous(), name=ctx.grad_name, op=ops.Average)
        return averaged.narrow(0, start, count), None


def allgather(tensor: torch.Tensor, name: str | None = None, *, output: torch.Tensor | None = None,
              same_shape: bool = True) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along the first dimension (Horovod's ``allgather``).

    The first dimension may differ between ranks; the dtype and the other dimensions must not
    (else every rank raises InvalidArgumentError). Differentiable: the gradient of ``tensor`` is
    the output's gradient averaged over the ranks, at this rank's rows. BytePS's keywords:
    ``output`` is filled and returned (not differentiable); ``same_shape`` is accepted and
    ignored (the first dimensions are always exchanged).
    """
    if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
        raise InvalidArgumentError("allgather takes a torch.Tensor of at least one dimension")
    result: torch.Tensor = _Allgather.apply(tensor, name)
    if output is None:
        return result
    with torch.no_grad():
        return output.copy_(result)
