"""The launched 2-rank job of tests/torch/test_sparse.py: sparse gradients of ``DistributedOptimizer`` as rows.

Run on every rank as ``python job_sparse.py OUTDIR`` under ``pskv launch -n 2 -s S`` (``-s 1``: the rows
go through the servers' row-sparse keys; ``-s 0``: they are gathered on the all-reduce store); each
case records "ok" or its error in ``OUTDIR/rank-R.json``, with the parameters it trained (through
tests/torch/cases.py). It may run
after other job scripts in the same process (tests/torch/run_scripts.py): it sets its own seeds and
names its parameters ``sparse.*``.
"""

import math
import time

import torch
import torch.nn.functional as F
from torch import nn

import pskv
import pskv.torch as hvd
from pskv.torch import ops, runtime
from pskv.torch.buckets import GradientBuckets
from pskv.torch.sparse import SparseGradients
from tests.torch.cases import Cases

hvd.init()
rank, size = hvd.rank(), hvd.size()
rng = torch.get_rng_state()  # given back at the end: the next script of the process draws as if alone
cases = Cases()
case, record = cases.case, cases.record
ROWS, DIM = 12, 3
TOUCHED = {0: [[1, 3], [5]], 1: [[3, 7], [9, 9]]}  # each rank's rows in two backward passes: row 3 by both
SIGN = {0: 1.0, 1: -1.0}  # so row 3's sum is zero: still one of the rows that come back


def table(rows=ROWS, dim=DIM):
    torch.manual_seed(7)  # the same start on every rank and in the reference
    return nn.Embedding(rows, dim, sparse=True)


def named(model):
    return [(f"sparse.{n}", p) for n, p in model.named_parameters()]


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
    """The first step: the ranks agree at the first gradient hook which gradients travel as rows."""
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


class Lookup(nn.Module):
    def __init__(self, rows):
        super().__init__()
        torch.manual_seed(5)
        self.table, self.head = nn.Embedding(rows, 8, sparse=True), nn.Linear(8, 1)

    def forward(self, ids):
        return self.head(self.table(ids)).sum()


@case
def the_first_step_sends_rows_not_the_table():
    """No bucket of the first step carries the table (it used to travel dense, whole), the head's leaves during
    backward, and the step equals a dense all-reduce; through the servers, far fewer bytes than the table's."""
    model, ref = Lookup(4096), Lookup(4096)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named(model))
    job, sent = runtime.current(), []
    counters = job.store._worker.client.counters if job.servers else None
    real = ops.grouped_allreduce_async_
    ops.grouped_allreduce_async_ = lambda tensors, *a, **kw: sent.append(sum(t.numel() for t in tensors)) or \
        real(tensors, *a, **kw)
    try:
        out_before = counters.bytes_out if counters else 0
        model(torch.tensor(TOUCHED[rank][0])).backward()
        left_in_backward = opt._buckets.sent
        opt.synchronize()
        out = counters.bytes_out - out_before if counters else 0
    finally:
        ops.grouped_allreduce_async_ = real
    table_numel = model.table.weight.numel()
    assert sent and max(sent) < table_numel, sent  # the head's bucket only
    assert left_in_backward == 1 and model.table.weight in opt._buckets.rows, (left_in_backward, opt._buckets.rows)
    assert out < table_numel, (out, table_numel * 4)  # bytes: under a quarter of the float32 table's
    declared = [shape for _, shape in ops._names(job).keys.values()] if job.servers else []
    assert all(math.prod(shape) < table_numel for shape in declared), declared  # no dense copy on the servers
    for r in range(size):
        ref(torch.tensor(TOUCHED[r][0])).backward()
    assert model.table.weight.grad.is_sparse, model.table.weight.grad
    assert torch.allclose(model.table.weight.grad.to_dense(), ref.table.weight.grad.to_dense() / size, atol=1e-6)
    assert torch.allclose(model.head.weight.grad, ref.head.weight.grad / size, atol=1e-6)
    with opt.skip_synchronize():
        opt.step()


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
cases.write(rank, params=cases.params, seconds=cases.seconds)
hvd.shutdown()
