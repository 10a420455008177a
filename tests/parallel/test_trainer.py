"""Trainer: MXNet's update_on_kvstore rules, and training equal to one big batch (local and dist_sync)."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

import pskv  # noqa: E402
from pskv.parallel import DataParallelExecutorGroup, Trainer  # noqa: E402
from pskv.testing import InProcessCluster  # noqa: E402

OPTIMIZERS = [
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3}),
    ("adam", {"learning_rate": 0.01}),
]
B, STEPS = 6, 4


def make_model(seed: int = 0) -> torch.nn.Module:
    """A small MLP initialised from its own generator (workers run as threads: no global seed)."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3)
    return model


def dataset(n: int = 2 * B * STEPS) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.randn(n, 8, dtype=torch.float64, generator=g), torch.randint(0, 3, (n,), generator=g)


def make_group(devices: list[str], batch: int, model: torch.nn.Module | None = None, **kw) -> DataParallelExecutorGroup:
    return DataParallelExecutorGroup(model if model is not None else make_model(), devices,
                                     loss=torch.nn.CrossEntropyLoss(), data_shapes=[("data", (batch, 8))], **kw)


def reference(opt: str, params: dict, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One process, one device, the whole batch, optimizer run locally (no store)."""
    g = make_group(["cpu"], len(batches[0][0]))
    t = Trainer(g, opt, params, kvstore=None)
    for batch in batches:
        g.forward(batch)
        g.backward()
        t.step()
    return g.get_params()[0]


def assert_same(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=1e-8, msg=name)
        assert not torch.equal(ref[name], make_model().state_dict()[name]) or name.endswith("bias"), "no training?"


@pytest.mark.parametrize("update_on_kvstore", [True, False])
@pytest.mark.parametrize(("opt", "params"), OPTIMIZERS)
def test_two_devices_match_one_device(opt, params, update_on_kvstore):
    x, y = dataset()
    batches = [(x[i:i + 2 * B], y[i:i + 2 * B]) for i in range(0, len(x), 2 * B)]
    ref = reference(opt, params, batches)
    g = make_group(["cpu", "cpu"], 2 * B, workload=[1, 2])
    with Trainer(g, opt, params, kvstore="device", update_on_kvstore=update_on_kvstore) as t:
        assert t.update_on_kvstore is update_on_kvstore and t.overlap
        for batch in batches:
            g.forward(batch)
            g.backward()
            t.step()
    assert_same(g.get_params()[0], ref)


@pytest.mark.parametrize("update_on_kvstore", [True, False])
@pytest.mark.parametrize(("opt", "params"), OPTIMIZERS)
def test_dist_sync_two_workers_match_one_process_with_the_double_batch(opt, params, update_on_kvstore):
    x, y = dataset()
    batches = [(x[i:i + 2 * B], y[i:i + 2 * B]) for i in range(0, len(x), 2 * B)]
    ref = reference(opt, params, batches)

    def worker(cfg):
        kv = pskv.create("dist_sync", cluster=cfg)
        try:
            g = make_group(["cpu"], B, model=make_model(seed=kv.rank))  # different inits: broadcast fixes them
            t = Trainer(g, opt, params, kvstore=kv, update_on_kvstore=update_on_kvstore, bucket_bytes=256)
            assert t.update_on_kvstore is update_on_kvstore
            for bx, by in batches:  # worker r takes the samples r, r+2, ... of every global batch
                g.forward((bx[kv.rank::2], by[kv.rank::2]))
                g.backward()
                t.step()
            t.close()
            return g.get_params()[0]
        finally:
            kv.close()

    with InProcessCluster(2, 2, deadline=30) as cluster:
        results = cluster.run_workers(worker)
    for got in results:
        assert_same(got, ref)


@pytest.mark.parametrize(("opt", "params"), OPTIMIZERS)
def test_buckets_cut_into_chunk_keys_train_as_whole_ones(opt, params):
    """With the optimizer on the servers, a bucket bigger than one piece per server travels as chunk keys
    (pskv/parallel/chunks.py: each chunk is updated and answered as its pushes complete): same result."""
    x, y = dataset()
    batches = [(x[i:i + 2 * B], y[i:i + 2 * B]) for i in range(0, len(x), 2 * B)]
    ref = reference(opt, params, batches)

    def worker(cfg):
        kv = pskv.create("dist_sync", cluster=dataclasses.replace(cfg, part_bytes=128))  # chunks of 2 x 128 bytes
        try:
            g = make_group(["cpu"], B, model=make_model(seed=kv.rank))
            t = Trainer(g, opt, params, kvstore=kv, update_on_kvstore=True)
            for bx, by in batches:
                g.forward((bx[kv.rank::2], by[kv.rank::2]))
                g.backward()
                t.step()
            sizes = t.key_sizes
            t.close()
            return g.get_params()[0], sizes
        finally:
            kv.close()

    with InProcessCluster(2, 2, deadline=30) as cluster:
        results = cluster.run_workers(worker)
    for got, sizes in results:
        assert _seven_chunks(sizes), sizes
        assert_same(got, ref)


def _seven_chunks(sizes: dict[str, tuple[int, int]]) -> bool:
    """The one bucket of the model (195 float64) went as 7 chunks of at most 32 elements."""
    return sorted(sizes) == [f"bucket0#{c}" for c in range(7)] and sum(n for n, _ in sizes.values()) == 195


def test_plain_module_trainer_with_step_batch_size():
    x, y = dataset()
    batches = [(x[i:i + 2 * B], y[i:i + 2 * B]) for i in range(0, len(x), 2 * B)]
    ref = reference("sgd", OPTIMIZERS[0][1], batches)
    model = make_model()
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
    t = Trainer(model, "sgd", OPTIMIZERS[0][1], kvstore=None)
    for bx, by in batches:
        model.zero_grad()
        loss_fn(model(bx), by).backward()
        t.step(len(bx))
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), ref[name], rtol=1e-5, atol=1e-8)
    with pytest.raises(pskv.InvalidArgumentError, match="batch size"):
        t.step()


def test_a_smaller_last_batch_is_rescaled_also_when_the_store_runs_the_optimizer():
    x, y = dataset()
    batches = [(x[:12], y[:12]), (x[12:17], y[12:17]), (x[17:29], y[17:29])]
    ref = reference("sgd", OPTIMIZERS[0][1], batches)
    g = make_group(["cpu", "cpu"], 12)
    with Trainer(g, "sgd", OPTIMIZERS[0][1], kvstore="local", update_on_kvstore=True) as t:
        for batch in batches:
            g.forward(batch)
            g.backward()
            t.step()
    assert_same(g.get_params()[0], ref)


def test_gradients_leave_during_backward_in_buckets():
    x, y = dataset()
    g = make_group(["cpu", "cpu"], 2 * B)
    t = Trainer(g, "sgd", {"learning_rate": 0.1}, kvstore="local", bucket_bytes=0)
    assert [len(b) for b in t._buckets] == [1, 1, 1, 1]
    assert t._buckets[0] == [3]  # the last layer's bias is sent first
    g.forward((x[:2 * B], y[:2 * B]))
    g.backward()
    assert len(t._handles) == 4  # every key already on its way before step()
    t.step()
    assert t._handles == []
    big = Trainer(make_group(["cpu"], B), "sgd", kvstore="local", bucket_bytes=1 << 20)
    assert len(big._buckets) == 1


def test_a_bucket_closes_at_the_parameter_that_crosses_its_size():
    # float64, reverse order: 2.bias 24 B, 2.weight 384 B, 0.bias 128 B, 0.weight 1024 B
    x, y = dataset()
    g = make_group(["cpu", "cpu"], 2 * B)
    t = Trainer(g, "sgd", {"learning_rate": 0.1}, kvstore="local", bucket_bytes=400)
    # 24 + 384 >= 400 closes the first bucket; no small parameter is left in a round of its own
    assert t._buckets == [[3, 2], [1, 0]]
    assert t.keys == ["bucket0", "bucket1"]
    g.forward((x[:2 * B], y[:2 * B]))
    g.backward()
    assert len(t._handles) == 2
    t.step()
    one = Trainer(make_group(["cpu"], B), "sgd", kvstore="local", bucket_bytes=1)
    assert one._buckets == [[3], [2], [1], [0]]  # every parameter reaches a 1-byte cap by itself


def test_grad_req_add_waits_for_step_and_accumulates():
    x, y = dataset()
    g = make_group(["cpu", "cpu"], 2 * B, grad_req="add")
    t = Trainer(g, "sgd", {"learning_rate": 0.1}, kvstore="local")
    assert not t.overlap
    g.forward((x[:2 * B], y[:2 * B]))
    g.backward()
    assert t._handles == []


def test_update_on_kvstore_rules():
    g = make_group(["cpu", "cpu"], B)
    with pytest.raises(pskv.InvalidArgumentError, match="need a store"):
        Trainer(g, "sgd", kvstore=None)
    single = Trainer(make_group(["cpu"], B), "sgd", kvstore="local")
    assert single.kvstore is None and single.update_on_kvstore is False  # one device: nothing to sum
    with pytest.raises(pskv.InvalidArgumentError, match="needs a store"):
        Trainer(make_group(["cpu"], B), "sgd", kvstore="device", update_on_kvstore=True)
    with pytest.raises(pskv.InvalidArgumentError, match="optimizer_params"):
        Trainer(g, pskv.optimizer.SGD(), {"learning_rate": 1.0}, kvstore="local")
    with pytest.raises(pskv.InvalidTypeError):
        Trainer("model", "sgd")
    t = Trainer(g, "sgd", kvstore="local")
    assert t.update_on_kvstore is True
    t.close()



@pytest.mark.parametrize(("store", "forced", "impossible", "message"), [
    ("dist_async", True, False, "async"),
    ("byteps", False, True, "cannot run an optimizer"),
])
def test_update_on_kvstore_is_forced_by_the_store_type(store, forced, impossible, message):
    def worker(cfg):
        kv = pskv.create(store, cluster=cfg)
        try:
            model = make_group(["cpu"], B)
            with pytest.raises(pskv.InvalidArgumentError, match=message):
                Trainer(model, "sgd", kvstore=kv, update_on_kvstore=impossible)
            return Trainer(model, "sgd", kvstore=kv).update_on_kvstore
        finally:
            kv.close()

    with InProcessCluster(1, 1, deadline=30) as cluster:
        assert cluster.run_workers(worker) == [forced]


def test_store_errors_reach_step():
    x, y = dataset()
    kv = pskv.create("local")
    g = make_group(["cpu", "cpu"], 2 * B)
    t = Trainer(g, "sgd", kvstore=kv)
    g.forward((x[:2 * B], y[:2 * B]))
    kv.close()
    g.backward()  # sends fail inside autograd hooks: kept, raised by step()
    with pytest.raises(pskv.StoreClosedError):
        t.step()


def test_set_learning_rate_reaches_the_store():
    x, y = dataset()
    g = make_group(["cpu", "cpu"], 2 * B)
    t = Trainer(g, "sgd", {"learning_rate": 0.1}, kvstore="local")
    g.forward((x[:2 * B], y[:2 * B]))
    t.set_learning_rate(0.0)
    before = g.get_params()[0]
    g.backward()
    t.step()
    after = g.get_params()[0]
    for name in before:
        torch.testing.assert_close(after[name], before[name])
    assert t.learning_rate == 0.0


def test_buckets_are_flat_keys_and_per_parameter_multipliers_keep_one_key_per_parameter():
    x, y = dataset()
    g = make_group(["cpu", "cpu"], 2 * B)
    t = Trainer(g, "sgd", {"learning_rate": 0.1}, kvstore="local", prefix="net.")
    assert t.keys == ["net.bucket0"]  # the whole small model in one flat key
    flat = t._weights[0][1]
    p = g.param_arrays[0][1]
    assert flat.data_ptr() <= p.data_ptr() < flat.data_ptr() + flat.numel() * flat.element_size()

    opt = pskv.optimizer.SGD(learning_rate=0.1)
    opt.set_lr_mult({"net.0.weight": 0.0})  # multipliers are keyed by parameter
    g2 = make_group(["cpu", "cpu"], 2 * B)
    t2 = Trainer(g2, opt, kvstore="local", prefix="net.")
    assert sorted(t2.keys) == ["net.0.bias", "net.0.weight", "net.2.bias", "net.2.weight"]
    frozen = g2.param_arrays[0][0].detach().clone()
    g2.forward((x[:2 * B], y[:2 * B]))
    g2.backward()
    t2.step()
    assert torch.equal(g2.param_arrays[0][0].detach(), frozen)
    assert not torch.equal(g2.param_arrays[2][0].detach(), make_model().state_dict()["2.weight"])
