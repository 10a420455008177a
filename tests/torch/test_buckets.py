"""``pskv.torch.buckets`` in one process, its collectives recorded by a stand-in for ``pskv.torch.ops``:
buckets cut by size and dtype, sent in bucket order whatever order gradients come in, missing
gradients sent as zeros, sparse gradients sent dense and returned sparse, compressed ones
decompressed into the gradient, a bucket's small gradients sent as one flat tensor and copied
back. The same wrapper on a job of one process sets no hook.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pskv.torch import buckets  # noqa: E402  (after the skip: torch is optional)
from pskv.torch.buckets import GradientBuckets, Reduction  # noqa: E402
from pskv.torch.compression import Compression  # noqa: E402
from pskv.torch.ops import Average  # noqa: E402


class RecordingOps:
    """Sends nothing: records each grouped all-reduce and 'averages' by adding 1 to every element."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[Any]]] = []

    def grouped_allreduce_async_(self, tensors: list[Any], name: str, op: Any, prescale_factor: float,
                                 postscale_factor: float, compression: Any = None) -> int:
        self.sent.append((name, list(tensors)))
        return len(self.sent) - 1

    def synchronize(self, handle: int) -> list[Any]:
        return [t.add_(1) for t in self.sent[handle][1]]


@pytest.fixture
def ops(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingOps]:
    recording = RecordingOps()
    monkeypatch.setattr(buckets, "ops", recording)
    yield recording


def params(*shapes: tuple[int, ...], dtype: Any = None) -> list[Any]:
    return [torch.zeros(shape, dtype=dtype or torch.float32, requires_grad=True) for shape in shapes]


def test_buckets_are_cut_by_size_and_dtype() -> None:
    a, b, c = params((4,), (4,), (4,))
    d, = params((2,), dtype=torch.float64)
    cut = GradientBuckets([("a", a), ("b", b), ("c", c), ("d", d)], "p", Reduction(Average, Compression.none),
                          cap_bytes=32, first_cap_bytes=16)
    assert cut.names == ["p.a", "p.b", "p.d"]  # first bucket 16 bytes (a), then 32 (b, c), then another dtype


def test_buckets_go_in_order_whatever_order_gradients_come_in(ops: RecordingOps) -> None:
    c, b, a = params((2,), (2,), (2,))
    cut = GradientBuckets([("c", c), ("b", b), ("a", a)], "p", Reduction(Average, Compression.none),
                          cap_bytes=8, first_cap_bytes=8)
    for p in (a, b, c):
        p.grad = torch.ones(2)
    cut.ready(a)
    assert ops.sent == [] and cut.pending
    cut.ready(c)
    assert [name for name, _ in ops.sent] == ["p.c"]
    cut.ready(b)
    assert [name for name, _ in ops.sent] == ["p.c", "p.b", "p.a"]
    assert ops.sent[2][1][0] is a.grad  # dense, uncompressed: reduced in place
    cut.launch_all()
    cut.wait()
    assert all(p.grad.tolist() == [2.0, 2.0] for p in (a, b, c)) and not cut.pending


def test_a_missing_gradient_is_sent_as_zeros(ops: RecordingOps) -> None:
    a, b = params((3,), (3,))
    cut = GradientBuckets([("a", a), ("b", b)], "p", Reduction(Average, Compression.none))
    a.grad = torch.ones(3)
    cut.ready(a)
    assert ops.sent == []  # b's gradient holds the bucket
    assert cut.launch_all() == [b]
    cut.wait()
    assert a.grad.tolist() == [2.0] * 3 and b.grad.tolist() == [1.0] * 3


def test_sparse_gradients_travel_dense_and_come_back_sparse(ops: RecordingOps) -> None:
    table = torch.nn.Embedding(5, 2, sparse=True)
    table(torch.tensor([1, 3])).sum().backward()
    cut = GradientBuckets([("w", table.weight)], "p", Reduction(Average, Compression.none))
    cut.ready(table.weight)
    assert not ops.sent[0][1][0].is_sparse
    cut.wait()
    grad = table.weight.grad
    assert grad is not None and grad.is_sparse and grad.sparse_dim() == 1
    assert grad.to_dense().tolist() == [[1.0, 1.0], [2.0, 2.0], [1.0, 1.0], [2.0, 2.0], [1.0, 1.0]]


def test_compressed_gradients_are_decompressed_into_the_gradient(ops: RecordingOps) -> None:
    w, = params((3,))
    w.grad = torch.full((3,), 0.5)
    grad = w.grad
    cut = GradientBuckets([("w", w)], "p", Reduction(Average, Compression.fp16))
    cut.ready(w)
    assert ops.sent[0][1][0].dtype == torch.float16
    cut.wait()
    assert w.grad is grad and w.grad.dtype == torch.float32 and w.grad.tolist() == [1.5] * 3


def test_one_process_sets_no_hook_and_steps_as_the_optimizer() -> None:
    import pskv.torch as hvd

    hvd.init("horovod")  # no launcher: a group of one
    try:
        model = torch.nn.Linear(3, 1)
        inner = torch.optim.SGD(model.parameters(), lr=0.5)
        opt = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters())
        assert isinstance(opt, torch.optim.SGD) and opt.state is inner.state
        before = model.weight.detach().clone()
        model(torch.ones(2, 3)).sum().backward()
        opt.step()
        assert torch.allclose(model.weight.detach(), before - 0.5 * 2.0)
        ddp = hvd.DistributedDataParallel(model)
        ddp(torch.ones(2, 3)).sum().backward()
        assert model.weight.grad is not None
    finally:
        hvd.shutdown()


def test_a_failed_bucket_is_raised_after_every_bucket_was_waited_for(ops: RecordingOps,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = params((2,), (2,))
    cut = GradientBuckets([("a", a), ("b", b)], "p", Reduction(Average, Compression.none), cap_bytes=8,
                          first_cap_bytes=8)
    a.grad, b.grad = torch.ones(2), torch.ones(2)
    cut.launch_all()
    waited = []

    def synchronize(handle: int) -> list[Any]:
        waited.append(handle)
        if handle == 0:
            raise TimeoutError("bucket p.a")
        return RecordingOps.synchronize(ops, handle)

    monkeypatch.setattr(ops, "synchronize", synchronize)
    with pytest.raises(TimeoutError, match="bucket p.a"):
        cut.wait()
    assert waited == [0, 1] and not cut.pending


def test_a_bucket_of_several_parameters_travels_as_one_flat_tensor(ops: RecordingOps) -> None:
    a, b = params((2, 2), (3,))
    a_grad = torch.ones(2, 2)
    a.grad, b.grad = a_grad, torch.full((3,), 2.0)
    cut = GradientBuckets([("a", a), ("b", b)], "p", Reduction(Average, Compression.none))
    cut.ready(a)
    cut.ready(b)
    (name, sent), = ops.sent
    assert name == "p.a" and len(sent) == 1 and sent[0].tolist() == [1.0] * 4 + [2.0] * 3  # one key, one copy
    cut.wait()
    assert a.grad is a_grad and a.grad.tolist() == [[2.0, 2.0], [2.0, 2.0]] and b.grad.tolist() == [3.0] * 3


def test_a_flat_bucket_compresses_once_and_brings_sparse_gradients_back_sparse(ops: RecordingOps) -> None:
    table = torch.nn.Embedding(3, 2, sparse=True)
    table(torch.tensor([1])).sum().backward()
    w, = params((2,))
    w.grad = torch.full((2,), 0.5)
    cut = GradientBuckets([("t", table.weight), ("w", w)], "p", Reduction(Average, Compression.fp16))
    cut.launch_all()
    assert [t.dtype for t in ops.sent[0][1]] == [torch.float16]
    cut.wait()
    grad = table.weight.grad
    assert grad is not None and grad.is_sparse and grad.to_dense().tolist() == [[1.0, 1.0], [2.0, 2.0], [1.0, 1.0]]
    assert w.grad.dtype == torch.float32 and w.grad.tolist() == [1.5, 1.5]
