"""Trainer with a torch.optim optimizer: local steps on summed gradients (update_on_kvstore=False),
a clear refusal where the servers would have to run it, state saved without pickle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402
from torch.utils.data import DistributedSampler  # noqa: E402

import pskv  # noqa: E402
from pskv.parallel import DataParallelExecutorGroup, NDArrayIter, Trainer  # noqa: E402
from pskv.testing import InProcessCluster  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
B, STEPS = 6, 4
LR, MOMENTUM = 0.1, 0.9


def make_model(seed: int = 0) -> torch.nn.Module:
    """A small MLP from its own generator (workers run as threads: no global seed)."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3)
    return model


def global_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2 * B * STEPS, 8, dtype=torch.float64, generator=g)
    y = torch.randint(0, 3, (2 * B * STEPS,), generator=g)
    return [(x[i:i + 2 * B], y[i:i + 2 * B]) for i in range(0, len(x), 2 * B)]


def single_process_reference() -> dict[str, torch.Tensor]:
    """Plain PyTorch, one process, the combined batch, mean loss, torch.optim.SGD with momentum."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for x, y in global_batches():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_two_workers_with_torch_sgd_keep_identical_parameters_equal_to_one_process_on_the_combined_batch():
    ref = single_process_reference()

    def worker(cfg):
        kv = pskv.create("dist_sync", cluster=cfg)
        try:
            model = make_model(seed=kv.rank)  # different inits: the first forward broadcasts rank 0's
            group = DataParallelExecutorGroup(model, ["cpu"], loss=torch.nn.CrossEntropyLoss(),
                                              data_shapes=[("data", (B, 8))])
            opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
            with Trainer(group, opt, kvstore=kv, update_on_kvstore=False, bucket_bytes=256) as trainer:
                assert not trainer.update_on_kvstore and trainer.optimizer.torch_optimizer is opt
                for x, y in global_batches():  # worker r takes the samples r, r+2, ... of every global batch
                    group.forward((x[kv.rank::2], y[kv.rank::2]))
                    group.backward()
                    trainer.step()
                assert opt.state[next(model.parameters())]["momentum_buffer"] is not None
            return {n: p.detach().clone() for n, p in model.named_parameters()}
        finally:
            kv.close()

    with InProcessCluster(1, 2, deadline=30) as cluster:
        ranks = cluster.run_workers(worker)
    for name, want in ref.items():
        assert torch.equal(ranks[0][name], ranks[1][name]), f"{name} differs between the ranks"
        torch.testing.assert_close(ranks[0][name], want, rtol=0, atol=1e-6, msg=name)
        assert not torch.equal(want, make_model().state_dict()[name]), f"{name}: no training?"


def test_plain_module_with_torch_adam_and_no_store_equals_plain_pytorch():
    batches = global_batches()
    plain = make_model()
    plain_opt = torch.optim.Adam(plain.parameters(), lr=0.01)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    trainer = Trainer(model, opt, kvstore=None)
    assert trainer.learning_rate == 0.01
    for x, y in batches:
        for m, o in ((plain, plain_opt), (model, opt)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y, reduction="sum").backward()
        for p in plain.parameters():  # the mean over the batch, as the Trainer's rescale_grad makes it
            p.grad.mul_(1.0 / len(x))
        plain_opt.step()
        trainer.step(len(x))  # rescale_grad = 1 / batch, as for pskv optimizers
    for (name, got), want in zip(model.named_parameters(), plain.parameters()):
        torch.testing.assert_close(got.detach(), want.detach(), rtol=0, atol=1e-12, msg=name)


def test_two_devices_with_torch_sgd_step_device_0_and_copy_it_to_the_other():
    ref = single_process_reference()
    model = make_model()
    group = DataParallelExecutorGroup(model, ["cpu", "cpu"], loss=torch.nn.CrossEntropyLoss(), workload=[1, 2],
                                      data_shapes=[("data", (2 * B, 8))])
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    with Trainer(group, opt, kvstore="device", update_on_kvstore=False) as trainer:
        for batch in global_batches():
            group.forward(batch)
            group.backward()
            trainer.step()
    for name, want in ref.items():
        for replica in group.replicas:
            torch.testing.assert_close(dict(replica.named_parameters())[name].detach(), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("store", "update_on_kvstore", "why"), [
    ("dist_sync", True, "update_on_kvstore=True"),
    ("dist_sync", None, "True by default with store 'dist_sync'"),
    ("dist_async", None, "'dist_async' is asynchronous"),
])
def test_a_torch_optimizer_that_the_servers_would_have_to_run_is_refused_naming_the_ways_out(
        store, update_on_kvstore, why):
    def worker(kv):
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        with pytest.raises(pskv.InvalidArgumentError) as info:
            Trainer(model, opt, kvstore=kv, update_on_kvstore=update_on_kvstore)
        return str(info.value)

    with InProcessCluster(1, 1, deadline=30) as cluster:
        (message,) = cluster.run_stores(worker, store=store)
    assert "pskv cannot run a torch.optim optimizer (SGD) on the servers" in message
    assert why in message
    assert "update_on_kvstore=False" in message
    assert "pskv.torch.DistributedOptimizer(optimizer, named_parameters=" in message


def test_pskv_optimizers_keep_their_behaviour_and_other_objects_are_refused():
    model = make_model()
    with Trainer(model, "sgd", {"learning_rate": 0.1}, kvstore=pskv.create("local")) as trainer:
        assert trainer.update_on_kvstore  # the default with a store that runs optimizers, as before
    with pytest.raises(pskv.InvalidTypeError, match="torch.optim.Optimizer, got int"):
        Trainer(model, 3, kvstore=None)  # type: ignore[arg-type]
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    with pytest.raises(pskv.InvalidArgumentError, match="optimizer_params only go with an optimizer name"):
        Trainer(model, opt, {"learning_rate": 0.1}, kvstore=None)
    with pytest.raises(pskv.InvalidArgumentError, match="not parameters this Trainer trains"):
        Trainer(make_model(), opt, kvstore=None)  # built over another model


def test_torch_optimizer_state_round_trips_through_a_safetensors_file(tmp_path):
    x, y = global_batches()[0]
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.99))
    trainer = Trainer(model, opt, kvstore=None)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    trainer.step(1)
    trainer.save_states(str(tmp_path / "opt.safetensors"))
    assert (tmp_path / "opt.safetensors").read_bytes()[8:].lstrip().startswith(b"{")  # safetensors, no pickle
    fresh_model = make_model()
    fresh_opt = torch.optim.Adam(fresh_model.parameters(), lr=0.5)
    fresh = Trainer(fresh_model, fresh_opt, kvstore=None)
    fresh.load_states(str(tmp_path / "opt.safetensors"))
    assert fresh_opt.param_groups[0]["lr"] == 0.01 and tuple(fresh_opt.param_groups[0]["betas"]) == (0.8, 0.99)
    for p, q in zip(model.parameters(), fresh_model.parameters()):
        for name, value in opt.state[p].items():
            torch.testing.assert_close(fresh_opt.state[q][name], value, rtol=0, atol=0)
    other = torch.nn.Linear(8, 3)  # two parameters where the state has four
    with pytest.raises(pskv.OptimizerStateError, match="does not fit this Adam"):
        Trainer(other, torch.optim.Adam(other.parameters()), kvstore=None).load_states(str(tmp_path / "opt.safetensors"))


LAUNCHED_EPOCHS, LAUNCHED_N = 2, 48

LAUNCHED = textwrap.dedent(f"""
    import json, torch, pskv
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    from pskv.parallel import DataParallelExecutorGroup, Trainer

    kv = pskv.create("dist_sync")
    g = torch.Generator().manual_seed(5)
    x = torch.randn({LAUNCHED_N}, 8, dtype=torch.float64, generator=g)
    y = torch.randint(0, 3, ({LAUNCHED_N},), generator=g)
    ids = torch.arange({LAUNCHED_N})
    seen = []
    class Seen(TensorDataset):
        def __getitem__(self, i):
            seen.append(int(i))
            return super().__getitem__(i)
    data = Seen(x, y)
    loader = DataLoader(data, batch_size={B}, sampler=DistributedSampler(data, num_replicas=kv.num_workers,
                                                                         rank=kv.rank, shuffle=True, seed=2))
    torch.manual_seed(kv.rank)  # different initial weights: the Trainer broadcasts rank 0's
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).double()
    init = [p.detach().clone().tolist() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr={LR}, momentum={MOMENTUM})
    group = DataParallelExecutorGroup(model, ["cpu"], loss=torch.nn.CrossEntropyLoss())
    trainer = Trainer(group, opt, kvstore=kv, update_on_kvstore=False)
    trainer.fit(loader, num_epoch={LAUNCHED_EPOCHS}, progress=False)
    trainer.close()
    print("RESULT " + json.dumps({{"rank": kv.rank, "seen": seen, "init": init,
                                  "params": [p.detach().tolist() for p in model.parameters()]}}), flush=True)
    kv.close()
""")


def launched_reference(init: list, orders: list[list[list[int]]]) -> list[torch.Tensor]:
    """Plain PyTorch in one process: each step's batch is both ranks' batches of that step, combined."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(LAUNCHED_N, 8, dtype=torch.float64, generator=g)
    y = torch.randint(0, 3, (LAUNCHED_N,), generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).double()
    with torch.no_grad():
        for p, value in zip(model.parameters(), init):
            p.copy_(torch.tensor(value, dtype=torch.float64))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for epoch in range(LAUNCHED_EPOCHS):
        for t in range(0, len(orders[0][epoch]), B):
            idx = orders[0][epoch][t:t + B] + orders[1][epoch][t:t + B]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    return [p.detach() for p in model.parameters()]


@pytest.mark.slow  # a pskv launch job: seconds (marked here; conftest's SLOW_TESTS would do it too)
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_launched_job_fits_a_distributed_sampler_with_torch_sgd_like_one_process_on_the_combined_batch():
    argv = [sys.executable, "-m", "pskv", "launch", "-n", "2", "-s", "1", "--stop-grace", "2", "--timeout", "90",
            "--", sys.executable, "-c", LAUNCHED]
    res = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=110,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    results = sorted((json.loads(ln.split("RESULT ", 1)[1]) for ln in out.splitlines() if "RESULT " in ln),
                     key=lambda r: r["rank"])
    assert [r["rank"] for r in results] == [0, 1], out[-4000:]
    per_epoch = LAUNCHED_N // 2
    orders = [[r["seen"][e * per_epoch:(e + 1) * per_epoch] for e in range(LAUNCHED_EPOCHS)] for r in results]
    for rank in (0, 1):  # fit called the sampler's set_epoch: each epoch in DistributedSampler's own order
        for epoch in range(LAUNCHED_EPOCHS):
            sampler = DistributedSampler(range(LAUNCHED_N), num_replicas=2, rank=rank, shuffle=True, seed=2)
            sampler.set_epoch(epoch)
            assert orders[rank][epoch] == list(sampler), f"rank {rank} epoch {epoch}"
        assert orders[rank][0] != orders[rank][1]
    want = launched_reference(results[0]["init"], orders)
    for i, expected in enumerate(want):
        ranks = [torch.tensor(r["params"][i], dtype=torch.float64) for r in results]
        assert torch.equal(ranks[0], ranks[1]), f"parameter {i} differs between the ranks"
        torch.testing.assert_close(ranks[0], expected, rtol=0, atol=1e-6, msg=f"parameter {i}")


def test_fit_resumed_from_a_checkpoint_with_a_torch_optimizer_gives_the_uninterrupted_result(tmp_path):
    x, y = (t.numpy() for t in global_batches()[0])

    def setup() -> tuple[torch.nn.Module, Trainer]:
        model = make_model()
        group = DataParallelExecutorGroup(model, ["cpu"], loss=torch.nn.CrossEntropyLoss())
        return model, Trainer(group, torch.optim.Adam(model.parameters(), lr=0.01), kvstore=None)

    def data() -> NDArrayIter:
        return NDArrayIter(x, y, batch_size=4, shuffle=True, seed=1)

    straight, trainer = setup()
    trainer.fit(data(), num_epoch=4, progress=False)
    _, first = setup()
    first.fit(data(), num_epoch=2, checkpoint_dir=tmp_path, progress=False)
    resumed, again = setup()
    assert [h["epoch"] for h in again.fit(data(), num_epoch=4, checkpoint_dir=tmp_path, resume=True,
                                          progress=False)] == [2, 3]
    for (name, got), want in zip(resumed.named_parameters(), straight.parameters()):
        torch.testing.assert_close(got.detach(), want.detach(), rtol=0, atol=1e-12, msg=name)
