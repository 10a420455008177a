"""The launched 2-rank job of tests/torch/test_cross_barrier.py: run by tests/torch/launched.py, one JSON per rank."""

import torch
import torch.nn.functional as F
from torch import nn

import pskv
import pskv.torch as hvd
from tests.torch.cases import Cases

hvd.init()
rank, size = hvd.rank(), hvd.size()
cases = Cases()
case, results, params = cases.case, cases.results, cases.params

def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))

def batches(count, per_rank=8):
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(per_rank, 16, generator=gen) + rank, torch.randn(per_rank, 4, generator=gen))
            for _ in range(count)]

def sgd(ps):
    return torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01)

def run(make, overlap, steps=6, num_steps=None):
    """Train ``steps`` steps; the parameters, and what the overlap did (pending after step, forward waits)."""
    model = net()
    if overlap == "cross_barrier":
        opt = hvd.CrossBarrier(model, make(model.parameters()), num_steps=num_steps, bucket_bytes=1)
    elif overlap == "byteps":  # BytePS's program: bps.CrossBarrier(model, bps.DistributedOptimizer(...))
        inner = hvd.DistributedOptimizer(make(model.parameters()), named_parameters=model.named_parameters())
        opt = hvd.CrossBarrier(model, inner, num_steps=num_steps, bucket_bytes=1)
    else:
        opt = hvd.DistributedOptimizer(make(model.parameters()), named_parameters=model.named_parameters(),
                                       update_on_kvstore=True)
    pending_after_step = []
    for x, y in batches(steps):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        pending_after_step.append(opt._updates.pending)
    waited = opt._updates.waited_in_forward
    opt.synchronize()
    flat = [v for p in model.parameters() for v in p.detach().reshape(-1).tolist()]
    return flat, pending_after_step, waited

@case
def byteps_distributed_optimizer_handed_over_bit_for_bit():
    """First: the all-reducing wrapper declares its keys before the servers run an optimizer
    (pskv.torch.ops' keys are not summed keys: the servers would update them)."""
    crossed, _, _ = run(sgd, "byteps")
    plain, _, _ = run(sgd, None)
    assert crossed == plain, max(abs(a - b) for a, b in zip(crossed, plain))
    params["byteps"] = crossed

@case
def sgd_same_parameters_bit_for_bit():
    plain, pending, waited = run(sgd, None)
    crossed, crossed_pending, crossed_waited = run(sgd, "cross_barrier")
    assert crossed == plain, max(abs(a - b) for a, b in zip(crossed, plain))
    assert max(pending) == 0 and waited == 0, (pending, waited)  # without it: step() waits
    assert max(crossed_pending) > 0, crossed_pending  # with it: step() returns with updates on the way
    results["forward_waits"] = crossed_waited
    params["sgd"] = crossed

@case
def adam_same_parameters_bit_for_bit():
    def adam(ps):
        return torch.optim.Adam(ps, lr=0.01)
    plain, _, _ = run(adam, None, steps=4)
    crossed, _, _ = run(adam, "cross_barrier", steps=4)
    assert crossed == plain, max(abs(a - b) for a, b in zip(crossed, plain))
    params["adam"] = crossed

@case
def forward_waits_for_the_updates():
    """The next forward's pre-hooks find updates on the way and wait for them (several tries: timing)."""
    waits = results.get("forward_waits", 0)
    for _ in range(3):
        if waits:
            break
        waits = run(sgd, "cross_barrier")[2]
    assert waits > 0, "no forward pre-hook ever waited: the overlap is not wired"

@case
def num_steps_makes_the_last_step_wait():
    _, pending, _ = run(sgd, "cross_barrier", steps=3, num_steps=3)
    assert pending[-1] == 0, pending

@case
def arguments_are_checked():
    for bad, message in (((object(), sgd(net().parameters())), "model must be a torch.nn.Module"),
                         ((net(), sgd(net().parameters()), 0), "num_steps must be an int >= 1")):
        try:
            hvd.CrossBarrier(*bad)
            raise RuntimeError(f"accepted: {bad}")
        except pskv.InvalidArgumentError as exc:
            assert message in str(exc), exc

@case
def pskv_compression_matches_its_reference():
    """compression=Compression.twobit: each rank pushes its gradients 2-bit with its own residuals, the servers
    decode, sum and run SGD; bit for bit the same with and without the overlap, and pskv.compression's values
    (the reference: SGD on the average of each rank's decoded push)."""
    from pskv.compression import create, kernels
    kernels.ENABLED = False  # NumPy's loops, the same values: no Numba to import and compile in the job
    twobit = hvd.Compression.twobit(threshold=0.01)

    def plain_sgd(ps):
        return torch.optim.SGD(ps, lr=0.05)

    def train(overlap):
        model = net()
        opt = (hvd.CrossBarrier(model, plain_sgd(model.parameters()), compression=twobit, bucket_bytes=1) if overlap
               else hvd.DistributedOptimizer(plain_sgd(model.parameters()), named_parameters=model.named_parameters(),
                                             update_on_kvstore=True, compression=twobit))
        for x, y in batches(3):
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
        opt.synchronize()
        return [p.detach().clone() for p in model.parameters()]
    crossed, plain = train(True), train(False)
    assert all(torch.equal(a, b) for a, b in zip(crossed, plain))
    ref, comp = net(), create(twobit.params)
    residuals = {(r, i): torch.zeros(p.numel()).numpy() for r in range(size) for i, p in enumerate(ref.parameters())}
    gen = torch.Generator().manual_seed(1)  # batches(): each rank's inputs are these + its rank
    for x, y in [(torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)) for _ in range(3)]:
        sums = [torch.zeros_like(p) for p in ref.parameters()]
        for r in range(size):
            ref.zero_grad()
            F.mse_loss(ref(x + r), y).backward()
            for i, p in enumerate(ref.parameters()):
                flat = p.grad.reshape(-1).numpy().copy()
                sums[i] += torch.from_numpy(comp.decompress(comp.compress(flat, residuals[(r, i)]), flat.size)
                                            ).reshape(p.shape)
        with torch.no_grad():
            for p, total in zip(ref.parameters(), sums):
                p -= 0.05 * (total / size)
    gap = max((a - b).abs().max().item() for a, b in zip(crossed, ref.parameters()))
    assert gap < 1e-6, gap
    params["twobit"] = [v for p in crossed for v in p.reshape(-1).tolist()]

cases.write(rank, params=params)
hvd.shutdown()
