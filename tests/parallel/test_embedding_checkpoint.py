"""Training checkpoints and optimizer-state files with embedding tables (row-sparse keys) in the store.

fit(checkpoint_dir=..., resume=True) with a pskv.parallel.Embedding + MLP resumes bit for bit on a
local store (the table's present rows in tables.safetensors, their optimizer state in the store's
optimizer.safetensors) and on dist_sync (the tables in the checkpoint's server checkpoint, which the
resumed job starts from); a damaged tables file is refused naming it. kv.save_optimizer_states /
load_optimizer_states keep the state of row-sparse keys (SGD momentum, Adam moments) on the local,
device and dist stores: a fresh store that loads them goes on like the uninterrupted one.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pskv  # noqa: E402
from pskv.arrays.rowsparse import RowSparse  # noqa: E402
from pskv.parallel import DataParallelExecutorGroup, Embedding, NDArrayIter, Trainer  # noqa: E402
from pskv.parallel.checkpoint import TABLES, latest_checkpoint  # noqa: E402

V, D, L, C = 60, 4, 3, 3
ADAM = ("adam", {"learning_rate": 0.05})  # lazy_update (the default): moments of the pushed rows only
MOMENTUM = ("sgd", {"learning_rate": 0.2, "momentum": 0.9, "wd": 1e-3})


def table0() -> torch.Tensor:
    return torch.randn(V, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


class Net(torch.nn.Module):
    def __init__(self, kv, init) -> None:
        super().__init__()
        self.emb = Embedding(V, D, kv, "emb", init=init, dtype=torch.float64)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(L * D, 8), torch.nn.Tanh(), torch.nn.Linear(8, C)).double()
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for p in self.mlp.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.emb(x).flatten(1))


def samples(n: int = 96) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    x = rng.integers(0, V - 10, (n, L))  # rows V-10.. never touched: not all rows are pushed
    return x, x[:, 1] % C


def setup(kv, optimizer, devices, init):
    group = DataParallelExecutorGroup(Net(kv, init), list(devices), loss=torch.nn.CrossEntropyLoss())
    return group, Trainer(group, optimizer[0], optimizer[1], kvstore=kv)


def finals(group) -> dict[str, torch.Tensor]:
    params = dict(group.get_params()[0])
    params["table"] = group.replicas[0].emb.table.rows(torch.arange(V))
    return params


def assert_bitwise(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name


def local_run(optimizer, epochs, store="local", **fit):
    kv = pskv.create(store)
    group, t = setup(kv, optimizer, ["cpu", "cpu"], table0())
    history = t.fit(NDArrayIter(*samples(), batch_size=16, shuffle=True, seed=3), num_epoch=epochs, progress=False,
                    **fit)
    t.close()
    return finals(group), history


@pytest.mark.parametrize(("store", "optimizer"), [("local", ADAM), ("local", MOMENTUM), ("device", ADAM)],
                         ids=["local-adam", "local-sgd_momentum", "device-adam"])
def test_fit_resumes_a_model_with_a_table_bitwise_on_a_local_store(tmp_path, store, optimizer):
    want, _ = local_run(optimizer, 3, store)
    local_run(optimizer, 2, store, checkpoint_dir=tmp_path)
    latest = latest_checkpoint(tmp_path)
    meta = json.loads((latest / "meta.json").read_text())
    assert meta["tables"] == {"file": TABLES, "tables": [{"key": "emb", "shape": [V, D], "dtype": "float64"}]}
    got, history = local_run(optimizer, 3, store, checkpoint_dir=tmp_path, resume=True)
    assert [h["epoch"] for h in history] == [2]
    assert_bitwise(got, want)
    assert not torch.equal(want["table"], table0())


def test_without_the_table_rows_the_resumed_run_would_differ(tmp_path, monkeypatch):
    """The test above would fail if the rows were not restored: the freshly initialised table differs."""
    from pskv.parallel import checkpoint

    want, _ = local_run(ADAM, 3)
    local_run(ADAM, 2, checkpoint_dir=tmp_path)
    monkeypatch.setattr(checkpoint, "_load_tables", lambda *a: None)  # the rows stay those of a fresh table
    got, history = local_run(ADAM, 3, checkpoint_dir=tmp_path, resume=True)
    assert [h["epoch"] for h in history] == [2]
    assert not torch.equal(got["table"], want["table"])


def _damage(path, tensors=None, doc=None) -> None:
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    with safe_open(str(path), framework="numpy") as f:
        meta = dict(f.metadata())
    data = load_file(str(path))
    if tensors is not None:
        data = tensors(data)
    if doc is not None:
        meta["pskv"] = json.dumps(doc(json.loads(meta["pskv"])))
    save_file(data, str(path), metadata=meta)


def _unsorted(data):
    data["ids0"] = data["ids0"][::-1].copy()
    data["rows0"] = data["rows0"][::-1].copy()
    return data


def _out_of_range(data):
    data["ids0"] = data["ids0"].copy()
    data["ids0"][-1] = V
    return data


@pytest.mark.parametrize(("damage", "match"), [
    (lambda p: p.write_bytes(p.read_bytes()[:100]), "not a usable pskv tables file"),
    (lambda p: _damage(p, tensors=_unsorted), "not sorted, unique and within 0..59"),
    (lambda p: _damage(p, tensors=_out_of_range), "not sorted, unique and within 0..59"),
    (lambda p: _damage(p, tensors=lambda d: {**d, "rows0": d["rows0"].astype(np.float32)}), "rows are float32"),
    (lambda p: _damage(p, tensors=lambda d: {**d, "rows0": d["rows0"][:-1]}), "rows are float64"),
    (lambda p: _damage(p, tensors=lambda d: {**d, "extra": d["ids0"]}), "holds the tensors"),
    (lambda p: _damage(p, doc=lambda doc: {**doc, "tables": [{**doc["tables"][0], "key": "other"}]}),
     "not the tables file of this model"),
], ids=["truncated", "unsorted", "out_of_range", "dtype", "shape", "extra_tensor", "other_table"])
def test_a_damaged_tables_file_is_refused_naming_it(tmp_path, damage, match):
    local_run(MOMENTUM, 1, checkpoint_dir=tmp_path)
    path = latest_checkpoint(tmp_path) / TABLES
    damage(path)
    kv = pskv.create("local")
    _, t = setup(kv, MOMENTUM, ["cpu"], table0())
    with pytest.raises(pskv.CheckpointError, match=match) as info:
        t.fit(NDArrayIter(*samples(), batch_size=16), num_epoch=2, checkpoint_dir=tmp_path, resume=True,
              progress=False)
    assert str(path) in str(info.value)


def test_a_checkpoint_of_another_model_is_refused(tmp_path):
    local_run(MOMENTUM, 1, checkpoint_dir=tmp_path)
    kv = pskv.create("local")
    group = DataParallelExecutorGroup(torch.nn.Sequential(Embedding(V + 1, D, kv, "emb", dtype=torch.float64),
                                                          torch.nn.Flatten(), torch.nn.Linear(L * D, C).double()),
                                      ["cpu"], loss=torch.nn.CrossEntropyLoss())
    t = Trainer(group, *MOMENTUM, kvstore=kv)
    with pytest.raises(pskv.CheckpointError, match=r"holds the embedding tables .*'shape': \[60, 4\].* this model has"):
        t.fit(NDArrayIter(*samples(), batch_size=16), num_epoch=2, checkpoint_dir=tmp_path, resume=True,
              progress=False)


# ---------------------------------------------------------------------------- dist_sync (2 workers x 2 servers)

DRAWN = {"type": "normal", "std": 0.5, "seed": 4}


def dist_run(tmp_path, epochs, resume_from="", **fit):
    from pskv.testing import InProcessCluster

    x, y = samples()

    def worker(cfg):
        with pskv.create("dist_sync", cluster=cfg) as kv:
            group, t = setup(kv, ADAM, ["cpu"], DRAWN)
            data = NDArrayIter(x, y, batch_size=8, shuffle=True, seed=3, num_parts=2, part_index=kv.rank)
            history = t.fit(data, num_epoch=epochs, progress=False, **fit)
            t.close()
            return finals(group), [h["epoch"] for h in history]

    with InProcessCluster(2, 2, deadline=60, state_dir=str(tmp_path), resume_from=resume_from) as cluster:
        return cluster.run_workers(worker, timeout=60)


def test_fit_resumes_a_model_with_a_table_bitwise_on_dist_sync(tmp_path):
    want = dist_run(tmp_path, 3)
    root = tmp_path / "ckpt"
    dist_run(tmp_path, 2, checkpoint_dir=root)
    latest = latest_checkpoint(root)
    meta = json.loads((latest / "meta.json").read_text())
    assert meta["tables"]["servers"] == "servers" and (latest / "servers" / "manifest.json").is_file()

    # advice a user can follow: pskv launch sets PSKV_RESUME_FROM only itself (restarts) and --env refuses it
    advice = r" in every process \(pskv launch has no option for it: export it in the shell of `pskv launch --launcher local`"
    with pytest.raises(pskv.CheckpointError, match=rf"PSKV_RESUME_FROM={latest / 'servers'}{advice}"):
        dist_run(tmp_path, 3, checkpoint_dir=root, resume=True)  # the servers did not start from it

    got = dist_run(tmp_path, 3, resume_from=str(latest / "servers"), checkpoint_dir=root, resume=True)
    for (params, epochs), (ref, _) in zip(got, want):
        assert epochs == [2]
        assert_bitwise(params, ref)


# ---------------------------------------------------------------------------- optimizer-state files

R, W = 40, 3
OPTIMIZERS = [("sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01}), ("adam", {"learning_rate": 0.05})]


def row_grad(step: int, rank: int = 0) -> RowSparse:
    rng = np.random.default_rng(100 * step + rank)
    ids = np.unique(rng.integers(0, R, 6))
    return RowSparse(ids, rng.normal(size=(len(ids), W)), (R, W))


def start_table() -> RowSparse:
    return RowSparse.from_dense(np.random.default_rng(9).normal(size=(R, W)))


def present(kv) -> tuple[np.ndarray, np.ndarray]:
    got = kv.pull("t")
    return got.indices, got.data


@pytest.mark.parametrize("store", ["local", "device"])
@pytest.mark.parametrize(("name", "params"), OPTIMIZERS, ids=["sgd_momentum", "adam"])
def test_optimizer_states_of_row_sparse_keys_round_trip_on_a_single_process_store(tmp_path, store, name, params):
    def fresh():
        kv = pskv.create(store)
        kv.init("t", start_table())
        kv.init("d", np.zeros(5))
        kv.set_optimizer(pskv.optimizer.create(name, **params))
        return kv

    kv = fresh()
    for step in range(3):
        kv.push(["t", "d"], [row_grad(step), np.full(5, step + 1.0)])
    kv.save_optimizer_states(str(tmp_path / "opt.states"))
    ids, rows = present(kv)
    other = pskv.create(store)
    other.init("t", RowSparse(ids, rows, (R, W)))
    other.init("d", kv.pull("d"))
    other.set_optimizer(pskv.optimizer.create(name, **params))
    other.load_optimizer_states(str(tmp_path / "opt.states"))
    for step in range(3, 6):
        for s in (kv, other):
            s.push(["t", "d"], [row_grad(step), np.full(5, step + 1.0)])
    for a, b in zip(present(kv), present(other)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(kv.pull("d"), other.pull("d"))

    skipped = fresh()  # without the states the continuation differs (momentum / moments start at zero)
    skipped.restore_rows("t", ids, rows)
    skipped.push("t", row_grad(3))
    kv2 = fresh()
    for step in range(4):
        kv2.push("t", row_grad(step))
    assert not np.array_equal(present(skipped)[1], present(kv2)[1])


@pytest.mark.parametrize(("name", "params"), OPTIMIZERS, ids=["sgd_momentum", "adam"])
def test_optimizer_states_of_row_sparse_keys_round_trip_on_dist_sync(tmp_path, name, params):
    """2 workers x 2 servers: each server writes its row ranges' state; a fresh job whose table holds the
    rows of step 3 and which loads the states pushes steps 3..5 to the uninterrupted job's floats."""
    from pskv.testing import InProcessCluster

    states = str(tmp_path / "opt.states")

    def run(steps, table, save=False, load=False):
        def worker(cfg):
            with pskv.create("dist_sync", cluster=cfg) as kv:
                kv.init("t", table)
                kv.set_optimizer(pskv.optimizer.create(name, **params))
                if load:
                    kv.load_optimizer_states(states)
                for step in steps:
                    kv.push("t", row_grad(step, kv.rank))
                rows = present(kv)  # a pull waits for the rounds its pushes joined: every worker's last push applied
                if save:  # (saving waits for this worker's own operations only, as MXNet's)
                    kv.save_optimizer_states(states)
                return rows
        with InProcessCluster(2, 2, deadline=30, state_dir=str(tmp_path)) as cluster:
            return cluster.run_workers(worker, timeout=30)

    drawn = pskv.TableInit((R, W), "float64", {"type": "normal", "seed": 7})
    want = run(range(6), drawn)[0]
    ids, rows = run(range(3), drawn, save=True)[0]
    assert (tmp_path / "opt.states.server0").is_file() and (tmp_path / "opt.states.server1").is_file()
    for got in run(range(3, 6), RowSparse(ids, rows, (R, W)), load=True):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    without = run(range(3, 6), RowSparse(ids, rows, (R, W)))[0]  # the states matter: without them it differs
    assert not np.array_equal(without[1], want[1])

