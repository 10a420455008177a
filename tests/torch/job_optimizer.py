"""The launched 2-rank job of tests/torch/test_optimizer.py: run by tests/torch/launched.py, one JSON per rank."""

import inspect
import itertools
import warnings

import torch
import torch.nn.functional as F
from torch import nn

import pskv
import pskv.torch as hvd
from tests.torch.cases import Cases

hvd.init()
rank, size = hvd.rank(), hvd.size()
cases = Cases()
case, record, results, params = cases.case, cases.record, cases.results, cases.params

def mlp():
    torch.manual_seed(0)  # the same start on every rank and in the reference
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))

def batches(count, per_rank=3):
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(per_rank * size, 5, generator=gen), torch.randn(per_rank * size, 3, generator=gen))
            for _ in range(count)]

def mine(t):  # this rank's share of a combined batch
    share = len(t) // size
    return t[rank * share:(rank + 1) * share]

def gap(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a.parameters(), b.parameters()))

def train(name, make, steps=4, passes=1, tolerance=1e-5, **options):
    """Distributed on this rank's share vs one process on the combined batch: the same parameters."""
    model, ref = mlp(), mlp()
    opt = hvd.DistributedOptimizer(make(model.parameters()), named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes, **options)
    ref_opt = make(ref.parameters())
    data = batches(steps * passes)
    for step in range(steps):
        opt.zero_grad()
        ref_opt.zero_grad()
        for x, y in data[step * passes:(step + 1) * passes]:
            (F.mse_loss(model(mine(x)), mine(y)) / passes).backward()
            (F.mse_loss(ref(x), y) / passes).backward()
        opt.step()
        ref_opt.step()
    assert gap(model, ref) < tolerance, (name, gap(model, ref))
    assert gap(model, mlp()) > 1e-3, "nothing trained"
    record(name, model)
    return opt

def sgd(ps):
    return torch.optim.SGD(ps, lr=0.1, momentum=0.9)

def adam(ps):
    return torch.optim.Adam(ps, lr=0.01)

@case
def sgd_momentum_matches_one_process():
    train("sgd", sgd)

@case
def adam_matches_one_process():
    train("adam", adam)

@case
def backward_passes_per_step_accumulates():
    train("passes", sgd, passes=2)

@case
def gradient_predivide_factor_gives_the_average():
    train("predivide", sgd, gradient_predivide_factor=2.0)

@case
def fp16_compression_trains_alike():
    train("fp16", sgd, tolerance=1e-2, compression=hvd.Compression.fp16)

@case
def op_sum_sums():
    model, ref = mlp(), mlp()
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters(), op=hvd.Sum)
    (x, y), = batches(1)
    F.mse_loss(model(mine(x)), mine(y), reduction="sum").backward()
    F.mse_loss(ref(x), y, reduction="sum").backward()
    opt.synchronize()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5), (p.grad, q.grad)
    with opt.skip_synchronize():
        opt.step()

@case
def gradients_leave_during_backward():
    model = mlp()
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters())
    from pskv.torch import ops, runtime
    job = runtime.current()
    (x, y), = batches(1)
    F.mse_loss(model(mine(x)), mine(y)).backward()
    # with servers, every bucket's key exists once the first gradient hook ran (declared there, before any
    # bucket was sent; not when wrapped: pskv.torch.sparse): one flat key here
    assert not job.servers or job.key(f"allreduce.{opt._buckets.names[0]}") in ops._names(job).keys, ops._names(job).keys
    assert opt._buckets.sent == len(opt._buckets.names) == 1, (opt._buckets.sent, opt._buckets.names)
    opt.step()
    assert opt._buckets.sent == 0

@case
def too_many_backward_passes_raise():
    model = mlp()
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters(),
                                   backward_passes_per_step=2)
    (x, y), = batches(1)
    for _ in range(2):
        F.mse_loss(model(mine(x)), mine(y)).backward()
    try:
        F.mse_loss(model(mine(x)), mine(y)).backward()
        raise RuntimeError("a third backward pass was accepted")
    except AssertionError as exc:
        assert "more than backward_passes_per_step times" in str(exc), exc
    opt.step()  # the two passes reduced still apply
    opt.zero_grad()

# -- Horovod's test_torch.py ---------------------------------------------------------
@case
def horovod_gradient_clipping():
    x = torch.ones(1, 1).requires_grad_()
    y = torch.ones(1, 1).requires_grad_()
    model = nn.Linear(1, 1)
    model.weight = nn.Parameter(torch.zeros(1, 1) + 0.5)
    model.bias = nn.Parameter(torch.zeros(1))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    loss = F.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.synchronize()
    prior_grad = model.weight.grad.item()
    nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    clipped_grad = model.weight.grad.item()
    assert abs(prior_grad) > abs(clipped_grad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with optimizer.skip_synchronize():
            optimizer.step()
    assert not caught, [str(w.message) for w in caught]

@case
def horovod_synchronize_step_warning():
    x = torch.zeros(1, 1).requires_grad_()
    y = torch.ones(1, 1).requires_grad_()
    model = nn.Linear(1, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    loss = F.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.synchronize()
    nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        optimizer.step()
    assert len(ws) == 1, [str(w.message) for w in ws]
    assert "optimizer.step() called without optimizer.skip_synchronize()" in str(ws[0].message)

@case
def zero_grad_before_step_is_refused():
    model = mlp()
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters())
    (x, y), = batches(1)
    F.mse_loss(model(mine(x)), mine(y)).backward()
    try:
        opt.zero_grad()
        raise RuntimeError("zero_grad was accepted")
    except AssertionError as exc:
        assert "optimizer.zero_grad() was called after loss.backward() but before optimizer.step()" in str(exc)
    opt.step()
    opt.zero_grad()  # after the step it is fine

@case
def horovod_duplicate_names():
    net1, net2 = nn.Conv2d(1, 1, 1), nn.Conv2d(1, 1, 1)
    opt = torch.optim.SGD(itertools.chain(net1.parameters(), net2.parameters()), lr=0.1)
    named = itertools.chain(net1.named_parameters(), net2.named_parameters())
    try:
        hvd.DistributedOptimizer(opt, named_parameters=named)
        raise RuntimeError("hvd.DistributedOptimizer did not throw error")
    except ValueError as exc:
        assert "Found duplicates: bias, weight" in str(exc), exc

@case
def horovod_missing_named_parameters():
    model = nn.Sequential(nn.Conv2d(1, 100, 1), nn.Conv2d(100, 1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        hvd.DistributedOptimizer(opt, named_parameters=list(model.named_parameters())[0:1])
        raise RuntimeError("hvd.DistributedOptimizer did not throw error")
    except ValueError as exc:
        text = str(exc)
        assert "were not named" in text and "param_groups[0]['params'][1] (shape (100,))" in text, text
        assert "['params'][3] (shape (1,))" in text and "['params'][0]" not in text, text

@case
def horovod_no_named_parameters():
    model = nn.Sequential(nn.Conv2d(1, 100, 1), nn.Conv2d(100, 1, 1))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    loss = model(torch.rand([1, 1, 100, 100])).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    record("no_names", model)

@case
def horovod_optimizer_no_named_parameters():
    model = nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10))
    optimizer = torch.optim.SGD([{"params": model[0].parameters()}, {"params": model[1].parameters()}], lr=0.001)
    optimizer = hvd.DistributedOptimizer(optimizer)
    names = optimizer._parameter_names
    assert len(names) == len(set(names.values())) == 4, names
    results["noname_names"] = sorted(names.values())

@case
def horovod_dynamic_requires_grad():
    gen, disc = nn.Conv2d(1, 10, 1), nn.Conv2d(10, 1, 1)
    inp = torch.rand([1, 1, 100, 100])
    gen_opt = hvd.DistributedOptimizer(torch.optim.SGD(gen.parameters(), lr=0.1),
                                       named_parameters=gen.named_parameters())
    disc_opt = hvd.DistributedOptimizer(torch.optim.SGD(disc.parameters(), lr=0.1),
                                        named_parameters=disc.named_parameters())

    def train_step(train_generator=False, train_discriminator=False):
        for p in gen.parameters():
            p.requires_grad_(train_generator)
        for p in disc.parameters():
            p.requires_grad_(train_discriminator)
        gen_opt.zero_grad()
        disc_opt.zero_grad()
        loss = disc(gen(inp)).sum()
        loss.backward()
        for p in gen.parameters():
            assert train_generator == (p.grad is not None and p.grad.max().is_nonzero())
        for p in disc.parameters():
            assert train_discriminator == (p.grad is not None and p.grad.max().is_nonzero())
        if train_generator:
            gen_opt.step()
        if train_discriminator:
            disc_opt.step()

    for _ in range(3):
        train_step(train_generator=True)
        train_step(train_discriminator=True)

@case
def horovod_force_allreduce():
    """Rank 0's loss leaves fc3 out: its gradients are reduced as zeros; every optimizer class works."""
    N, D_in, H, D_out = 16, 20, 10, 10
    torch.manual_seed(3)
    x, y = torch.randn(N, D_in).requires_grad_(), torch.randn(N, D_out).requires_grad_()

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3 = nn.Linear(D_in, H), nn.Linear(H, D_out), nn.Linear(D_out, D_out)

        def forward(self, x_):
            x_ = F.relu(self.fc1(x_))
            x1_ = self.fc2(x_)
            return x1_, self.fc3(F.relu(x1_))

    optimizers = sorted((c.__name__, c) for c in torch.optim.Optimizer.__subclasses__()
                        if c.__module__.startswith("torch.optim")
                        and c not in (torch.optim.LBFGS, torch.optim.SparseAdam,
                                      getattr(torch.optim, "Muon", None)))
    settings = [dict(lr=0.2, momentum=0.9, weight_decay=0.1, centered=True), dict(lr=0.2)]
    for (name, cls), setting in itertools.product(optimizers, settings):
        model = Net()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        accepted = {k: v for k, v in setting.items() if k in inspect.signature(cls.__init__).parameters}
        opt = hvd.DistributedOptimizer(cls(model.parameters(), **accepted),
                                       named_parameters=model.named_parameters())
        y_pred1, y_pred2 = model(x)
        loss = F.mse_loss(y_pred1 if rank == 0 else y_pred2, y, reduction="sum")
        opt.zero_grad()
        loss.backward()
        opt.step()
        record(f"force.{name}.{len(setting)}", model)

@case
def horovod_sparse_embeddings():
    """Horovod's case, then the values: the embedding's rows get the average of both ranks' sparse gradients."""
    inputs = [torch.LongTensor([[1, 2, 4, 5], [4, 3, 2, 9]]), torch.LongTensor([[1, 3, 4], [4, 7, 9]])]
    for sparse_as_dense in [False, True]:
        model = nn.Embedding(10, 3, sparse=True)
        opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(model.parameters()), lr=0.1),
                                       sparse_as_dense=sparse_as_dense)
        loss = model(inputs[rank % 2]).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.manual_seed(0)
    model = nn.Embedding(10, 3, sparse=True)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    ref = nn.Embedding(10, 3)
    ref.load_state_dict(model.state_dict())
    (model(inputs[rank]).sum() * (rank + 1)).backward()
    opt.synchronize()
    assert model.weight.grad.is_sparse
    (sum(ref(inputs[r]).sum() * (r + 1) for r in range(size)) / size).backward()
    assert torch.allclose(model.weight.grad.to_dense(), ref.weight.grad), (model.weight.grad, ref.weight.grad)
    with opt.skip_synchronize():
        opt.step()
    record("sparse", model)

@case
def grad_scaler_unscales_after_synchronize():
    """AMP's pattern: scale, backward, synchronize, unscale_, clip, step under skip_synchronize."""
    model, ref = mlp(), mlp()
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters())
    ref_opt = sgd(ref.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    for x, y in batches(3):
        opt.zero_grad()
        scaler.scale(F.mse_loss(model(mine(x)), mine(y))).backward()
        opt.synchronize()
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()
        ref_opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        ref_opt.step()
    assert gap(model, ref) < 1e-5, gap(model, ref)
    record("amp", model)

@case
def it_is_the_optimizer():
    model = mlp()
    inner = torch.optim.Adam(model.parameters(), lr=0.01)
    opt = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters())
    assert isinstance(opt, torch.optim.Adam) and type(opt).__name__ == "Adam"
    assert opt.param_groups is inner.param_groups and opt.state is inner.state
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    (x, y), = batches(1)
    F.mse_loss(model(mine(x)), mine(y)).backward()
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == 0.005
    saved = opt.state_dict()
    again = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())
    again.load_state_dict(saved)
    assert again.state_dict()["state"][0]["step"] == saved["state"][0]["step"] == 1
    fresh = hvd.DistributedOptimizer(torch.optim.Adam(mlp().parameters(), lr=0.01 * (rank + 1)))
    hvd.broadcast_optimizer_state(fresh, root_rank=0)  # Horovod's start: the state made, rank 0's options
    assert len(fresh.state) == 4 and fresh.param_groups[0]["lr"] == 0.01 and not fresh._pending()

@case
def wrapping_again_takes_the_parameters_over():
    model, ref = mlp(), mlp()
    inner = sgd(model.parameters())
    hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters())
    opt = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters())  # a new wrapper
    ref_opt = sgd(ref.parameters())
    for x, y in batches(2):
        opt.zero_grad()
        F.mse_loss(model(mine(x)), mine(y)).backward()
        opt.step()
        ref_opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ref_opt.step()
    assert gap(model, ref) < 1e-5, gap(model, ref)

@case
def adasum_is_refused():
    model = mlp()
    try:
        hvd.DistributedOptimizer(sgd(model.parameters()), op=hvd.Adasum)
        raise RuntimeError("Adasum was accepted")
    except pskv.NotSupportedError as exc:
        assert "DistributedOptimizer(op=Adasum)" in str(exc), exc

@case
def pskv_compression_matches_its_reference():
    """Compression.twobit on a store with servers: every rank's gradients pushed 2-bit with its own residual,
    the servers' sum of the decoded pushes averaged; the reference runs pskv.compression on each rank's share.
    The all-reduce store (-s 0) refuses it, naming it and the store."""
    from pskv.compression import create, kernels
    kernels.ENABLED = False  # NumPy's loops, the same values: no Numba to import and compile in the job
    from pskv.torch import runtime
    twobit = hvd.Compression.twobit(threshold=0.05)
    try:
        hvd.allreduce(torch.ones(3, dtype=torch.float64), name="twobit.f64", compression=twobit)
        raise RuntimeError("a float64 tensor was compressed")
    except pskv.InvalidArgumentError as exc:
        assert "takes float32 tensors only" in str(exc), exc
    if not runtime.current().servers:
        for attempt in (lambda: hvd.allreduce(torch.ones(3), name="twobit", compression=twobit),
                        lambda: hvd.DistributedOptimizer(sgd(mlp().parameters()), compression=twobit)):
            try:
                attempt()
                raise RuntimeError("the all-reduce store took pskv's compression")
            except pskv.NotSupportedError as exc:
                assert "Compression.named('2bit', threshold=0.05)" in str(exc) and "horovod store" in str(exc), exc
        return
    half = hvd.Compression.twobit(threshold=0.5)  # 0.3 a call: 0 (0.3 kept), then 0.5 on each rank
    got = [hvd.allreduce(torch.full((3,), 0.3), name="twobit", compression=half)[0].item() for _ in range(2)]
    plain = hvd.allreduce(torch.full((3,), 0.3), name="twobit")  # the name without it: another key, plain
    assert got == [0.0, 0.5] and torch.equal(plain, torch.full((3,), 0.3)), (got, plain)
    model, ref = mlp(), mlp()
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters(),
                                   compression=twobit)
    ref_opt, comp = sgd(ref.parameters()), create(twobit.params)
    residuals = {(r, i): torch.zeros(p.numel()).numpy() for r in range(size) for i, p in enumerate(ref.parameters())}
    for x, y in batches(4):
        opt.zero_grad()
        F.mse_loss(model(mine(x)), mine(y)).backward()
        opt.step()
        sums = [torch.zeros_like(p) for p in ref.parameters()]
        for r in range(size):  # each rank's gradient, compressed with that rank's residual, decoded
            ref.zero_grad()
            F.mse_loss(ref(x[r * 3:(r + 1) * 3]), y[r * 3:(r + 1) * 3]).backward()
            for i, p in enumerate(ref.parameters()):
                flat = p.grad.detach().reshape(-1).numpy().copy()
                sums[i] += torch.from_numpy(comp.decompress(comp.compress(flat, residuals[(r, i)]), flat.size)
                                            ).reshape(p.shape)
        for p, total in zip(ref.parameters(), sums):
            p.grad = total / size
        ref_opt.step()
    assert gap(model, ref) < 1e-6, gap(model, ref)
    assert gap(model, mlp()) > 1e-3, "nothing trained"
    record("twobit", model)

cases.write(rank, size=size, params=params)
hvd.shutdown()
