"""The 2-rank job of tests/torch/test_api.py: every case on ``import pskv.torch as hvd``, one JSON per rank.

Run by ``pskv launch -n 2 -s S -- python job_api.py OUTDIR``; each case records "ok" or its error.
Ported from the semantics (no code copied) of horovod/horovod ``test/parallel/test_torch.py``;
the case names keep Horovod's test names.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import torch

import pskv
import pskv.torch as hvd
from tests.torch.cases import Cases

cases = Cases()
case, results = cases.later, cases.results  # run after hvd.init(), at the end
FLOATS = [torch.float32, torch.float64]
NUMBERS = [torch.int32, torch.int64, torch.float16, torch.float32, torch.float64]


def grid(dtypes: list[torch.dtype], dims: tuple[int, ...] = (1, 3)) -> Any:
    """Horovod's grid (narrowed to 1 and 3 dims): each dtype, dims of 17, values random in [-100, 100) (the same on every rank)."""
    for dtype, dim in itertools.product(dtypes, dims):
        torch.manual_seed(1234)
        yield f"{str(dtype)[6:]}.{dim}", torch.empty(*([17] * dim)).random_(-100, 100).to(dtype)


def fails_everywhere(call: Callable[[], Any], *expected: type[BaseException]) -> str:
    """The call fails on this rank, with one of ``expected``, within 20 s; the error's class name."""
    began = time.monotonic()
    try:
        call()
    except expected as exc:
        assert time.monotonic() - began < 20, f"not at once: {time.monotonic() - began:.1f} s"
        return type(exc).__name__
    raise AssertionError("the call did not fail")


@case
def test_horovod_rank_size() -> None:
    assert (hvd.size(), hvd.local_size(), hvd.is_initialized()) == (2, 2, True)
    assert hvd.rank() == hvd.local_rank() and hvd.cross_size() == 1 and hvd.cross_rank() == 0


@case
def test_horovod_reinit() -> None:
    before = hvd.store().type
    hvd.allreduce(torch.ones(2), name="reinit")
    hvd.shutdown()
    assert not hvd.is_initialized()
    hvd.init()  # with servers: the same worker again (it cannot join twice); else a new all-reduce store
    assert hvd.store().type == before and hvd.allreduce(torch.ones(2), name="reinit").tolist() == [1.0, 1.0]
    hvd.shutdown()
    hvd.init()  # every name is new again after a re-init (with servers: key "allreduce.reinit@G"), so any size goes
    assert hvd.allreduce(torch.ones(3), name="reinit").tolist() == [1.0, 1.0, 1.0]


@case
def test_horovod_allreduce() -> None:
    for where, tensor in grid(NUMBERS):
        summed = hvd.allreduce(tensor, average=False, name=f"sum.{where}")
        assert torch.equal(summed, tensor * hvd.size()), where
        assert torch.equal(hvd.allreduce(tensor, op=hvd.Sum), summed), where  # unnamed: numbered in call order


@case
def test_horovod_allreduce_average() -> None:
    for where, tensor in grid(NUMBERS):
        averaged = hvd.allreduce(tensor, op=hvd.Average, name=f"avg.{where}")
        assert torch.equal(averaged, tensor), where
    # integers: the sum scaled by 1/size in float64, truncated toward zero (Horovod's C++)
    odd = torch.tensor([hvd.rank() * 2 + 1, -3 - hvd.rank() * 2], dtype=torch.int64)  # sums 4, -8 over 2 ranks
    assert hvd.allreduce(odd).tolist() == [2, -4]
    assert hvd.allreduce(torch.tensor([1, -1], dtype=torch.int32) * (hvd.rank() + 2)).tolist() == [2, -2]  # 5/2, -5/2


@case
def test_horovod_allreduce_inplace() -> None:
    for where, tensor in grid(NUMBERS):
        expected = tensor * hvd.size()
        returned = hvd.allreduce_(tensor, op=hvd.Sum, name=f"inplace.{where}")
        assert returned is tensor and torch.equal(tensor, expected), where


@case
def test_horovod_allreduce_async_fused() -> None:
    pending = []
    for where, tensor in grid(NUMBERS):
        pending.append((where, tensor, hvd.allreduce_async(tensor, op=hvd.Sum, name=f"async.{where}")))
    for where, tensor, handle in pending:
        summed = hvd.synchronize(handle)
        assert torch.equal(summed, tensor * hvd.size()), where
    handle = hvd.allreduce_async_(torch.ones(1000), name="async.poll")
    while not hvd.poll(handle):
        time.sleep(0.001)
    assert torch.equal(hvd.synchronize(handle), torch.ones(1000))
    assert hvd.synchronize(handle) is None  # Horovod: an unknown handle gives None


@case
def test_horovod_allreduce_prescale_postscale() -> None:
    factor = 0.37
    for where, tensor in grid([torch.int32, torch.int64, torch.float16, torch.float32, torch.float64]):
        pre = hvd.allreduce(tensor, op=hvd.Sum, prescale_factor=factor, name=f"pre.{where}")
        work = tensor.double() if not tensor.dtype.is_floating_point else tensor.float()
        scaled = (work * factor)
        scaled = (scaled.trunc() if not tensor.dtype.is_floating_point else scaled).to(tensor.dtype)
        assert torch.allclose(pre.double(), scaled.double() * hvd.size(), atol=0.05 if tensor.dtype == torch.float16 else 0), where
        post = hvd.allreduce(tensor, op=hvd.Sum, postscale_factor=factor, name=f"post.{where}")
        summed = (tensor.double() if not tensor.dtype.is_floating_point else tensor.float()) * hvd.size() * factor
        summed = (summed.trunc() if not tensor.dtype.is_floating_point else summed).to(tensor.dtype)
        assert torch.allclose(post.double(), summed.double(), atol=0.2 if tensor.dtype == torch.float16 else 0), where


@case
def test_horovod_grouped_allreduce() -> None:
    for where, tensor in grid(FLOATS + [torch.int64]):
        tensors = [tensor + i for i in range(5)]
        summed = hvd.grouped_allreduce(tensors, op=hvd.Sum, name=f"grouped.{where}")
        assert all(torch.equal(s, t * hvd.size()) for s, t in zip(summed, tensors)), where
        averaged = hvd.grouped_allreduce(tensors, name=f"grouped.avg.{where}")
        assert all(torch.equal(a, t) for a, t in zip(averaged, tensors)), where
        returned = hvd.grouped_allreduce_(tensors, op=hvd.Sum, name=f"grouped.inplace.{where}")
        assert all(r is t and torch.equal(r, (tensor + i) * hvd.size()) for i, (r, t) in enumerate(zip(returned, tensors)))
    handle = hvd.grouped_allreduce_async_([torch.ones(3), torch.ones(2, dtype=torch.int32)], op=hvd.Sum)
    assert [t.tolist() for t in hvd.synchronize(handle)] == [[2.0] * 3, [2] * 2]


@case
def test_horovod_allreduce_grad() -> None:
    for where, tensor in grid(FLOATS, (1, 3)):
        tensor.requires_grad_()
        summed = hvd.allreduce(tensor, op=hvd.Sum, name=f"grad.{where}")
        summed.backward(torch.ones_like(summed))
        assert torch.equal(tensor.grad, torch.ones_like(tensor) * hvd.size()), where


@case
def test_horovod_allreduce_error() -> None:
    shape = [17] * 3
    shape[1] = 10 * (hvd.rank() + 1)
    results["allreduce_error"] = fails_everywhere(lambda: hvd.allreduce(torch.ones(shape)),
                                                  pskv.InitMismatchError, pskv.CollectiveMismatchError)


@case
def test_horovod_allreduce_type_error() -> None:
    dtype = torch.int32 if hvd.rank() % 2 == 0 else torch.float32
    results["allreduce_type_error"] = fails_everywhere(lambda: hvd.allreduce(torch.ones(17, 17, dtype=dtype)),
                                                       pskv.InitMismatchError, pskv.CollectiveMismatchError)


@case
def test_name_reused_with_another_shape_of_the_same_size() -> None:
    # on a store with servers: the same key viewed in the declared shape (Horovod reuses names freely)
    assert torch.equal(hvd.allreduce(torch.ones(2, 2), name="reshaped"), torch.ones(2, 2))
    assert torch.equal(hvd.allreduce(torch.ones(4, 1), name="reshaped", op=hvd.Sum), torch.full((4, 1), 2.0))


@case
def test_names_that_differ_at_first_use_fail_on_every_rank() -> None:
    name = "left" if hvd.rank() == 0 else "right"
    results["name_error"] = fails_everywhere(lambda: hvd.allreduce(torch.ones(3), name=name),
                                             pskv.InvalidArgumentError, pskv.CollectiveMismatchError)
    assert torch.equal(hvd.allreduce(torch.ones(3), name="after.names"), torch.ones(3))


@case  # the job goes on after it: a refused round changes nothing and counts alike on every rank
def test_name_reused_with_another_size_fails_on_every_rank() -> None:
    hvd.allreduce(torch.ones(4), name="reused")
    bigger = torch.ones(5 if hvd.rank() == 1 else 4)
    results["reuse_error"] = fails_everywhere(lambda: hvd.allreduce(bigger, name="reused"),
                                              pskv.KVStoreError)
    summed = hvd.allreduce(torch.full((4,), hvd.rank() + 1.0), name="reused", op=hvd.Sum)
    assert torch.equal(summed, torch.full((4,), 3.0)), summed


@case
def test_not_offered() -> None:
    for call in (lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum), lambda: hvd.alltoall(torch.ones(2)),
                 lambda: hvd.reducescatter(torch.ones(2))):
        try:
            call()
        except pskv.NotSupportedError:
            continue
        raise AssertionError("not refused")


@case
def test_horovod_broadcast() -> None:
    for (where, tensor), root in itertools.product(grid(NUMBERS), range(hvd.size())):
        mine, roots = tensor * hvd.rank(), tensor * root
        got = hvd.broadcast(mine, root, name=f"bcast.{where}.{root}")
        assert torch.equal(got, roots) and torch.equal(mine, tensor * hvd.rank()), (where, root)


@case
def test_horovod_broadcast_inplace() -> None:
    for (where, tensor), root in itertools.product(grid(NUMBERS), range(hvd.size())):
        mine = tensor * hvd.rank()
        got = hvd.broadcast_(mine, root, name=f"bcast_.{where}.{root}")
        assert got is mine and torch.equal(mine, tensor * root), (where, root)
    handles = [hvd.broadcast_async_(torch.full((3,), float(hvd.rank())), 1) for _ in range(3)]
    assert all(hvd.synchronize(h).tolist() == [1.0] * 3 for h in handles)
    assert hvd.synchronize(hvd.broadcast_async(torch.full((2,), hvd.rank() + 5), 0)).tolist() == [5, 5]


@case
def test_horovod_broadcast_grad() -> None:
    tensor = torch.ones(5, requires_grad=True)
    out = hvd.broadcast(tensor, 0)
    out.backward(torch.ones(5) * 2)
    assert torch.equal(tensor.grad, torch.full((5,), 2.0 if hvd.rank() == 0 else 0.0))


@case
def test_horovod_broadcast_error() -> None:
    shape = [17] * 3
    shape[1] = 10 * (hvd.rank() + 1)
    results["broadcast_error"] = fails_everywhere(lambda: hvd.broadcast(torch.ones(shape), 0),
                                                  pskv.InitMismatchError, pskv.CollectiveMismatchError)


@case
def test_horovod_broadcast_type_error() -> None:
    dtype = torch.int32 if hvd.rank() % 2 == 0 else torch.float32
    results["broadcast_type_error"] = fails_everywhere(lambda: hvd.broadcast(torch.ones(17, dtype=dtype), 0),
                                                       pskv.InitMismatchError, pskv.CollectiveMismatchError)


@case
def test_horovod_broadcast_rank_error() -> None:
    results["broadcast_rank_error"] = fails_everywhere(lambda: hvd.broadcast(torch.ones(17), hvd.rank()),
                                                       pskv.InitMismatchError, pskv.CollectiveMismatchError)


@case
def test_broadcast_name_reused_with_another_size_fails_on_every_rank() -> None:
    hvd.broadcast(torch.ones(4), 0, name="breused")
    results["broadcast_reuse_error"] = fails_everywhere(
        lambda: hvd.broadcast(torch.ones(5 if hvd.rank() == 1 else 4), 0, name="breused"), pskv.KVStoreError)
    assert torch.equal(hvd.broadcast(torch.full((4,), hvd.rank() + 1.0), 1, name="breused"), torch.full((4,), 2.0))


@case
def test_horovod_allgather_variable_size() -> None:
    tensor = torch.arange((hvd.rank() + 1) * 3, dtype=torch.float64).reshape(-1, 3) + 100 * hvd.rank()
    gathered = hvd.allgather(tensor)
    assert gathered.shape == (3, 3) and torch.equal(gathered[1:], torch.arange(6.0).reshape(2, 3).double() + 100)
    assert torch.equal(gathered[:1], torch.arange(3.0).reshape(1, 3).double())
    results["allgather_type_error"] = fails_everywhere(
        lambda: hvd.allgather(torch.ones(2, dtype=torch.int32 if hvd.rank() else torch.float32)), pskv.KVStoreError)


@case
def test_broadcast_object() -> None:
    expected = {"hello": 123, 0: [1, 2]}
    obj = expected if hvd.rank() == 0 else None  # another type on the other ranks: the same default name
    assert hvd.broadcast_object(obj, root_rank=0) == expected
    big = list(range(20000)) if hvd.rank() == 1 else None
    assert hvd.broadcast_object(big, root_rank=1, name="big") == list(range(20000))


@case
def test_allgather_object() -> None:
    d = {"metric_val_1": hvd.rank()}
    if hvd.rank() == 1:
        d["metric_val_2"] = 42
    assert hvd.allgather_object(d) == [{"metric_val_1": 0}, {"metric_val_1": 1, "metric_val_2": 42}]


def model_and_optimizer(opt_class: Any, **options: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(hvd.rank())  # different on every rank until broadcast
    model = torch.nn.Sequential(torch.nn.Linear(10, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    return model, opt_class(model.parameters(), **options)


@case
def test_broadcast_state() -> None:
    for name, opt_class, options in (("sgd", torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
                                     ("adam", torch.optim.Adam, {"lr": 0.01}),
                                     ("adagrad", torch.optim.Adagrad, {"lr": 0.01})):
        model, optimizer = model_and_optimizer(opt_class, **options)
        torch.manual_seed(10 + hvd.rank())
        model(torch.randn(4, 10)).sum().backward()
        optimizer.step()  # each rank's own state
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        params = torch.cat([p.detach().reshape(-1) for p in model.state_dict().values()])
        state = [t for s in optimizer.state_dict()["state"].values() for t in s.values() if torch.is_tensor(t)]
        flat = torch.cat([params] + [t.reshape(-1).double().float() for t in state])
        everyone = hvd.allgather(flat.unsqueeze(0))
        assert torch.equal(everyone[0], everyone[1]), name


@case
def test_broadcast_state_options() -> None:
    options = {"lr": 0.1, "momentum": 0.8, "weight_decay": 0.2, "nesterov": True} if hvd.rank() == 0 else \
        {"lr": 0.2, "momentum": 0.9, "weight_decay": 0.1, "nesterov": False}
    model, optimizer = model_and_optimizer(torch.optim.SGD, **options)
    hvd.broadcast_parameters(list(model.named_parameters()), root_rank=1)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    group = optimizer.param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"], group["nesterov"]) == (0.1, 0.8, 0.2, True)
    assert isinstance(group["nesterov"], bool)


@case
def test_compression_fp16() -> None:
    for where, tensor in grid(FLOATS):
        summed = hvd.allreduce(tensor, op=hvd.Sum, compression=hvd.Compression.fp16, name=f"fp16.{where}")
        assert summed.dtype == tensor.dtype and torch.equal(summed, tensor * hvd.size()), where
    sent, ctx = hvd.Compression.fp16.compress(torch.ones(2))
    assert sent.dtype == torch.float16 and hvd.Compression.fp16.decompress(sent, ctx).dtype == torch.float32


@case
def test_byteps_names() -> None:
    t = torch.ones(3)
    assert torch.equal(hvd.push_pull(t, average=False, name="bps.a"), torch.full((3,), 2.0))  # BytePS: no warning
    hvd.declare(["bps.b", "bps.c"], [torch.ones(2), torch.ones(4)])
    mine = torch.ones(2)
    assert torch.equal(hvd.synchronize(hvd.push_pull_async(mine, average=False, name="bps.b", priority=-1)),
                       torch.full((2,), 2.0)) and torch.equal(mine, torch.ones(2))
    assert torch.equal(hvd.push_pull_inplace(torch.ones(4), name="bps.c", version=0), torch.ones(4))
    handle = hvd.push_pull_async_inplace(mine, False, "bps.b", 0, -2)
    assert hvd.synchronize(handle) is mine and torch.equal(mine, torch.full((2,), 2.0))
    group = [torch.ones(2), torch.ones(3, dtype=torch.int64)]
    hvd.declare("bps.group", group)  # the keys of grouped_allreduce(group, name="bps.group"), in one meeting
    assert [t.tolist() for t in hvd.grouped_allreduce_(group, name="bps.group", op=hvd.Sum)] == [[2.0] * 2, [2] * 3]


@case
def test_horovod_join_allreduce() -> None:
    # the store with servers: rank 0 joins first, rank 1's averages go on (its sum alone, divided by size)
    tensor = torch.full((5,), 8.0)
    hvd.allreduce(tensor, name="join.a")  # declared by both: a new name is a meeting, which a joined rank misses
    if hvd.store().store_type.distributed and hvd.rank() == 0:
        ret = hvd.join()
    else:
        if hvd.store().store_type.distributed:
            assert torch.equal(hvd.allreduce(tensor, name="join.a"), tensor * (hvd.size() - 1) / hvd.size())
        ret = hvd.join()
    assert ret == -1


hvd.init()
cases.run_later()
cases.write(hvd.rank(), seconds=cases.seconds, store=hvd.store().type)
hvd.shutdown()
