"""pskv.parallel.Embedding / EmbeddingBag: tables in the store, rows pulled and pushed, Trainer and fit, prefetch."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pskv  # noqa: E402
from pskv.parallel import (  # noqa: E402
    DataParallelExecutorGroup,
    Embedding,
    EmbeddingBag,
    NDArrayIter,
    PrefetchingIter,
    Trainer,
)

V, D, L, C, B, STEPS = 50, 4, 3, 3, 8, 5
OPTIMIZERS = [
    ("sgd", {"learning_rate": 0.5}),  # plain SGD: lazy and dense updates are the same
    ("sgd", {"learning_rate": 0.2, "momentum": 0.9, "wd": 1e-3, "lazy_update": False}),
    ("adam", {"learning_rate": 0.05, "lazy_update": False}),
]


def table0() -> torch.Tensor:
    return torch.randn(V, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


class Net(torch.nn.Module):
    """Ids (B, L) -> an embedding per id -> an MLP over their concatenation."""

    def __init__(self, emb: torch.nn.Module) -> None:
        super().__init__()
        self.emb = emb
        self.mlp = torch.nn.Sequential(torch.nn.Linear(L * D, 8), torch.nn.Tanh(), torch.nn.Linear(8, C)).double()
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for p in self.mlp.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.emb(x).flatten(1))


def dense_net() -> Net:
    emb = torch.nn.Embedding(V, D).double()
    with torch.no_grad():
        emb.weight.copy_(table0())
    return Net(emb)


def store_net(kv, key="emb") -> Net:
    return Net(Embedding(V, D, kv, key, init=table0(), dtype=torch.float64))


def dataset(n: int = B * STEPS, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, V, (n, L))
    x[:, 0] = rng.integers(0, 10, n)  # a few hot rows, repeated within batches
    return x, (x.sum(axis=1) % C)


def batches(x: np.ndarray, y: np.ndarray) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.from_numpy(x[i:i + B]), torch.from_numpy(y[i:i + B])) for i in range(0, len(x), B)]


def group_of(net: Net, devices=("cpu", "cpu")) -> DataParallelExecutorGroup:
    return DataParallelExecutorGroup(net, list(devices), loss=torch.nn.CrossEntropyLoss(), data_shapes=[("data", (B, L))])


def whole_table(net_or_emb) -> torch.Tensor:
    emb = net_or_emb.emb if isinstance(net_or_emb, Net) else net_or_emb
    return emb.table.rows(torch.arange(V))


def train(group, trainer, data) -> None:
    for batch in data:
        group.forward(batch)
        group.backward()
        trainer.step()


@pytest.mark.parametrize(("opt", "params"), OPTIMIZERS)
def test_trains_like_a_dense_embedding_in_two_replicas(opt, params):
    data = batches(*dataset())
    ref_group = group_of(dense_net())
    ref = Trainer(ref_group, opt, params, kvstore="local")
    train(ref_group, ref, data)

    kv = pskv.create("local")
    group = group_of(store_net(kv))
    t = Trainer(group, opt, params, kvstore=kv)
    assert t.update_on_kvstore and group.replicas[0].emb.table is group.replicas[1].emb.table
    assert "emb.weight" not in group.param_names  # the table is no parameter of the worker
    train(group, t, data)
    t.close()

    want = ref_group.get_params()[0]
    got = group.get_params()[0]
    for name in got:
        torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-12, msg=name)
    table = whole_table(group.replicas[0])
    torch.testing.assert_close(table, want["emb.weight"], rtol=1e-9, atol=1e-12)
    assert not torch.equal(table, table0())


@pytest.mark.parametrize("store", ["local", "device"])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_matches_torch(mode, store):
    kv = pskv.create(store)
    kv.set_optimizer(pskv.optimizer.create("sgd", learning_rate=0.3))
    bag = EmbeddingBag(V, D, kv, "bag", mode=mode, init=table0(), dtype=torch.float64)
    ref = torch.nn.EmbeddingBag(V, D, mode=mode).double()
    with torch.no_grad():
        ref.weight.copy_(table0())
    sgd = torch.optim.SGD(ref.parameters(), lr=0.3)
    rng = np.random.default_rng(4)
    for step in range(4):
        if step % 2:  # 1-D ids with offsets (per-sample weights with 'sum')
            ids = torch.from_numpy(rng.integers(0, 12, 9))
            offsets = torch.tensor([0, 2, 2, 6])
            w = torch.rand(9, dtype=torch.float64) if mode == "sum" else None
            got, want = bag(ids, offsets, per_sample_weights=w), ref(ids, offsets, per_sample_weights=w)
        else:  # 2-D: one bag per row
            ids = torch.from_numpy(rng.integers(0, 12, (4, 3)))
            got, want = bag(ids), ref(ids)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        target = torch.arange(got.numel(), dtype=torch.float64).reshape(got.shape)
        ((got - target) ** 2).sum().backward()
        sgd.zero_grad()
        ((want - target) ** 2).sum().backward()
        sgd.step()
        bag.flush()
    torch.testing.assert_close(whole_table(bag), ref.weight.detach(), rtol=1e-12, atol=1e-12)


def test_only_the_batch_rows_move():
    kv = pskv.create("local")
    pulls, pushes = [], []
    real_pull, real_push = kv.row_sparse_pull, kv.push

    def row_sparse_pull(key, out=None, priority=0, row_ids=None, **kw):
        pulls.append((key, tuple(out.shape), np.asarray(row_ids).tolist()))
        return real_pull(key, out=out, priority=priority, row_ids=row_ids, **kw)

    def push(key, value, priority=0, **kw):
        values = value if isinstance(value, list) else [value]
        pushes.append((key, [v.coalesce().indices()[0].tolist() for v in values]))
        return real_push(key, value, priority=priority, **kw)

    def refuse(*args, **kw):
        raise AssertionError("the table was pulled whole")

    kv.row_sparse_pull, kv.push, kv.pull = row_sparse_pull, push, refuse
    group = group_of(store_net(kv))
    t = Trainer(group, "sgd", {"learning_rate": 0.1}, kvstore=kv)
    x, y = dataset()
    for bx, by in batches(x, y)[:3]:
        pulls.clear()
        pushes.clear()
        group.forward((bx, by))
        group.backward()
        t.step()
        halves = [bx[:B // 2], bx[B // 2:]]  # each replica pulls the unique ids of its slice
        assert sorted(pulls) == sorted(("emb", (len(np.unique(h)), D), np.unique(h).tolist()) for h in halves)
        assert len(pushes) == 1 and pushes[0][0] == "emb"  # one push per step: both replicas' rows
        assert sorted(pushes[0][1]) == sorted(np.unique(h).tolist() for h in halves)
    stats = group.replicas[0].emb.table.stats
    assert stats["pushes"] == 3 and stats["rows_pulled"] < 3 * 2 * B * L


def test_fit_trains_an_embedding_and_an_mlp():
    kv = pskv.create("local")
    x, y = dataset(n=160, seed=5)
    y = (x[:, 1] % C)  # the label is a property of one id: learnable through its row
    group = DataParallelExecutorGroup(store_net(kv), ["cpu", "cpu"], loss=torch.nn.CrossEntropyLoss())
    t = Trainer(group, "adam", {"learning_rate": 0.05}, kvstore="device")  # a name: the tables' store is used
    assert t.kvstore is kv
    history = t.fit(NDArrayIter(x, y, batch_size=16, shuffle=True, seed=1), num_epoch=4, progress=False)
    t.close()
    assert history[-1]["loss"] < 0.6 * history[0]["loss"]
    assert history[-1]["train"]["accuracy"] > 0.8


def test_prefetch_gives_the_numbers_of_no_prefetch():
    x, y = dataset(n=B * 6)
    results = []
    for prefetch in (False, True):
        kv = pskv.create("local")
        group = DataParallelExecutorGroup(store_net(kv), ["cpu", "cpu"], loss=torch.nn.CrossEntropyLoss())
        t = Trainer(group, "sgd", {"learning_rate": 0.2, "momentum": 0.9}, kvstore=kv)
        data = NDArrayIter(x, y, batch_size=B)
        emb = group.replicas[0].emb
        if prefetch:
            data = PrefetchingIter(data, {emb: lambda batch: batch.data[0]})
        t.fit(data, num_epoch=2, progress=False)
        t.close()
        results.append((whole_table(emb), group.get_params()[0], dict(emb.table.stats)))
    (table, params, plain), (table_p, params_p, stats) = results
    assert torch.equal(table, table_p)
    for name in params:
        assert torch.equal(params[name], params_p[name]), name
    # every batch after an epoch's first came prefetched (2 replicas each took their rows from it)
    assert plain["prefetch_hits"] == 0 and stats["prefetch_hits"] == 2 * 2 * 5
    assert stats["pulls"] < plain["pulls"]


def test_prefetch_started_before_the_push_waits_for_it():
    kv = pskv.create("local")
    kv.set_optimizer(pskv.optimizer.create("sgd", learning_rate=1.0))
    emb = Embedding(V, D, kv, "e", init=table0(), dtype=torch.float64)
    ids = torch.tensor([1, 2, 3])
    out = emb(ids)
    emb.prefetch(torch.tensor([2, 3, 4]))  # a step is open: the pull starts after its push
    out.sum().backward()  # pushes, then the prefetch pull starts
    emb.table.wait()
    want = table0()[torch.tensor([2, 3, 4])]
    want[:2] -= 1.0
    torch.testing.assert_close(emb(torch.tensor([4, 2])).detach(), want[[2, 0]])
    assert emb.table.stats["prefetch_hits"] == 1
    emb.prefetch(torch.tensor([5]))  # no step open: at once; a push after it makes it stale
    out = emb(torch.tensor([5]))
    out.sum().backward()
    emb.flush()
    torch.testing.assert_close(emb(torch.tensor([5])).detach(), table0()[5:6] - 1.0)
    assert emb.table.stats["prefetch_misses"] == 1


@pytest.mark.parametrize(("ids", "error", "match"), [
    (torch.tensor([[0, -1]]), pskv.InvalidArgumentError, r"ids \[-1\] out of range for 50 rows"),
    (torch.tensor([[3, V]]), pskv.InvalidArgumentError, r"ids \[50\] out of range"),
    (torch.tensor([[1 << 62, 2]]), pskv.InvalidArgumentError, "out of range"),
    (torch.tensor([[1.0, 2.0]]), pskv.InvalidTypeError, "must be integers"),
])
def test_hostile_ids_are_refused_naming_the_key(ids, error, match):
    kv = pskv.create("local")
    net = store_net(kv, key="user_table")
    with pytest.raises(error, match=match) as info:
        net(ids)
    assert "Embedding (store key 'user_table')" in str(info.value)
    with pytest.raises(error, match="user_table"):
        net.emb.prefetch(ids)
    assert net.emb.table.stats["pulls"] == 0


def test_replicas_from_a_factory_share_one_table_and_the_trainer_checks_its_store():
    kv = pskv.create("local")
    group = DataParallelExecutorGroup(lambda: store_net(kv), ["cpu", "cpu"], loss=torch.nn.CrossEntropyLoss())
    assert group.replicas[0].emb.table is group.replicas[1].emb.table
    with pytest.raises(pskv.ShapeMismatchError):
        Embedding(V + 1, D, kv, "emb", dtype=torch.float64)
    with pytest.raises(pskv.InvalidArgumentError, match="update_on_kvstore must be True"):
        Trainer(group, "sgd", kvstore=kv, update_on_kvstore=False)
    with pytest.raises(pskv.InvalidArgumentError, match="not the store holding"):
        Trainer(group, "sgd", kvstore=pskv.create("local"))


def test_a_table_from_an_initializer_and_a_plain_module_trainer():
    kv = pskv.create("local")
    init = {"type": "uniform", "low": -0.1, "high": 0.1, "seed": 9}
    emb = Embedding(1000, D, kv, "drawn", init=init)
    assert torch.equal(emb.table.rows(torch.arange(1000)), torch.from_numpy(pskv.TableInit((1000, D), "float32", init).todense()))
    default = Embedding(100, D, kv, "default")  # N(0, 1) as torch.nn.Embedding, seed 0
    want = pskv.TableInit((100, D), "float32", {"type": "normal", "std": 1.0, "seed": 0}).todense()
    assert torch.equal(default.table.rows(torch.arange(100)), torch.from_numpy(want))
    t = Trainer(emb, "sgd", {"learning_rate": 1.0}, kvstore=None)  # only a table: no dense parameter
    before = emb.table.rows(torch.tensor([7, 8]))
    emb(torch.tensor([7, 7])).sum().backward()  # a plain module pushes at step(batch_size)
    assert emb.table.stats["pushes"] == 0
    t.step(2)
    torch.testing.assert_close(emb.table.rows(torch.tensor([7, 8])), before - torch.tensor([[1.0], [0.0]]))
    t.step(2)  # a step without a forward still pushes once (an empty push: sync rounds need it)
    assert emb.table.stats["pushes"] == 2
    t.close()


@pytest.mark.parametrize("table_init", ["dense", "drawn"])
def test_dist_sync_two_workers_two_servers_match_the_local_store(table_init):
    from pskv.testing import InProcessCluster

    drawn = {"type": "normal", "std": 0.5, "seed": 4}
    init = table0() if table_init == "dense" else drawn
    data = batches(*dataset())
    params = {"learning_rate": 0.2, "momentum": 0.9, "lazy_update": False}

    kv = pskv.create("local")
    ref_group = group_of(Net(Embedding(V, D, kv, "emb", init=init, dtype=torch.float64)), ["cpu"])
    ref = Trainer(ref_group, "sgd", params, kvstore=kv)
    train(ref_group, ref, data)
    ref.close()
    want = ref_group.get_params()[0]
    want_table = whole_table(ref_group.replicas[0])

    def worker(cfg):
        with pskv.create("dist_sync", cluster=cfg) as kv:
            group = group_of(Net(Embedding(V, D, kv, "emb", init=init, dtype=torch.float64)), ["cpu"])
            t = Trainer(group, "sgd", params, kvstore=kv)
            for bx, by in data:  # worker r takes the samples r, r+2, ... of every global batch
                group.forward((bx[kv.rank::2], by[kv.rank::2]))
                group.backward()
                t.step()
            t.close()
            return group.get_params()[0], whole_table(group.replicas[0]), dict(group.replicas[0].emb.table.stats)

    with InProcessCluster(2, 2, deadline=30) as cluster:
        results = cluster.run_workers(worker)
    for got, table, stats in results:
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-12, msg=name)
        torch.testing.assert_close(table, want_table, rtol=1e-9, atol=1e-12)
        assert stats["pushes"] == STEPS and stats["rows_pulled"] <= STEPS * (B // 2) * L + V


def test_dist_async_trains_the_table_through_the_trainer():
    from pskv.testing import InProcessCluster

    x, y = dataset(n=96, seed=5)
    y = x[:, 1] % C

    def worker(cfg):
        with pskv.create("dist_async", cluster=cfg) as kv:
            net = Net(Embedding(V, D, kv, "emb", init={"type": "normal", "std": 0.1, "seed": 1}, dtype=torch.float64))
            group = DataParallelExecutorGroup(net, ["cpu"], loss=torch.nn.CrossEntropyLoss())
            t = Trainer(group, "adam", {"learning_rate": 0.05}, kvstore=kv)
            data = NDArrayIter(x, y, batch_size=8, shuffle=True, seed=2, num_parts=2, part_index=kv.rank)
            history = t.fit(data, num_epoch=4, progress=False)
            t.close()
            return history[0]["loss"], history[-1]["loss"], net.emb.table.stats["pushes"]

    with InProcessCluster(2, 2, deadline=60) as cluster:
        results = cluster.run_workers(worker)
    for first, last, pushes in results:
        assert last < 0.7 * first and pushes == 4 * 6


def test_dist_sync_a_worker_that_touched_no_row_still_completes_the_round():
    from pskv.testing import InProcessCluster

    def worker(cfg):
        with pskv.create("dist_sync", cluster=cfg) as kv:
            emb = Embedding(V, D, kv, "emb", init=table0(), dtype=torch.float64)
            t = Trainer(emb, "sgd", {"learning_rate": 1.0}, kvstore=kv)
            for _ in range(2):
                if kv.rank == 0:
                    emb(torch.tensor([3, 3])).sum().backward()
                t.step(1)  # rank 1 had no batch: an empty push joins the round
            t.close()
            return emb.table.rows(torch.tensor([3, 4]))

    with InProcessCluster(1, 2, deadline=30) as cluster:  # 1 server, 2 workers
        results = cluster.run_workers(worker, timeout=20)
    want = table0()[[3, 4]]
    want[0] -= 2 * 2 * 1.0 / 2  # two steps of gradient 2, rescaled by 1 / (batch 1 x 2 workers)
    assert len(results) == 2
    for got in results:
        torch.testing.assert_close(got, want)


def test_output_shapes_of_a_group_bound_with_integer_ids():
    kv = pskv.create("local")
    x, y = dataset()
    data = NDArrayIter(x, y, batch_size=B)
    group = DataParallelExecutorGroup(store_net(kv), ["cpu", "cpu"], loss=torch.nn.CrossEntropyLoss(),
                                      data_shapes=data.provide_data, label_shapes=data.provide_label)
    assert group.output_shapes == [("output0", (B, C))]  # zeros of the ids' integer dtype went in


def test_without_overlap_the_rows_are_pushed_at_step_with_the_same_result():
    data = batches(*dataset())
    tables = []
    for overlap in (True, False):
        kv = pskv.create("local")
        group = group_of(store_net(kv))
        t = Trainer(group, "sgd", {"learning_rate": 0.3, "momentum": 0.9}, kvstore=kv, overlap=overlap)
        stats = group.replicas[0].emb.table.stats
        for step, batch in enumerate(data):
            group.forward(batch)
            group.backward()
            assert stats["pushes"] == (step + 1 if overlap else step)  # pushed in backward, or by step()
            t.step()
        t.close()
        tables.append(whole_table(group.replicas[0]))
    assert torch.equal(tables[0], tables[1])


def test_a_smaller_last_batch_is_rescaled_for_the_rows_as_for_the_dense_parameters():
    x, y = dataset()
    data = [(torch.from_numpy(x[a:b]), torch.from_numpy(y[a:b])) for a, b in ((0, 8), (8, 13), (13, 21))]
    ref_group = group_of(dense_net())
    ref = Trainer(ref_group, "sgd", {"learning_rate": 0.5}, kvstore="local")
    train(ref_group, ref, data)
    kv = pskv.create("local")
    group = group_of(store_net(kv))
    t = Trainer(group, "sgd", {"learning_rate": 0.5}, kvstore=kv)
    train(group, t, data)
    want = ref_group.get_params()[0]
    torch.testing.assert_close(whole_table(group.replicas[0]), want["emb.weight"], rtol=1e-9, atol=1e-12)
