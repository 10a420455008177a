"""The launched 2-rank job of tests/torch/test_server_update.py: run by tests/torch/launched.py, one JSON per rank."""

import torch
import torch.nn.functional as F
from torch import nn

import pskv
import pskv.torch as hvd
from tests.torch.cases import Cases

hvd.init()
rank, size = hvd.rank(), hvd.size()
cases = Cases()
case = cases.case

def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))

def batches(count, per_rank=3):
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(per_rank * size, 5, generator=gen), torch.randn(per_rank * size, 3, generator=gen))
            for _ in range(count)]

def mine(t):
    share = len(t) // size
    return t[rank * share:(rank + 1) * share]

def gap(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a.parameters(), b.parameters()))

def train(name, make, make_ref=None, steps=4, passes=1, schedule=False, seed=0, given=None):
    """update_on_kvstore=True on this rank's share vs torch.optim in one process on the combined batch."""
    model, ref = mlp(seed), mlp(0)
    inner = given if given is not None else make(model.parameters())
    opt = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes, update_on_kvstore=True)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # Horovod's order: after wrapping
    ref_opt = (make_ref or make)(ref.parameters())
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5) for o in (opt, ref_opt)] if schedule else []
    data = batches(steps * passes)
    for step in range(steps):
        opt.zero_grad()
        ref_opt.zero_grad()
        for x, y in data[step * passes:(step + 1) * passes]:
            (F.mse_loss(model(mine(x)), mine(y)) / passes).backward()
            (F.mse_loss(ref(x), y) / passes).backward()
        opt.step()
        ref_opt.step()
        for s in scheds:
            s.step()
    assert gap(model, ref) < 1e-5, (name, gap(model, ref))
    assert gap(model, mlp(0)) > 1e-3, "nothing trained"
    assert not opt.state, "a local optimizer state: the step ran here"
    cases.record(name, model)

def sgd(ps):
    return torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01)

@case
def rank_0_parameters_broadcast_after_wrapping_are_the_start():
    train("seeded", sgd, seed=rank)  # rank 1 starts elsewhere: the servers start from rank 0's after broadcast

@case
def sgd_momentum_matches_one_process():
    train("sgd", sgd)

@case
def nesterov_matches_one_process():
    train("nesterov", lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.8, nesterov=True))

@case
def adam_matches_one_process():
    train("adam", lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.01))

@case
def adamw_matches_one_process():
    train("adamw", lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1))

@case
def lr_schedule_is_forwarded():
    train("schedule", sgd, schedule=True)

@case
def param_groups_keep_their_lr():
    def groups(ps):
        ps = list(ps)
        return torch.optim.SGD([{"params": ps[:2]}, {"params": ps[2:], "lr": 0.02, "weight_decay": 0.1}],
                               lr=0.1, momentum=0.9)
    train("groups", groups)

@case
def a_pskv_optimizer_runs_as_given():
    given = pskv.optimizer.create("sgd", learning_rate=0.1, momentum=0.9, wd=0.01)
    train("pskv_sgd", sgd, given=given)

@case
def backward_passes_per_step_accumulates():
    train("passes", sgd, passes=2)

@case
def too_many_backward_passes_raise():
    model = mlp()
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), named_parameters=model.named_parameters(),
                                   update_on_kvstore=True)
    (x, y), = batches(1)
    F.mse_loss(model(mine(x)), mine(y)).backward()
    try:
        F.mse_loss(model(mine(x)), mine(y)).backward()
        raise RuntimeError("a second backward pass was accepted")
    except AssertionError as exc:
        assert "more than backward_passes_per_step" in str(exc), exc
    opt.step()

@case
def an_unmappable_optimizer_is_refused():
    model = mlp()
    try:
        hvd.DistributedOptimizer(torch.optim.RMSprop(model.parameters()), named_parameters=model.named_parameters(),
                                 update_on_kvstore=True)
        raise RuntimeError("RMSprop was accepted")
    except pskv.InvalidArgumentError as exc:
        assert "torch.optim.RMSprop" in str(exc) and "update_on_kvstore=False" in str(exc), exc

@case
def two_models_with_their_own_lr_share_the_servers():
    """Two wrappers at once (two models, lr 0.1 and 0.05): the servers' one optimizer keeps each key's lr."""
    def slow(ps):
        return torch.optim.SGD(ps, lr=0.05, momentum=0.9)
    pairs = [(mlp(), mlp(), sgd), (mlp(), mlp(), slow)]
    opts = [(hvd.DistributedOptimizer(make(m.parameters()), named_parameters=m.named_parameters(),
                                      update_on_kvstore=True), make(r.parameters())) for m, r, make in pairs]
    for x, y in batches(3):
        for (model, ref, _), (opt, ref_opt) in zip(pairs, opts):
            opt.zero_grad()
            F.mse_loss(model(mine(x)), mine(y)).backward()
            opt.step()
            ref_opt.zero_grad()
            F.mse_loss(ref(x), y).backward()
            ref_opt.step()
    for model, ref, _ in pairs:
        assert gap(model, ref) < 1e-5, gap(model, ref)

@case
def another_optimizer_supersedes_a_live_wrapper():
    first, second = mlp(), mlp()
    opts = [hvd.DistributedOptimizer(sgd(first.parameters()), named_parameters=first.named_parameters(),
                                     update_on_kvstore=True),
            hvd.DistributedOptimizer(torch.optim.Adam(second.parameters()),
                                     named_parameters=second.named_parameters(), update_on_kvstore=True)]
    (x, y), = batches(1)
    for model, opt in zip((first, second), opts):
        F.mse_loss(model(mine(x)), mine(y)).backward()
        opt.step()
    try:
        F.mse_loss(first(mine(x)), mine(y)).backward()
        raise RuntimeError("the SGD wrapper stepped on Adam's servers")
    except pskv.InvalidArgumentError as exc:
        assert "a later wrapper had the servers run another optimizer" in str(exc), exc

@case
def allreduce_names_new_and_old_still_sum_while_the_servers_run_an_optimizer():
    """pskv.torch declares its all-reduce keys ``summed``: the servers' optimizer never touches them."""
    fresh = hvd.allreduce(torch.full((3,), float(rank + 1)), name="metric.after_the_optimizer", op=hvd.Sum)
    assert fresh.tolist() == [3.0] * 3, fresh
    again = hvd.allreduce(torch.full((3,), float(rank + 1)), name="metric.after_the_optimizer")
    assert again.tolist() == [1.5] * 3, again

cases.write(rank, params=cases.params)
hvd.shutdown()
