"""The 2-rank job of tests/torch/test_byteps.py: BytePS's PyTorch test cases on ``import pskv.torch as bps``.

Run on every rank by ``pskv launch -n 2 -s S -- python job_byteps.py OUTDIR``; each case records
"ok" or its error, and the rank writes ``OUTDIR/rank-R.json``. Ported from the semantics (no code
copied) of bytedance/byteps's PyTorch tests; the case names keep BytePS's test names, and
tests/torch/test_byteps.py lists every BytePS test found and what became of it.

It may run after other job scripts in the same process: it sets its own seeds, names its
tensors ``byteps.*``, changes no process-wide setting, and calls ``bps.init()`` first and
``bps.shutdown()`` last.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - torch's usual alias
from torch import nn

import pskv
import pskv.torch as bps
import pskv.torch.cross_barrier as bps_cross_barrier
from pskv.torch.parallel import DistributedDataParallel
from tests.torch.cases import Cases

cases = Cases()
case, results = cases.later, cases.results  # run by main(), after bps.init()


def seeded(seed: int, shape: list[int], dtype: torch.dtype, requires_grad: bool = False) -> torch.Tensor:
    """BytePS's ``random(seed, ...)``: the same tensor on every rank for one seed (ones for bool)."""
    if dtype == torch.bool:
        return torch.ones(shape, dtype=dtype)
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=gen, dtype=dtype).requires_grad_(requires_grad)


def rows(r: int, same_shape: bool) -> int:
    """Rank ``r``'s first dimension: 10, or 10 + r when the ranks' shapes differ (``same_shape=False``)."""
    return 10 if same_shape else 10 + r


# -- tests/torch/test_torch.py (and Espresso's byteps/torch/test_torch.py) ---------------------
@case
def test_byteps_push_pull() -> None:
    tensor = torch.ones(100, 100)
    for count in range(20):  # ten names, each used twice: a name is reused across steps
        summed = bps.push_pull(tensor, name=f"byteps.tensor_{count % 10}", average=False)
        assert torch.equal(summed, torch.full((100, 100), float(bps.size()))), count
    assert torch.equal(tensor, torch.ones(100, 100))  # push_pull leaves its input alone
    mine = torch.ones(8) * (bps.local_rank() + 1)  # Espresso's: the in-place async form, averaged
    handle = bps.byteps_push_pull(mine, name="byteps.tensor_push_pull100", average=True)
    assert bps.synchronize(handle) is mine
    assert torch.equal(mine, torch.full((8,), sum(r + 1 for r in range(bps.size())) / bps.size()))


# -- tests/torch/test_torch_broadcast_object.py -------------------------------------------------
@case
def test_broadcast_object() -> None:
    expected = {"hello": 123, 0: [1, 2]}
    obj = expected if bps.rank() == 0 else {}
    assert bps.broadcast_object(obj, root_rank=0) == expected


# -- tests/torch/test_torch_allgather.py ---------------------------------------------------------
def expected_gather(shape: list[int], dtype: torch.dtype, same_shape: bool) -> torch.Tensor:
    return torch.cat([seeded(r, [rows(r, same_shape)] + shape[1:], dtype) for r in range(bps.size())])


def gather_grid(dtypes: list[torch.dtype]) -> Any:
    """BytePS's grid: (iteration, same_shape, dtype, shape) for 1 to 3 dims of 10, both shape modes."""
    for it, same_shape, dtype, dim in itertools.product(range(2), (True, False), dtypes, (1, 2, 3)):
        yield it, same_shape, dtype, [10] * dim


@case
def test_byteps_allgather() -> None:
    for it, same_shape, dtype, shape in gather_grid([torch.bool, torch.float32]):
        mine = seeded(bps.rank(), [rows(bps.rank(), same_shape)] + shape[1:], dtype)
        gathered = bps.allgather(mine, same_shape=same_shape, name=f"byteps.allgather_{dtype}_{len(shape)}_{it}")
        assert torch.equal(gathered, expected_gather(shape, dtype, same_shape)), (it, same_shape, dtype, shape)


@case
def test_byteps_allgather_with_output() -> None:
    for it, same_shape, dtype, shape in gather_grid([torch.bool, torch.float32]):
        total = sum(rows(r, same_shape) for r in range(bps.size()))
        output = torch.zeros([total] + shape[1:], dtype=dtype)
        mine = seeded(bps.rank(), [rows(bps.rank(), same_shape)] + shape[1:], dtype)
        returned = bps.allgather(mine, output=output, same_shape=same_shape,
                                 name=f"byteps.allgather_with_output_{dtype}_{len(shape)}_{it}")
        assert returned is output and torch.equal(output, expected_gather(shape, dtype, same_shape))


@case
def test_byteps_mix_allgather_allreduce() -> None:
    for it, same_shape, dtype, shape in gather_grid([torch.float32]):
        mine = seeded(bps.rank(), [rows(bps.rank(), same_shape)] + shape[1:], dtype)
        gathered = bps.allgather(mine, same_shape=same_shape, name=f"byteps.mix_allgather_{len(shape)}_{it}")
        reduced = bps.push_pull(seeded(bps.rank(), shape, dtype), average=False,
                                name=f"byteps.mix_allreduce_{len(shape)}_{it}")
        assert torch.equal(gathered, expected_gather(shape, dtype, same_shape))
        expected = torch.stack([seeded(r, shape, dtype) for r in range(bps.size())]).sum(0)
        assert torch.allclose(reduced, expected, rtol=0, atol=1e-6), (reduced - expected).abs().max()


@case
def test_allgather_autograd() -> None:
    for it, same_shape in itertools.product(range(2), (True, False)):
        x = seeded(bps.rank(), [rows(bps.rank(), same_shape)], torch.float32, requires_grad=True)
        y = bps.allgather(x, same_shape=same_shape, name=f"byteps.allgather_autograd_{same_shape}_{it}")
        (y * y).backward(torch.ones_like(y))
        start = sum(rows(r, same_shape) for r in range(bps.rank()))
        golden = expected_gather([10], torch.float32, same_shape) * 2.0
        assert x.grad is not None and torch.allclose(x.grad, golden[start:start + len(x)], atol=5e-4)


# -- tests/torch/test_pipeline*.py and utils.py's LinearRegression (staleness 0) -----------------
class LinearRegression:
    """The closed-form reference: ``(w . x_r - y)^2`` on every rank r, gradients summed over
    ``grad_acc`` passes and averaged over the ranks, plain SGD (in float64)."""

    def __init__(self, lr: float, grad_acc: int = 1) -> None:
        self.weight = torch.ones(3, dtype=torch.float64)
        self.lr, self.grad_acc = lr, grad_acc
        self.grad = torch.zeros(3, dtype=torch.float64)

    def backward(self) -> None:
        for _ in range(self.grad_acc):
            self.grad += sum(2 * x * (self.weight @ x - Y) for x in map(x_of, range(bps.size()))) / bps.size()

    def step(self) -> None:
        self.weight -= self.lr * self.grad


Y = 2.0


def x_of(r: int) -> torch.Tensor:
    """Rank r's input: BytePS's ``[1, 1, 1]``, scaled per rank so that only averaged gradients match."""
    return torch.ones(3, dtype=torch.float64) * (1 + 0.25 * r)


def linear_regression_run(model: nn.Module, optimizer: Any, reference: LinearRegression, iterations: int,
                          params: nn.Linear) -> None:
    """BytePS's loop: each iteration the weight before the step and the gradient it used match the reference."""
    x, y = x_of(bps.rank()).float(), torch.tensor([Y])
    for i in range(iterations):
        optimizer.zero_grad()
        reference.grad.zero_()
        for _ in range(reference.grad_acc):
            F.mse_loss(model(x), y, reduction="sum").backward()
        reference.backward()
        weight = params.weight.detach().double()[0]
        assert torch.allclose(weight, reference.weight, rtol=1e-5, atol=1e-5), (i, weight, reference.weight)
        optimizer.step()
        reference.step()
        assert params.weight.grad is not None, i
        grad = params.weight.grad.double()[0]
        assert torch.allclose(grad, reference.grad, rtol=1e-5, atol=1e-5), (i, grad, reference.grad)


def regression_model() -> nn.Linear:
    model = nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    return model


@case
def test_pipeline() -> None:
    model = regression_model()
    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
    linear_regression_run(model, optimizer, LinearRegression(lr=0.01), 20, model)


@case
def test_pipeline_gradacc() -> None:
    model = regression_model()
    optimizer = bps.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), backward_passes_per_step=2)
    linear_regression_run(model, optimizer, LinearRegression(lr=0.1, grad_acc=2), 10, model)


@case
def test_pipeline_ddp() -> None:
    module = regression_model()
    model = DistributedDataParallel(module, bucket_cap_mb=0)  # BytePS's import, from pskv.torch.parallel
    linear_regression_run(model, torch.optim.SGD(model.parameters(), lr=0.01), LinearRegression(lr=0.01), 20, module)


# -- tests/test_torch_tensor_fusion.py and tests/torch/test_torch_tensor_fusion_ddp.py -----------
class LeNet5(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1, self.fc2, self.fc3 = nn.Linear(16 * 5 * 5, 120), nn.Linear(120, 84), nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2).flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


# the shell scripts' settings: SGD with momentum and weight decay, Adam with other betas, Adagrad
OPTIMIZERS: list[tuple[str, Callable[..., torch.optim.Optimizer]]] = [
    ("SGD", lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, weight_decay=4e-5)),
    ("Adam", lambda p: torch.optim.Adam(p, lr=0.1, betas=(0.999, 0.8))),
    ("Adagrad", lambda p: torch.optim.Adagrad(p, lr=0.1, weight_decay=2e-4)),
]


def fusion_batches(seed: int, rank_dependent: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed + (bps.rank() if rank_dependent else 0))
    return [(torch.rand(8, 1, 28, 28, generator=gen), torch.randint(0, 10, (8,), generator=gen)) for _ in range(3)]


def same_parameters(first: nn.Module, second: nn.Module) -> bool:
    return all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))


@case
def test_torch_tensor_fusion() -> None:
    """A plain optimizer and the DistributedOptimizer on the same data on every rank: the average of
    equal gradients is the gradient, so both models stay equal, bit for bit, step after step."""
    for name, make in OPTIMIZERS:
        torch.manual_seed(0)
        model1 = LeNet5()
        model2 = copy.deepcopy(model1)
        optimizer1 = make(model1.parameters())
        optimizer2 = bps.DistributedOptimizer(make(model2.parameters()), named_parameters=model2.named_parameters())
        for t, (data, target) in enumerate(fusion_batches(1, rank_dependent=False)):
            for model, optimizer in ((model1, optimizer1), (model2, optimizer2)):
                optimizer.zero_grad()
                F.cross_entropy(model(data), target).backward()
                optimizer.step()
            assert same_parameters(model1, model2), f"{name}: iteration {t}, the parameters differ"


@case
def test_torch_tensor_fusion_ddp() -> None:
    """DDP with one bucket per gradient (``bucket_cap_mb=0``) and with the default buckets, on data that
    differs between ranks: the same averaged gradients, the same parameters, bit for bit."""
    for name, make in OPTIMIZERS:
        torch.manual_seed(bps.rank())  # different on every rank: DDP broadcasts rank 0's at construction
        module = LeNet5()
        twin = copy.deepcopy(module)  # before DDP hooks its parameters
        model1 = bps.DistributedDataParallel(module, bucket_cap_mb=0)
        model2 = bps.DistributedDataParallel(twin)
        assert same_parameters(model1, model2), f"{name}: the initial models differ"
        optimizer1, optimizer2 = make(model1.parameters()), make(model2.parameters())
        for t, (data, target) in enumerate(fusion_batches(2, rank_dependent=True)):
            for model, optimizer in ((model1, optimizer1), (model2, optimizer2)):
                optimizer.zero_grad()
                F.cross_entropy(model(data), target).backward()
                optimizer.step()
            assert same_parameters(model1, model2), f"{name}: iteration {t}, the parameters differ"
        everyone = bps.allgather(torch.cat([p.detach().reshape(-1) for p in model1.parameters()]).unsqueeze(0),
                                 name=f"byteps.fusion_ddp.{name}")
        assert torch.equal(everyone[0], everyone[1]), f"{name}: the ranks' parameters differ"


# -- example/pytorch/benchmark_cross_barrier_byteps.py (its calls, a small model) ---------------
@case
def benchmark_cross_barrier_byteps() -> None:
    """``import byteps.torch.cross_barrier as bps`` and the example's calls; the servers run the SGD
    (``dist_sync``), and the all-reduce store refuses it clearly."""
    cb = bps_cross_barrier
    cb.init()
    torch.manual_seed(cb.rank())
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    optimizer: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        optimizer = cb.CrossBarrier(model, optimizer, named_parameters=model.named_parameters(),
                                    compression=cb.Compression.none, num_steps=4)
    except pskv.InvalidArgumentError as exc:
        assert not bps.store().store_type.distributed and "update_on_kvstore=False" in str(exc), exc
        results["cross_barrier_store"] = "refused"
        return
    cb.broadcast_parameters(model.state_dict(), root_rank=0)
    cb.broadcast_optimizer_state(optimizer, root_rank=0)
    gen = torch.Generator().manual_seed(10 + cb.rank())
    for _ in range(4):
        optimizer.zero_grad()
        F.cross_entropy(model(torch.randn(4, 6, generator=gen)), torch.randint(0, 3, (4,), generator=gen)).backward()
        optimizer.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = bps.allgather(flat.unsqueeze(0), name="byteps.cross_barrier.params")
    assert torch.equal(everyone[0], everyone[1]), "the ranks' parameters differ"
    results["cross_barrier_store"] = "ran"


# -- what BytePS offers and pskv does not: a clear refusal naming the call ----------------------
@case
def test_send_recv() -> None:
    """tests/torch/test_torch_p2p.py (and BytePS's elastic suspend/resume): NotSupportedError naming the call."""
    for function, args in (("send_async", (torch.ones(2), 1)), ("recv_async", (torch.ones(2), 0)),
                           ("suspend", ()), ("resume", (2, 1, 0))):
        try:
            getattr(bps, function)(*args)
        except pskv.NotSupportedError as exc:
            assert f"pskv.torch.{function} is not offered" in str(exc), exc
            continue
        raise AssertionError(f"{function} was not refused")


def main() -> None:
    bps.init(lazy=False)  # BytePS's tests' call
    cases.run_later()
    cases.write(bps.rank(), store=bps.store().type, seconds=cases.seconds)
    bps.shutdown()


main()
