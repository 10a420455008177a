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

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pskv  # noqa: E402
import pskv.torch as hvd  # noqa: E402
from pskv.optimizer import get_updater  # noqa: E402
from pskv.torch.server_update import pskv_optimizer_for  # noqa: E402
from tests.torch.launched import Outcomes, assert_case, shared_jobs  # noqa: E402

pytestmark = pytest.mark.timeout(420)  # the first test waits for the shared jobs (tests/torch/launched.py)


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



CASES = ["rank_0_parameters_broadcast_after_wrapping_are_the_start", "sgd_momentum_matches_one_process",
         "nesterov_matches_one_process", "adam_matches_one_process", "adamw_matches_one_process",
         "lr_schedule_is_forwarded", "param_groups_keep_their_lr", "a_pskv_optimizer_runs_as_given",
         "backward_passes_per_step_accumulates", "too_many_backward_passes_raise", "an_unmappable_optimizer_is_refused",
         "two_models_with_their_own_lr_share_the_servers", "another_optimizer_supersedes_a_live_wrapper",
         "allreduce_names_new_and_old_still_sum_while_the_servers_run_an_optimizer"]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Outcomes:
    """job_server_update.py under ``pskv launch -n 2 -s 1`` (in the shared job); each rank's outcomes."""
    return shared_jobs(tmp_path_factory)["dist_sync"]["server_update"]


@pytest.mark.parametrize("name", CASES)
def test_case_passes_on_both_ranks(job: Outcomes, name: str) -> None:
    assert_case(job, name)


def test_both_ranks_end_with_the_same_parameters(job: Outcomes) -> None:
    first, second = job[0]["params"], job[1]["params"]
    assert {"seeded", "sgd", "nesterov", "adam", "adamw", "schedule", "groups", "pskv_sgd", "passes"} <= set(first)
    assert first == second
