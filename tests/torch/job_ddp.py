"""The launched 2-rank job of tests/torch/test_ddp.py: run by tests/torch/launched.py, one JSON per rank."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import pskv
import pskv.torch as hvd
from tests.torch.cases import Cases

# a torch DDP script's start, as it is: its Gloo group (the launcher's MASTER_ADDR / MASTER_PORT);
# no hvd.init(): pskv's DDP starts pskv.torch itself (the swap is one line)
dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
cases = Cases()
case, results = cases.case, cases.results

class Net(nn.Module):
    """Registered fc2 first, run fc1 first: gradients arrive in another order than the buckets'."""

    def __init__(self, norm=False):
        super().__init__()
        self.fc2 = nn.Linear(8, 3)
        self.fc1 = nn.Linear(5, 8)
        self.norm = nn.BatchNorm1d(8) if norm else nn.Identity()

    def forward(self, x):
        return self.fc2(torch.tanh(self.norm(self.fc1(x))))

class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(5, 4)
        self.left, self.right, self.never = nn.Linear(4, 3), nn.Linear(4, 3), nn.Linear(4, 3)

    def forward(self, x, use_right):
        h = torch.tanh(self.trunk(x))
        return self.left(h) + self.right(h) if use_right else self.left(h)

def batches(count, per_rank=4):
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(per_rank * size, 5, generator=gen), torch.randn(per_rank * size, 3, generator=gen))
            for _ in range(count)]

def mine(t):
    share = len(t) // size
    return t[rank * share:(rank + 1) * share]

def fresh(cls, **kw):
    torch.manual_seed(rank)  # a different start on each rank: the wrapper broadcasts rank 0's
    return cls(**kw)

def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}

def agree(ours, theirs, what, tolerance=1e-6):
    assert ours.keys() == theirs.keys(), (what, ours.keys(), theirs.keys())
    for k in ours:
        gap = (ours[k].double() - theirs[k].double()).abs().max().item()
        assert gap <= tolerance, (what, k, gap)

def both(scenario, **kw):
    """The scenario with torch's DDP, then with pskv's: each returns its model's final state."""
    return (scenario(lambda m, **o: nn.parallel.DistributedDataParallel(m, **o), **kw),
            scenario(lambda m, **o: hvd.DistributedDataParallel(m, **o), **kw))

def plain(wrap, norm=False, bucket_cap_mb=None):
    model = wrap(fresh(Net, norm=norm), bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches(4):
        opt.zero_grad()
        F.mse_loss(model(mine(x)), mine(y)).backward()
        opt.step()
    model.eval()
    with torch.no_grad():  # the forward broadcasts rank 0's running statistics first, and keeps them
        model(mine(x))
    return state(model.module)

@case
def the_store_is_the_launchers():
    assert not hvd.is_initialized()
    hvd.DistributedDataParallel(nn.Linear(2, 2))
    assert hvd.is_initialized() and (hvd.rank(), hvd.size()) == (rank, size)
    results["store"] = hvd.store().store_type.name

@case
def plain_training_equals_torch_ddp_and_one_process():
    theirs, ours = both(plain)
    agree(ours, theirs, "plain")
    torch.manual_seed(0)
    ref = Net()  # rank 0's start, the combined batch
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches(4):
        opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        opt.step()
    agree(ours, state(ref), "one process", 1e-5)
    results["plain"] = {k: v.reshape(-1).tolist() for k, v in ours.items()}

@case
def many_small_buckets_ready_out_of_order():
    theirs, ours = both(plain, bucket_cap_mb=0.0001)
    agree(ours, theirs, "small buckets")

@case
def batch_norm_buffers_follow_rank_0():
    theirs, ours = both(plain, norm=True)
    agree(ours, theirs, "buffers")
    results["buffers"] = ours["norm.running_mean"].tolist()

def accumulate(wrap):
    model = wrap(fresh(Net))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = batches(9)
    for step in range(3):
        opt.zero_grad()
        with model.no_sync():
            for x, y in data[3 * step:3 * step + 2]:
                F.mse_loss(model(mine(x)), mine(y)).backward()
        local = [p.grad.clone() for p in model.parameters()]
        x, y = data[3 * step + 2]
        F.mse_loss(model(mine(x)), mine(y)).backward()
        assert any(not torch.equal(a, p.grad) for a, p in zip(local, model.parameters()))
        opt.step()
    return state(model.module)

@case
def no_sync_accumulates_locally():
    theirs, ours = both(accumulate)
    agree(ours, theirs, "no_sync")

def unused(wrap):
    model = wrap(fresh(Branchy), find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    grads = []
    for step, (x, y) in enumerate(batches(4)):
        opt.zero_grad()
        F.mse_loss(model(mine(x), use_right=(rank + step) % 2 == 1), mine(y)).backward()
        grads.append([p.grad is None for p in model.parameters()])
        opt.step()
    assert grads[0] == [False] * 6 + [True] * 2, grads  # `never` has no gradient on any rank
    return {**state(model.module), "none": torch.tensor(grads)}

@case
def find_unused_parameters_as_torch():
    theirs, ours = both(unused)
    agree(ours, theirs, "find_unused_parameters")

class Lookup(nn.Module):
    def __init__(self):
        super().__init__()
        self.table, self.head = nn.Embedding(10, 4, sparse=True), nn.Linear(4, 3)

    def forward(self, ids):
        return self.head(self.table(ids).mean(1))

def sparse(wrap):
    model = wrap(fresh(Lookup))
    if isinstance(model, hvd.DistributedDataParallel):  # the table's rows travel, from the first step
        assert model.module.table.weight in model._buckets.rows, model._buckets
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(2)
    for _ in range(3):
        ids, y = torch.randint(0, 10, (2 * size, 3), generator=gen), torch.randn(2 * size, 3, generator=gen)
        opt.zero_grad()
        F.mse_loss(model(mine(ids)), mine(y)).backward()
        assert model.module.table.weight.grad.is_sparse
        opt.step()
    return state(model.module)

@case
def sparse_gradients_as_torch():
    theirs, ours = both(sparse)
    agree(ours, theirs, "sparse")

@case
def unused_without_the_flag_still_reduces():
    model = hvd.DistributedDataParallel(fresh(Branchy))
    (x, y), = batches(1)
    F.mse_loss(model(mine(x), use_right=rank == 1), mine(y)).backward()  # no rank waits for another
    right = [p.grad for p in model.module.right.parameters()]
    torch.manual_seed(0)
    ref = Branchy()
    F.mse_loss(ref(x[4:], use_right=True), y[4:]).backward()
    for got, want in zip(right, ref.right.parameters()):
        assert torch.allclose(got, want.grad / size, atol=1e-6), (got, want.grad)

@case
def the_torch_surface():
    model = hvd.DistributedDataParallel(fresh(Net), device_ids=None, broadcast_buffers=False, bucket_cap_mb=25,
                                        find_unused_parameters=False, gradient_as_bucket_view=True)
    assert isinstance(model.module, Net) and isinstance(model, nn.Module)
    assert all(k.startswith("module.") for k in model.state_dict())
    assert model(x=torch.ones(2, 5)).shape == (2, 3)
    try:
        hvd.DistributedDataParallel(Net(), process_group=object())
        raise RuntimeError("a process group was accepted")
    except pskv.NotSupportedError as exc:
        assert "process_group" in str(exc)

@case
def pskv_compression_matches_its_reference():
    """compression=Compression.twobit with servers: each rank's gradients pushed 2-bit with its own residual
    (pskv.compression's values, the reference); the all-reduce store refuses it."""
    from pskv.compression import create, kernels
    kernels.ENABLED = False  # NumPy's loops, the same values: no Numba to import and compile in the job
    twobit = hvd.Compression.twobit(threshold=0.05)
    if hvd.store().store_type.name != "dist_sync":
        try:
            hvd.DistributedDataParallel(Net(), compression=twobit)
            raise RuntimeError("the all-reduce store took pskv's compression")
        except pskv.NotSupportedError as exc:
            assert "Compression.named('2bit', threshold=0.05)" in str(exc), exc
        return
    model = hvd.DistributedDataParallel(fresh(Net), compression=twobit)
    torch.manual_seed(0)
    ref, comp = Net(), create(twobit.params)  # rank 0's start
    opt, ref_opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, ref))
    residuals = {(r, i): torch.zeros(p.numel()).numpy() for r in range(size) for i, p in enumerate(ref.parameters())}
    for x, y in batches(3):
        opt.zero_grad()
        F.mse_loss(model(mine(x)), mine(y)).backward()
        opt.step()
        sums = [torch.zeros_like(p) for p in ref.parameters()]
        for r in range(size):
            ref.zero_grad()
            F.mse_loss(ref(x[r * 4:(r + 1) * 4]), y[r * 4:(r + 1) * 4]).backward()
            for i, p in enumerate(ref.parameters()):
                flat = p.grad.reshape(-1).numpy().copy()
                sums[i] += torch.from_numpy(comp.decompress(comp.compress(flat, residuals[(r, i)]), flat.size)
                                            ).reshape(p.shape)
        for p, total in zip(ref.parameters(), sums):
            p.grad = total / size
        ref_opt.step()
    agree(state(model.module), state(ref), "twobit")
    results["twobit"] = [v for p in model.module.parameters() for v in p.detach().reshape(-1).tolist()]

cases.write(rank)
dist.destroy_process_group()
hvd.shutdown()
