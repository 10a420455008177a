"""``DistributedOptimizer(..., update_on_kvstore=True)``: the servers run the optimizer (pskv/torch/server_update.py).

In this process: the mapping of ``torch.optim`` optimizers to pskv's, run the way a server runs
it (an updater over NumPy arrays), equals ``torch.optim``'s own steps, with LR changes and two
param groups; what is refused, and why; the all-reduce store refuses the option. Under
``pskv launch -n 2 -s 1`` (one job, every case, one JSON per rank): training equals one process
on the combined batch (1e-5) for SGD (momentum, Nesterov, weight decay), Adam, AdamW, an LR
schedule, param groups, a pskv optimizer given directly and accumulation; both ranks end
with the same parameters; nothing runs locally (no optimizer state on the worker).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pskv  # noqa: E402
import pskv.torch as hvd  # noqa: E402
from pskv.optimizer import get_updater  # noqa: E402
from pskv.torch.server_update import pskv_optimizer_for  # noqa: E402
from tests.torch.launched import Outcomes, assert_case, run_jobs  # noqa: E402

pytestmark = pytest.mark.timeout(240)  # the module fixture (the launched job) is charged to the first test

JOB_DEADLINE = 150

MAPPED: dict[str, Callable[[list[dict[str, Any]]], Any]] = {
    "sgd": lambda groups: torch.optim.SGD(groups, lr=0.1),
    "sgd_momentum_wd": lambda groups: torch.optim.SGD(groups, lr=0.1, momentum=0.9, weight_decay=0.01),
    "nesterov": lambda groups: torch.optim.SGD(groups, lr=0.1, momentum=0.8, nesterov=True, weight_decay=0.02),
    "adam_wd": lambda groups: torch.optim.Adam(groups, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01),
    "adamw": lambda groups: torch.optim.AdamW(groups, lr=0.01, weight_decay=0.1),
}


@pytest.mark.parametrize("which", list(MAPPED))
def test_a_mapped_optimizer_on_the_servers_equals_torch(which: str) -> None:
    """The servers' update (NumPy, rescaled sum of 2 workers) = torch.optim's on the average, over
    LR changes and two param groups with their own lr and weight_decay."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.randn(4, 3, generator=gen, requires_grad=True), torch.randn(5, generator=gen, requires_grad=True)]
    groups: list[dict[str, Any]] = [{"params": [params[0]]}, {"params": [params[1]], "lr": 0.05, "weight_decay": 0.03}]
    local = MAPPED[which](groups)
    keys = {p: f"k{i}" for i, p in enumerate(params)}
    weights = [p.detach().numpy().copy() for p in params]
    served = pskv_optimizer_for(local, keys)
    served.rescale_grad = 0.5
    update = get_updater(served)
    for step in range(5):
        if step == 3:  # an LR scheduler's change: a new optimizer config, the state kept
            for group in local.param_groups:
                group["lr"] *= 0.5
            served.set_lr_mult(pskv_optimizer_for(local, keys).lr_mult)
        pushed = [torch.randn(p.shape, generator=gen) for p in params for _ in range(2)]
        sums = [pushed[2 * i] + pushed[2 * i + 1] for i in range(len(params))]
        for p, s in zip(params, sums):
            p.grad = s / 2
        local.step()
        update(list(keys.values()), [s.numpy() for s in sums], weights)
        for p, w in zip(params, weights):
            np.testing.assert_allclose(w, p.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("make", "named"), [
    (lambda ps: torch.optim.RMSprop(ps, lr=0.1), "maps SGD, Adam and AdamW"),
    (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.1), "dampening"),
    (lambda ps: torch.optim.Adam(ps, lr=0.1, amsgrad=True), "amsgrad"),
    (lambda ps: torch.optim.SGD(ps, lr=0.1, maximize=True), "maximize"),
    (lambda ps: torch.optim.SGD([{"params": ps[:1]}, {"params": ps[1:], "momentum": 0.5}], lr=0.1), "'momentum'"),
])
def test_what_pskv_cannot_run_is_refused_naming_the_way_out(make: Callable[[list[Any]], Any], named: str) -> None:
    params = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))]
    optimizer = make(params)
    with pytest.raises(pskv.InvalidArgumentError, match=r"update_on_kvstore=True: pskv's servers cannot run "
                       rf"torch\.optim\.{type(optimizer).__name__} .*{named}.*pass update_on_kvstore=False"):
        pskv_optimizer_for(optimizer, {p: str(i) for i, p in enumerate(params)})


@pytest.fixture
def one(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``hvd.init()`` in this process with no launcher's variables: the all-reduce store, a job of one."""
    for var in ("PSKV_TORCH_STORE", "DMLC_NUM_SERVER", "DMLC_ROLE", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                "DMLC_WORKER_ID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    hvd.init()
    yield
    hvd.shutdown()


def test_the_allreduce_store_refuses_it(one: None) -> None:
    model = torch.nn.Linear(2, 2)
    with pytest.raises(pskv.InvalidArgumentError, match=r"update_on_kvstore=True needs servers that run optimizers "
                       r".*'horovod' store only sums: pass update_on_kvstore=False"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(), update_on_kvstore=True)


JOB = textwrap.dedent(r'''
    import json, sys
    import torch
    import torch.nn.functional as F
    from torch import nn
    import pskv
    import pskv.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    results, params = {}, {}

    def case(fn):
        try:
            fn()
            results[fn.__name__] = "ok"
        except BaseException as exc:  # recorded; the next case runs
            results[fn.__name__] = f"{type(exc).__name__}: {exc}"
        return fn

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
        params[name] = [v for p in model.parameters() for v in p.detach().reshape(-1).tolist()]

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
        slow = lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)
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

    results["params"] = params
    with open(f"{sys.argv[1]}/rank-{rank}.json", "w") as f:
        json.dump(results, f)
    hvd.shutdown()
''')

CASES = ["rank_0_parameters_broadcast_after_wrapping_are_the_start", "sgd_momentum_matches_one_process",
         "nesterov_matches_one_process", "adam_matches_one_process", "adamw_matches_one_process",
         "lr_schedule_is_forwarded", "param_groups_keep_their_lr", "a_pskv_optimizer_runs_as_given",
         "backward_passes_per_step_accumulates", "too_many_backward_passes_raise", "an_unmappable_optimizer_is_refused",
         "two_models_with_their_own_lr_share_the_servers", "another_optimizer_supersedes_a_live_wrapper",
         "allreduce_names_new_and_old_still_sum_while_the_servers_run_an_optimizer"]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Outcomes:
    """JOB under ``pskv launch -n 2 -s 1``; each rank's outcomes."""
    return run_jobs(tmp_path_factory.mktemp("server_update"), JOB, {"dist_sync": 1}, JOB_DEADLINE)["dist_sync"]


@pytest.mark.parametrize("name", CASES)
def test_case_passes_on_both_ranks(job: Outcomes, name: str) -> None:
    assert_case(job, name)


def test_both_ranks_end_with_the_same_parameters(job: Outcomes) -> None:
    first, second = job[0]["params"], job[1]["params"]
    assert {"seeded", "sgd", "nesterov", "adam", "adamw", "schedule", "groups", "pskv_sgd", "passes"} <= set(first)
    assert first == second
