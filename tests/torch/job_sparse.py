"""The launched 2-rank job of tests/torch/test_sparse.py: sparse gradients of ``DistributedOptimizer`` as rows.

Run on every rank as ``python job_sparse.py OUTDIR`` under ``pskv launch -n 2 -s S`` (``-s 1``: the rows
go through the servers' row-sparse keys; ``-s 0``: they are gathered on the all-reduce store); each
case records "ok" or its error in ``OUTDIR/rank-R.json``, with the parameters it trained. It may run
after other job scripts in the same process (tests/torch/run_scripts.py): it sets its own seeds and
names its parameters ``sparse.*``.
"""

import json
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import pskv
import pskv.torch as hvd
from pskv.torch import runtime
from pskv.torch.buckets import GradientBuckets
from pskv.torch.sparse import SparseGradients

hvd.init()
rank, size = hvd.rank(), hvd.size()
rng = torch.get_rng_state()  # given back at the end: the next script of the process draws as if alone
results, params = {}, {}
ROWS, DIM = 12, 3
TOUCHED = {0: [[1, 3], [5]], 1: [[3, 7], [9, 9]]}  # each rank's rows in two backward passes: row 3 by both
SIGN = {0: 1.0, 1: -1.0}  # so row 3's sum is zero: still one of the rows that come back


def case(fn):
    try:
        fn()
        results[fn.__name__] = "ok"
    except BaseException as exc:  # recorded; the next case runs
        results[fn.__name__] = f"{type(exc).__name__}: {exc}"
    return fn


def table(rows=ROWS, dim=DIM):
    torch.manual_seed(7)  # the same start on every rank and in the reference
    return nn.Embedding(rows, dim, sparse=True)


def named(model):
    return [(f"sparse.{n}", p) for n, p in model.named_parameters()]


def record(name, model):
    params[name] = [v for p in model.parameters() for v in p.detach().reshape(-1).tolist()]


def backward_touched(model, r, passes=(0, 1)):
    for i in passes:
        (model(torch.tensor(TOUCHED[r][i])).sum() * SIGN[r]).backward()


def reference_grad():
    """What a dense all-reduce averages: every rank's gradient of both passes, over the ranks."""
    ref = nn.Embedding(ROWS, DIM)
    for r in range(size):
        backward_touched(ref, r)
    return ref.weight.grad / size


def learn_step(opt, model):
    """The first step: every gradient travels in its bucket while the optimizer learns which are sparse."""
    opt.zero_grad()
    backward_touched(model, rank)
    opt.step()


@case
def rows_touched_differ_and_overlap():
    model = table()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named(model),
                                   backward_passes_per_step=2)
    learn_step(opt, model)
    assert isinstance(opt._buckets, SparseGradients) and model.weight in opt._buckets.rows, "not sent as rows"
    opt.zero_grad()
    backward_touched(model, rank)
    opt.synchronize()
    grad = model.weight.grad
    assert grad.is_sparse and grad.is_coalesced(), grad
    assert grad.indices()[0].tolist() == [1, 3, 5, 7, 9], grad.indices()  # the union, row 3 (sum 0) included
    assert torch.allclose(grad.to_dense(), reference_grad(), atol=1e-6), (grad.to_dense(), reference_grad())
    with opt.skip_synchronize():
        opt.step()
    opt.zero_grad()
    if rank == 0:  # a rank without a gradient sends no rows: the other's come back
        backward_touched(model, rank)
    opt.step()
    alone = nn.Embedding(ROWS, DIM)
    backward_touched(alone, 0)
    assert model.weight.grad.indices()[0].tolist() == [1, 3, 5], model.weight.grad
    assert torch.allclose(model.weight.grad.to_dense(), alone.weight.grad / size, atol=1e-6), model.weight.grad
    record("rows", model)


def train(name, head, make, steps=5, batch=6, tolerance=1e-5):
    """Distributed on this rank's share vs one process on the combined batch: the same parameters."""
    model, ref = table(20, 4), table(20, 4)
    ref.weight.data.copy_(model.weight.data)
    gen = torch.Generator().manual_seed(3)
    opt = hvd.DistributedOptimizer(make(model.parameters()), named_parameters=named(model))
    ref_opt = make(ref.parameters())
    for _ in range(steps):
        x = torch.randint(0, 20, (batch * size,), generator=gen)
        y = torch.randn(batch * size, generator=gen)
        share = slice(rank * batch, (rank + 1) * batch)
        opt.zero_grad()
        F.mse_loss(head(model(x[share])), y[share]).backward()
        opt.step()
        ref_opt.zero_grad()
        F.mse_loss(head(ref(x)), y).backward()
        ref_opt.step()
    gap = (model.weight - ref.weight).abs().max().item()
    assert gap < tolerance, (name, gap)
    assert (model.weight - table(20, 4).weight).abs().max().item() > 1e-3, "nothing trained"
    assert model.weight in opt._buckets.rows, "not sent as rows"
    record(name, model)


@case
def sgd_five_steps_match_one_process():
    torch.manual_seed(11)
    head = nn.Linear(4, 1)
    train("sgd", lambda t: head(t).squeeze(1), lambda ps: torch.optim.SGD(ps, lr=0.5))


@case
def sparse_adam_five_steps_match_one_process():
    proj = torch.tensor([0.5, -1.0, 2.0, 0.25])
    train("sparse_adam", lambda t: t @ proj, lambda ps: torch.optim.SparseAdam(list(ps), lr=0.05))


@case
def sparse_as_dense_still_dense():
    model = table()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named(model),
                                   backward_passes_per_step=2, sparse_as_dense=True)
    assert type(opt._buckets) is GradientBuckets, type(opt._buckets)
    for _ in range(2):
        learn_step(opt, model)
    grad = model.weight.grad
    assert grad.is_sparse and torch.allclose(grad.to_dense(), reference_grad(), atol=1e-6), grad
    assert grad.coalesce().indices()[0].tolist() == [1, 5, 7, 9], grad  # dense: row 3's zero sum is no row
    record("as_dense", model)


@case
def bfloat16_rows_travel_dense_where_the_servers_keep_rows():
    """The servers' row-sparse keys hold no bfloat16: such a gradient stays in its bucket there (gathered at -s 0)."""
    model = table().to(torch.bfloat16)  # one pass a step, no local step: torch's CPU adds no bfloat16 sparse tensors
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named(model))
    for _ in range(2):
        opt.zero_grad()
        backward_touched(model, rank, passes=(0,))
        opt.synchronize()
    assert (model.weight in opt._buckets.rows) is not runtime.current().servers, opt._buckets.rows
    ref = nn.Embedding(ROWS, DIM)
    for r in range(size):
        backward_touched(ref, r, passes=(0,))
    grad = model.weight.grad
    assert grad.is_sparse and torch.equal(grad.to_dense().float(), ref.weight.grad / size), grad


@case
def row_id_out_of_range_fails_on_both_ranks():
    model = table()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named(model),
                                   backward_passes_per_step=2)
    learn_step(opt, model)
    opt.zero_grad()
    if rank == 0:
        model.weight.grad = torch.sparse_coo_tensor(torch.tensor([[2, ROWS + 3]]), torch.ones(2, DIM), (ROWS, DIM),
                                                    check_invariants=False)
    else:
        backward_touched(model, rank)
    began = time.monotonic()
    try:
        opt.synchronize()
        raise AssertionError("the exchange did not fail")
    except (pskv.InvalidArgumentError, pskv.CollectiveFailedError) as exc:
        assert time.monotonic() - began < 20, f"not at once: {time.monotonic() - began:.1f} s"
        if rank == 0:
            assert isinstance(exc, pskv.InvalidArgumentError) and "out of range" in str(exc), exc
        else:
            assert isinstance(exc, pskv.CollectiveFailedError), exc
        assert "'sparse.weight'" in str(exc), exc
    opt.zero_grad()  # the next step works on both ranks
    backward_touched(model, rank)
    opt.synchronize()
    assert torch.allclose(model.weight.grad.to_dense(), reference_grad(), atol=1e-6), model.weight.grad
    with opt.skip_synchronize():
        opt.step()
    record("after_error", model)


torch.set_rng_state(rng)
results["rank"], results["params"] = rank, params
with open(f"{sys.argv[1]}/rank-{rank}.json", "w") as f:
    json.dump(results, f)
hvd.shutdown()
