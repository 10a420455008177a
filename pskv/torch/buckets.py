"""Gradient buckets: the all-reduces behind :class:`DistributedOptimizer` and :class:`DistributedDataParallel`.

The parameters are cut into buckets once, in the order their gradients are expected
(the reverse of the model's parameter order, roughly autograd's), each bucket of one
dtype and device and about ``cap_bytes`` (the first one smaller, so communication starts
early, as torch's DDP does). A bucket's small parameters (under ``FUSE_BYTES``, two or
more) share a flat buffer made once: their gradients are copied into it and travel as
**one key** (one part of the message, one sum on the servers) and the result is copied
back into each ``.grad`` (torch's DDP copies the same way); a bigger gradient travels as
itself, a key of its own in the bucket's one message (copying it would cost more than its
key). Every bucket's keys are declared at once, before the first step
(:meth:`~GradientBuckets.declare`). A caller marks a parameter :meth:`~GradientBuckets.ready`
when its gradient is final for the step (a gradient hook); a complete bucket is sent at
once as one asynchronous grouped all-reduce, **but only in bucket order**: a bucket
waits for the ones before it. So every rank issues the same
collectives in the same order whatever order its hooks fire in — the all-reduce store
requires it, and a parameter that got no gradient on one rank cannot make the ranks'
calls pair wrongly. :meth:`~GradientBuckets.launch_all` sends what is left at the end of
the step, a missing gradient as zeros (Horovod's rule: another rank may have computed
it); :meth:`~GradientBuckets.wait` waits for every bucket and writes the results into
the gradients.

Sparse gradients (``nn.Embedding(sparse=True)``) in a bucket travel dense (Horovod's
``sparse_as_dense``) and come back sparse with the same sparse dimensions (with
``sparse_as_dense=True``, or a sparse gradient nobody foresaw at the first step); otherwise
``DistributedOptimizer`` and ``DistributedDataParallel`` send them as rows
(:mod:`pskv.torch.sparse`). A compression (``Compression.fp16``) compresses what travels
(the gradient, or the flat buffer) and decompresses the result into the gradients; pskv's own
(``Compression.twobit()``, ...) is the bucket keys' on the store, declared with them (each worker
compresses its pushes with residuals, the servers sum the decoded pushes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from pskv.torch import ops

__all__ = ["DEFAULT_BUCKET_BYTES", "FIRST_BUCKET_BYTES", "FUSE_BYTES", "GradientBuckets", "Reduction"]

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024  # torch DDP's bucket_cap_mb=25
FIRST_BUCKET_BYTES = 1024 * 1024  # torch DDP's first bucket: the last layers' gradients leave early
FUSE_BYTES = 256 * 1024  # a smaller parameter's gradient is copied into its bucket's flat buffer


@dataclass(frozen=True)
class Reduction:
    """How a bucket is reduced: ``ops.grouped_allreduce_async_``'s arguments and the compression."""

    op: Any
    compression: Any
    prescale_factor: float = 1.0
    postscale_factor: float = 1.0


@dataclass
class _Bucket:
    name: str
    params: list[torch.Tensor]
    ready: int = 0  # parameters marked ready this step
    handle: int | None = None  # the all-reduce in flight
    ctxs: list[Any] = field(default_factory=list)  # the compression's, one per tensor sent
    fused: list[torch.Tensor] = field(default_factory=list)  # small parameters: their gradients travel in flat
    flat: torch.Tensor | None = None
    views: list[torch.Tensor] = field(default_factory=list)  # each fused parameter's part of ``flat``, in its shape
    whole: list[torch.Tensor] = field(default_factory=list)  # the others: each gradient travels as itself

    def fuse(self) -> None:
        """Give the bucket's small parameters (two or more) one flat buffer, made once."""
        small = [p for p in self.params if p.numel() * p.element_size() < FUSE_BYTES]
        if len(small) > 1:
            self.fused = small
            self.flat = torch.zeros(sum(p.numel() for p in small), dtype=small[0].dtype, device=small[0].device)
            self.views = [v.view(p.shape) for v, p in zip(self.flat.split([p.numel() for p in small]), small)]
        self.whole = [p for p in self.params if not any(p is q for q in self.fused)]

    def like(self) -> list[torch.Tensor]:
        """Zeros shaped as what the bucket sends (before compression): its key(s)."""
        whole = [torch.zeros(p.shape, dtype=p.dtype, device=p.device) for p in self.whole]
        return whole if self.flat is None else [torch.zeros_like(self.flat), *whole]


class GradientBuckets:
    """The buckets of one set of parameters (one optimizer's, one DDP module's).

    Args:
        named: ``(name, parameter)`` in the order their gradients are expected; the names
            are the same on every rank (they name the collectives).
        prefix: what every bucket's collective name starts with (one per optimizer / module).
        reduction: the reduce operation and the compression.
        cap_bytes, first_cap_bytes: the buckets' sizes (a parameter bigger than that is a
            bucket of its own; 0: every parameter its own bucket).
    """

    def __init__(self, named: Sequence[tuple[str, torch.Tensor]], prefix: str, reduction: Reduction,
                 cap_bytes: int = DEFAULT_BUCKET_BYTES, first_cap_bytes: int = FIRST_BUCKET_BYTES) -> None:
        self._reduction = reduction
        self._buckets = _cut(named, prefix, cap_bytes, first_cap_bytes)
        self._bucket_of = {p: b for b in self._buckets for p in b.params}
        self._next = 0  # the first bucket not sent yet this step

    def __contains__(self, param: torch.Tensor) -> bool:
        return param in self._bucket_of

    @property
    def names(self) -> list[str]:
        """Each bucket's collective name, in sending order."""
        return [b.name for b in self._buckets]

    @property
    def sent(self) -> int:
        """How many buckets were sent since the last :meth:`wait` (the first ones, in order)."""
        return self._next

    @property
    def pending(self) -> bool:
        """Whether a parameter was marked ready or a bucket sent since the last :meth:`wait`."""
        return self._next > 0 or any(b.ready for b in self._buckets)

    def declare(self, extra: Sequence[tuple[str, Sequence[torch.Tensor]]] = ()) -> None:
        """Declare every bucket's key (and the ``extra`` groups' keys) now, in one meeting of every rank.

        A collective. Otherwise each key is declared by its bucket's first all-reduce: a meeting
        while the buckets before it are still on their way, which a store with servers may see
        arrive after the meeting (a worker "ahead" of the other)."""
        compress = self._reduction.compression.compress
        how = self._reduction.compression
        ops.declare_groups([(b.name, [compress(t)[0] for t in b.like()], how) for b in self._buckets] + list(extra))

    def ready(self, param: torch.Tensor) -> None:
        """``param``'s gradient is final for this step; send every complete bucket that is next in order."""
        self._bucket_of[param].ready += 1
        buckets = self._buckets
        while self._next < len(buckets) and buckets[self._next].ready >= len(buckets[self._next].params):
            self._send(buckets[self._next])
            self._next += 1

    def launch_all(self) -> list[torch.Tensor]:
        """Send every bucket not sent yet, in order; the parameters whose missing gradient became zeros."""
        filled = []
        for bucket in self._buckets[self._next:]:
            for p in bucket.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p, memory_format=torch.preserve_format)
                    filled.append(p)
            self._send(bucket)
        self._next = len(self._buckets)
        return filled

    def wait(self) -> None:
        """Wait for every bucket sent; write each result into its gradient; start a new step.

        Raises:
            the first bucket's error (a collective's fails on every rank); the buckets after
            it are still waited for, so none writes into a gradient later.
        """
        sent, error = self._buckets[:self._next], None
        for bucket in sent:
            assert bucket.handle is not None  # every bucket before _next was sent
            try:
                decompress = self._reduction.compression.decompress
                results = [decompress(out, ctx) for out, ctx in zip(ops.synchronize(bucket.handle), bucket.ctxs)]
                if error is None:
                    _write_back(bucket, results)
            except Exception as exc:  # kept, raised once every bucket is waited for
                error = error or exc
        self.reset()
        if error is not None:
            raise error

    def reset(self) -> None:
        """Forget this step's ready marks and handles (after :meth:`wait`, or a state reload)."""
        for bucket in self._buckets:
            bucket.ready, bucket.handle, bucket.ctxs = 0, None, []
        self._next = 0

    def _send(self, bucket: _Bucket) -> None:
        tensors = [_dense(p, bucket.name).contiguous() for p in bucket.whole]
        if bucket.flat is not None:  # one copy of each small gradient, as torch's DDP copies into its bucket
            torch._foreach_copy_(bucket.views, [_dense(p, bucket.name) for p in bucket.fused])
            tensors.insert(0, bucket.flat)
        compress = self._reduction.compression.compress
        wires = []
        for t in tensors:
            wire, ctx = compress(t)
            wires.append(wire)
            bucket.ctxs.append(ctx)
        red = self._reduction
        bucket.handle = ops.grouped_allreduce_async_(wires, name=bucket.name, op=red.op,
                                                     prescale_factor=red.prescale_factor,
                                                     postscale_factor=red.postscale_factor,
                                                     compression=red.compression)


def _dense(param: torch.Tensor, name: str) -> torch.Tensor:
    grad = param.grad
    assert grad is not None, f"{name}: a parameter has no gradient"
    return grad.to_dense() if grad.is_sparse else grad


def _write_back(bucket: _Bucket, results: list[torch.Tensor]) -> None:
    """The bucket's reduced tensors (the flat buffer's first) into its parameters' gradients."""
    if bucket.flat is not None:
        flat, results = results[0], results[1:]
        if flat.data_ptr() != bucket.flat.data_ptr():
            bucket.flat.copy_(flat)
        grads, views = [], []
        for p, view in zip(bucket.fused, bucket.views):
            grad = p.grad
            assert grad is not None
            if grad.is_sparse:
                p.grad = view.to_sparse(grad.sparse_dim())
            else:
                grads.append(grad)
                views.append(view)
        if grads:
            torch._foreach_copy_(grads, views)
    for p, result in zip(bucket.whole, results):
        _write_one(p, result)


def _write_one(param: torch.Tensor, result: torch.Tensor) -> None:
    """The reduced ``result`` into ``param.grad`` (nothing to do where it was reduced in place)."""
    grad = param.grad
    assert grad is not None
    if grad.is_sparse:
        param.grad = result.to_sparse(grad.sparse_dim())
    elif result is not grad and (result.data_ptr() != grad.data_ptr() or result.dtype != grad.dtype):
        grad.copy_(result)


def _cut(named: Sequence[tuple[str, torch.Tensor]], prefix: str, cap: int, first_cap: int) -> list[_Bucket]:
    """Consecutive parameters of one dtype and device, up to ``cap`` bytes a bucket (``first_cap`` the first)."""
    buckets: list[_Bucket] = []
    size, kind = 0, None
    for name, p in named:
        nbytes = p.numel() * p.element_size()
        limit = min(first_cap, cap) if len(buckets) <= 1 else cap
        if not buckets or (p.dtype, p.device) != kind or size + nbytes > limit:
            buckets.append(_Bucket(f"{prefix}.{name}", []))
            size, kind = 0, (p.dtype, p.device)
        buckets[-1].params.append(p)
        size += nbytes
    for bucket in buckets:
        bucket.fuse()
    return buckets
