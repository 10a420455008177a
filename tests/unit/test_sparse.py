"""Row-sparse values (``pskv.RowSparse``, torch sparse COO) and MXNet's sparse semantics on ``local``/``device``.

The MXNet ports re-state ``tests/python/unittest/test_kvstore.py``'s ``test_sparse_aggregator``,
``test_invalid_pull`` and the GPU file's ``test_rsp_push_pull`` / ``test_rsp_push_pull_large_rowid``
with pskv's API (MXNet's devices are a store's list of values here).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import pskv
from pskv import RowSparse
from pskv.optimizer import SGD
from tests.conftest import torch

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
needs_cuda = pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="needs a CUDA device")

SHAPE = (4, 4)
STR_KEYS = ["b", "c", "d"]


def rsp(rows, shape=SHAPE, value=None, seed=0, dtype=np.float32) -> RowSparse:
    """A RowSparse with the given rows: ``value`` everywhere, or random values."""
    rows = np.asarray(rows, dtype=np.int64)
    if value is None:
        data = np.random.default_rng(seed).standard_normal((len(rows),) + shape[1:]).astype(dtype)
    else:
        data = np.full((len(rows),) + shape[1:], value, dtype=dtype)
    return RowSparse(rows, data, shape)


def random_rsp(seed: int, shape=SHAPE) -> RowSparse:
    """MXNet's ``rand_ndarray(shape, 'row_sparse')``: a random subset of rows, random values."""
    rng = np.random.default_rng(seed)
    rows = np.flatnonzero(rng.random(shape[0]) < 0.5)
    return rsp(rows, shape, seed=seed + 100)


def sparse_store(make_store, name: str):
    """MXNet's ``init_kv_with_str('row_sparse')``: key 'a' and STR_KEYS, row-sparse zeros."""
    kv = make_store(name)
    kv.init("a", RowSparse.zeros(SHAPE))
    kv.init(STR_KEYS, [RowSparse.zeros(SHAPE) for _ in STR_KEYS])
    return kv


# -- the value type ----------------------------------------------------------------------------------
def test_row_sparse_canonicalises_sorts_and_sums_duplicates():
    v = RowSparse([3, 0, 3], np.array([[1, 1], [2, 2], [4, 4]], np.float32), (5, 2))
    assert v.indices.tolist() == [0, 3] and v.indices.dtype == np.int64
    assert v.data.tolist() == [[2, 2], [5, 5]]
    assert (v.shape, v.dtype, v.nnz, v.ndim) == ((5, 2), "float32", 2, 2)
    dense = v.todense()
    assert dense.tolist() == [[2, 2], [0, 0], [0, 0], [5, 5], [0, 0]]
    assert np.asarray(v).tolist() == dense.tolist()
    back = RowSparse.from_dense(dense)
    assert back.indices.tolist() == [0, 3] and (back.todense() == dense).all()
    assert RowSparse.from_dense(dense, rows=[1, 3, 1]).indices.tolist() == [1, 3]
    kept = v.retain([3, 4])
    assert kept.indices.tolist() == [3] and kept.data.tolist() == [[5, 5]]
    assert RowSparse.zeros((5, 2), "float64").todense().dtype == np.float64


@pytest.mark.parametrize("make, error, match", [
    (lambda: RowSparse([0, 5], np.zeros((2, 2), np.float32), (5, 2)), pskv.InvalidArgumentError,
     r"indices \[5\] out of range for 5 rows"),
    (lambda: RowSparse([-1, 2], np.zeros((2, 2), np.float32), (5, 2)), pskv.InvalidArgumentError,
     r"indices \[-1\] out of range"),
    (lambda: RowSparse(np.array([0.5]), np.zeros((1, 2), np.float32), (5, 2)), pskv.InvalidTypeError,
     "must be integers, got dtype float64"),
    (lambda: RowSparse(np.zeros((1, 2), np.int64), np.zeros((1, 2), np.float32), (5, 2)), pskv.InvalidArgumentError,
     "must be 1-D"),
    (lambda: RowSparse([0, 1], np.zeros((3, 2), np.float32), (5, 2)), pskv.InvalidArgumentError,
     r"data of shape \(3, 2\) does not fit 2 indices of a \(5, 2\) array: expected \(2, 2\)"),
    (lambda: RowSparse([0], np.zeros((1, 3), np.float32), (5, 2)), pskv.InvalidArgumentError, "does not fit"),
    # a hostile count: 10**7 ids with data for 1 row is refused before sorting or allocating anything
    (lambda: RowSparse(np.zeros(10**7, np.int64), np.zeros((1, 2), np.float32), (5, 2)), pskv.InvalidArgumentError,
     "does not fit 10000000 indices"),
    (lambda: RowSparse([0], np.broadcast_to(np.float32(0), (1, 2 ** 40)), (2 ** 40, 2 ** 40)), pskv.InvalidArgumentError,
     "more than any array can hold"),
    (lambda: RowSparse([0], np.zeros((1, 2), np.float32), (5, -2)), pskv.InvalidArgumentError, "non-negative ints"),
    (lambda: RowSparse([0], np.zeros((1, 2), np.complex64), (5, 2)), pskv.UnsupportedValueError, "complex64"),
    (lambda: RowSparse([0], [[1.0, 2.0]], (5, 2)), pskv.UnsupportedValueError, "must be a numpy.ndarray"),
    (lambda: RowSparse([0, 1], np.zeros((2, 2), np.float32), (5, 2)).retain([7]), pskv.InvalidArgumentError,
     r"retain row ids \[7\] out of range"),
])
def test_row_sparse_refuses_hostile_values_with_typed_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_a_huge_table_costs_only_its_rows():
    v = RowSparse([10**12 - 1], np.ones((1, 4), np.float32), (10**12, 4))  # a dense one would be 16 TB
    assert v.nnz == 1 and v.retain([0, 10**12 - 1]).indices.tolist() == [10**12 - 1]


@needs_torch
def test_torch_sparse_coo_from_an_embedding_round_trips():
    emb = torch.nn.Embedding(10, 3, sparse=True)
    emb(torch.tensor([[1, 2], [1, 5]])).sum().backward()
    grad = emb.weight.grad
    assert grad.layout is torch.sparse_coo and not grad.is_coalesced()  # duplicates of row 1
    v = RowSparse.from_torch(grad)
    assert v.indices.tolist() == [1, 2, 5]
    assert (v.todense() == grad.to_dense().numpy()).all()
    t = v.to_torch()
    assert t.is_coalesced() and (t.to_dense() == grad.to_dense()).all()
    with pytest.raises(pskv.InvalidTypeError, match="sparse COO tensor"):
        RowSparse.from_torch(torch.zeros(3, 2))
    two_dims = torch.sparse_coo_tensor(torch.tensor([[0], [1]]), torch.ones(1), (3, 2), check_invariants=True)
    with pytest.raises(pskv.InvalidArgumentError, match="one sparse dimension"):
        RowSparse.from_torch(two_dims)


# -- MXNet's test_sparse_aggregator ---------------------------------------------------------------------
@pytest.mark.parametrize("name", ["local", "device"])
def test_sparse_aggregator(make_store, name):
    kv = sparse_store(make_store, name)
    devices = 4
    all_rows = np.arange(SHAPE[0], dtype=np.int64)
    vals = [random_rsp(i) for i in range(devices)]
    expected = sum(v.todense() for v in vals)
    kv.push("a", vals)
    kv.row_sparse_pull("a", out=vals, row_ids=[all_rows] * devices)
    assert np.allclose(sum(v.todense() for v in vals), expected * devices)
    # the same read back by pull(ignore_sparse=False)
    outs = [RowSparse.zeros(SHAPE) for _ in range(devices)]
    kv.pull("a", out=outs, ignore_sparse=False)
    assert np.allclose(sum(v.todense() for v in outs), expected * devices)

    # list: one list of per-device values for every key
    vals = [[random_rsp(10 + i) for i in range(devices)] for _ in STR_KEYS]
    expected = sum(v.todense() for v in vals[0])
    for vv in vals[1:]:
        for v, w in zip(vv, vals[0]):
            v._assign(w.indices.copy(), w.data.copy())
    kv.push(STR_KEYS, vals)
    kv.row_sparse_pull(STR_KEYS, out=vals, row_ids=[[all_rows] * devices] * len(STR_KEYS))
    for vv in vals:
        assert np.allclose(sum(v.todense() for v in vv), expected * devices)


def test_sparse_push_sums_rows_by_index_union_and_duplicates(make_store):
    kv = make_store("local")
    kv.init("e", rsp([0, 1, 2, 3], value=1.0))
    kv.push("e", [rsp([3, 1], value=1.0), rsp([1], value=2.0)])  # rows {1, 3}; row 1 in both
    got = kv.row_sparse_pull("e", row_ids=[0, 1, 2, 3])
    assert isinstance(got, RowSparse)
    assert got.indices.tolist() == [0, 1, 2, 3]
    assert got.todense()[:, 0].tolist() == [0, 3, 0, 1]  # no updater: the sum replaces the value
    whole = kv.pull("e")
    assert isinstance(whole, RowSparse) and whole.indices.tolist() == [1, 3]  # the rows present
    kv.push("e", [rsp([2], value=1.0), np.ones(SHAPE, np.float32)])  # a dense value covers every row
    whole = kv.pull("e")
    assert whole.indices.tolist() == [0, 1, 2, 3] and whole.data[:, 0].tolist() == [1, 1, 2, 1]
    kv.push("e", rsp([3], value=5.0))  # replaces: every other row zero again
    assert kv.pull("e").indices.tolist() == [3]
    assert kv.row_sparse_pull("e", row_ids=range(4)).todense()[:, 0].tolist() == [0, 0, 0, 5]


# -- MXNet's test_invalid_pull ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["local", "device"])
def test_invalid_pull(make_store, name):
    kv = make_store(name)
    kv.init(3, np.full(SHAPE, 2, np.float32))
    kv.init([5, 7], [rsp(range(4), value=2.0)] * 2)
    # (a) pull into row-sparse outs is skipped (with a warning), the outs keep their value
    for key, out in [(3, rsp([0], value=7.0)), (5, [rsp([0], value=7.0), rsp([0], value=7.0)]),
                     ([3, 5], [rsp([0], value=7.0), rsp([0], value=7.0)])]:
        with pytest.warns(UserWarning, match="skipped the row-sparse outs.*ignore_sparse=True"):
            kv.pull(key, out=out)
        for o in (out if isinstance(out, list) else [out]):
            assert o.indices.tolist() == [0] and (o.data == 7).all()
    # ... while the dense outs of the same call are written
    dense = np.zeros(SHAPE, np.float32)
    with pytest.warns(UserWarning):
        kv.pull(5, out=[dense, rsp([0], value=7.0)])
    assert (dense == 2).all()
    # (b) pskv differs: row_sparse_pull into a dense out is allowed (the dense form of the result)
    out = np.zeros(SHAPE, np.float32)
    kv.row_sparse_pull(5, out=out, row_ids=[1])
    assert out[:, 0].tolist() == [0, 2, 0, 0]
    # (c) a store of int keys refuses str keys, and a store of str keys int keys
    for call in (lambda: kv.init("x", np.zeros(SHAPE, np.float32)), lambda: kv.push("x", rsp([0])),
                 lambda: kv.pull("x", out=np.zeros(SHAPE, np.float32)),
                 lambda: kv.row_sparse_pull("x", out=rsp([0]), row_ids=[0])):
        with pytest.raises(pskv.KeyTypeError):
            call()
    skv = sparse_store(make_store, name)
    for call in (lambda: skv.init(9, rsp([0])), lambda: skv.push(9, rsp([0])),
                 lambda: skv.pull(9, out=rsp([0])), lambda: skv.row_sparse_pull(9, out=rsp([0]), row_ids=[0])):
        with pytest.raises(pskv.KeyTypeError):
            call()


# -- MXNet's test_rsp_push_pull (and large row ids) ----------------------------------------------------------
def _rsp_pull_checks(kv, outs_of, rng):
    """Every form of MXNet's check_rsp_pull: 1 and 4 outs, own row ids, shared ones, slices of one array."""
    num_rows = SHAPE[0]
    for count, form in [(1, "own"), (4, "own"), (4, "same"), (4, "slice")]:
        outs = outs_of(count)
        if form == "same":
            row_ids = [rng.integers(num_rows, size=num_rows).astype(np.float32)] * count  # float ids, as MXNet's
        elif form == "slice":
            total = rng.integers(num_rows, size=count * num_rows)
            row_ids = [total[i * num_rows:(i + 1) * num_rows] for i in range(count)]
        else:
            row_ids = [rng.integers(num_rows, size=num_rows) for _ in range(count)]
        kv.row_sparse_pull("e", out=outs[0] if count == 1 else outs,
                           row_ids=row_ids[0] if count == 1 or form == "same" else row_ids)
        for out, ids in zip(outs, row_ids):
            want_rows = np.unique(np.asarray(ids, np.int64))
            got = RowSparse.from_torch(out) if not isinstance(out, RowSparse) else out
            assert got.indices.tolist() == want_rows.tolist()  # exactly the requested rows
            dense = got.todense()
            for row in range(num_rows):
                assert (dense[row] == (2 if row in want_rows else 0)).all()


@pytest.mark.parametrize("name", ["local", "device"])
def test_rsp_push_pull(make_store, name):
    rng = np.random.default_rng(0)
    kv = sparse_store(make_store, name)
    kv.init("e", RowSparse.from_dense(np.ones(SHAPE, np.float32)))
    kv.push("e", [RowSparse.from_dense(np.ones(SHAPE, np.float32)) for _ in range(2)])
    _rsp_pull_checks(kv, lambda n: [RowSparse.zeros(SHAPE) for _ in range(n)], rng)
    out = RowSparse.zeros(SHAPE)
    kv.pull("e", out=out, ignore_sparse=False)
    assert out.indices.tolist() == [0, 1, 2, 3] and (out.data == 2).all()


@needs_torch
@pytest.mark.parametrize("name", ["local", "device"])
def test_rsp_push_pull_with_torch_sparse_tensors(make_store, name):
    rng = np.random.default_rng(1)
    kv = make_store(name)
    kv.init("e", torch.ones(SHAPE).to_sparse(1))
    kv.push("e", [torch.ones(SHAPE).to_sparse(1) for _ in range(2)])

    def empties(n):
        return [torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64), torch.zeros((0, 4)), SHAPE, check_invariants=True)
                for _ in range(n)]
    _rsp_pull_checks(kv, empties, rng)
    whole = kv.pull("e")
    assert whole.layout is torch.sparse_coo and (whole.to_dense() == 2).all()


@needs_cuda
def test_rsp_push_pull_on_a_cuda_device(make_store):
    kv = make_store("device")
    kv.init("e", torch.ones(SHAPE, device="cuda").to_sparse(1))
    kv.push("e", [torch.ones(SHAPE, device="cuda").to_sparse(1) for _ in range(2)])
    out = torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64), torch.zeros((0, 4)), SHAPE, check_invariants=True).cuda()
    kv.row_sparse_pull("e", out=out, row_ids=torch.tensor([3, 1, 3], device="cuda"))
    assert out.device.type == "cuda"
    assert out.coalesce().indices().tolist() == [[1, 3]] and (out.coalesce().values() == 2).all()


@pytest.mark.parametrize("name", ["local", "device"])
def test_rsp_push_pull_large_rowid(make_store, name):
    num_rows = 793470
    val = RowSparse.from_dense(np.ones((num_rows, 1), np.float32))
    kv = make_store(name)
    kv.init("a", val)
    out = RowSparse.zeros((num_rows, 1))
    kv.push("a", val)
    kv.row_sparse_pull("a", out=out, row_ids=np.arange(num_rows, dtype=np.int64))
    assert out.nnz == num_rows and (out.data == 1).all()


# -- updaters, optimizers, torch embeddings --------------------------------------------------------------------
def test_a_user_updater_gets_the_row_sparse_merge(make_store):
    kv = make_store("local")
    seen = []

    def updater(key, recv, stored):
        seen.append((key, type(recv), recv.indices.tolist()))
        stored += recv  # numpy adds the dense form (RowSparse.__array__)
    kv.set_updater(updater)
    kv.init("e", rsp([0, 1, 2, 3], value=1.0))
    kv.push("e", [rsp([2], value=1.0), rsp([0, 2], value=1.0)])
    assert seen == [("e", RowSparse, [0, 2])]
    assert kv.row_sparse_pull("e", row_ids=range(4)).todense()[:, 0].tolist() == [2, 1, 3, 1]

    def writes_row_3(key, recv, stored):
        stored[3] = 7
    kv.set_updater(writes_row_3)
    kv.init("f", rsp([0], value=1.0))
    kv.push("f", rsp([1], value=1.0))
    assert kv.pull("f").indices.tolist() == [0, 1, 3]  # pushed rows and rows the updater made non-zero
    kv.set_updater(lambda key, recv, stored: None)
    kv.push("f", rsp([2], value=1.0))
    assert kv.pull("f").todense()[:, 0].tolist() == [1, 0, 0, 7]  # the rows present stay as they were


@needs_torch
def test_a_user_updater_of_a_torch_key_gets_a_sparse_tensor(make_store):
    kv = make_store("local")
    kv.set_updater(lambda key, recv, stored: stored.add_(recv))  # torch adds a sparse tensor to a dense one
    kv.init(0, torch.zeros(SHAPE).to_sparse(1))
    kv.push(0, torch.sparse_coo_tensor(torch.tensor([[1, 1]]), torch.ones(2, 4), SHAPE, check_invariants=True))  # uncoalesced
    out = torch.zeros(SHAPE)
    kv.pull(0, out=out)
    assert out[:, 0].tolist() == [0, 2, 0, 0]


@pytest.mark.parametrize("name", ["local", "device"])
def test_optimizers_run_their_dense_update_on_row_sparse_gradients(make_store, name):
    # lazy_update=False: the dense update of the summed gradient (the lazy one: test_lazy_update.py)
    rng = np.random.default_rng(3)
    weights = rng.standard_normal((6, 3)).astype(np.float32)
    sparse_kv, dense_kv = make_store(name), make_store(name)
    for kv, w in ((sparse_kv, RowSparse.from_dense(weights)), (dense_kv, weights)):
        kv.set_optimizer(SGD(learning_rate=0.1, momentum=0.9, wd=0.01, lazy_update=False))
        kv.init(0, w)
    for step in range(3):
        grads = [rsp(rng.integers(6, size=3), (6, 3), seed=step * 10 + d) for d in range(2)]
        sparse_kv.push(0, grads)
        dense_kv.push(0, [g.todense() for g in grads])
    got = sparse_kv.row_sparse_pull(0, row_ids=range(6)).todense()
    assert np.allclose(got, dense_kv.pull(0), atol=1e-6)


@needs_torch
def test_an_embedding_sparse_gradient_trains_like_its_dense_gradient(make_store):
    torch.manual_seed(0)
    emb = torch.nn.Embedding(20, 5, sparse=True)
    sparse_kv, dense_kv = make_store("local"), make_store("local")
    for kv in (sparse_kv, dense_kv):
        kv.set_optimizer(SGD(learning_rate=0.5, momentum=0.5, lazy_update=False))
        kv.init("emb", emb.weight.detach().clone())
    for _ in range(3):
        emb.zero_grad()
        ids = torch.randint(0, 20, (8, 3))
        (emb(ids) ** 2).sum().backward()
        grad = emb.weight.grad
        assert grad.layout is torch.sparse_coo and not grad.is_coalesced()
        sparse_kv.push("emb", grad)
        dense_kv.push("emb", grad.to_dense())
        with torch.no_grad():
            sparse_kv.pull("emb", out=emb.weight)
    assert torch.allclose(emb.weight.detach(), dense_kv.pull("emb"), atol=1e-6)


# -- mixed lists, casts, refusals ----------------------------------------------------------------------------
def test_dense_and_row_sparse_keys_in_one_list_call(make_store):
    kv = make_store("local")
    kv.init([1, 2], [np.zeros(SHAPE, np.float32), RowSparse.zeros(SHAPE)])
    kv.push([1, 2, 2], [np.ones(SHAPE, np.float32), rsp([1], value=1.0), rsp([1, 3], value=2.0)])
    dense_out, sparse_out = np.zeros(SHAPE, np.float32), RowSparse.zeros(SHAPE)
    kv.pull([1, 2], out=[dense_out, sparse_out], ignore_sparse=False)
    assert (dense_out == 1).all() and sparse_out.indices.tolist() == [1, 3]
    assert sparse_out.data[:, 0].tolist() == [3, 2]
    full, rows = np.full(SHAPE, 9, np.float32), RowSparse.zeros(SHAPE)
    kv.row_sparse_pull([1, 2], out=[full, rows], row_ids=[[0], [3, 0]])
    assert full[:, 0].tolist() == [1, 0, 0, 0] and rows.indices.tolist() == [0, 3]
    assert rows.data[:, 0].tolist() == [0, 2]
    dense2 = np.zeros(SHAPE, np.float32)
    kv.pull(2, out=dense2)  # a dense out of a row-sparse key: the whole table
    assert dense2[:, 0].tolist() == [0, 3, 0, 2]


@pytest.mark.parametrize("name", ["local", "device"])
def test_pulls_into_outs_of_another_floating_dtype_cast(make_store, name, arr):
    kv = make_store(name)
    kv.init(0, arr.full(SHAPE, 1.5, "float16"))
    kv.init(1, rsp([0, 2], value=0.25, dtype=np.float16))
    out32 = arr.zeros(SHAPE, "float32")
    kv.pull(0, out=out32)
    assert (arr.np(out32) == 1.5).all()
    compact = arr.zeros((1, 4), "float64")
    kv.row_sparse_pull(0, out=compact, row_ids=[2])
    assert (arr.np(compact) == 1.5).all()
    full = arr.full(SHAPE, 7, "float32")
    kv.row_sparse_pull(1, out=full, row_ids=[2, 3])
    assert arr.np(full)[:, 0].tolist() == [0, 0, 0.25, 0]
    sparse_out = RowSparse.zeros(SHAPE, "float64")
    kv.row_sparse_pull(1, out=sparse_out, row_ids=[0])
    assert sparse_out.dtype == "float64" and sparse_out.data[:, 0].tolist() == [0.25]
    with pytest.raises(pskv.DTypeMismatchError, match="pull of key 0: dtype int32 does not match the stored dtype float16"):
        kv.pull(0, out=arr.zeros(SHAPE, "int32"))
    with pytest.raises(pskv.DTypeMismatchError, match="row_sparse_pull of key 1: dtype int64 .* float16"):
        kv.row_sparse_pull(1, out=RowSparse.zeros(SHAPE, "int64"), row_ids=[0])
    kv.init(2, arr.zeros(SHAPE, "int32"))
    with pytest.raises(pskv.DTypeMismatchError, match="key 2: dtype float32 .* int32"):
        kv.pull(2, out=arr.zeros(SHAPE, "float32"))


def test_hostile_row_sparse_pushes_and_pulls_are_refused_and_change_nothing(make_store):
    kv = make_store("local")
    kv.init("e", rsp([0, 1], value=1.0))
    with pytest.raises(pskv.ShapeMismatchError, match=r"push of key 'e': shape \(5, 4\)"):
        kv.push("e", [rsp([0], value=3.0), rsp([0], (5, 4), value=3.0)])
    with pytest.raises(pskv.DTypeMismatchError, match="push of key 'e': dtype float64"):
        kv.push("e", rsp([0], value=3.0, dtype=np.float64))
    with pytest.raises(pskv.InvalidArgumentError, match=r"row_ids \[4\] out of range for key 'e' with 4 rows"):
        kv.row_sparse_pull("e", out=RowSparse.zeros(SHAPE), row_ids=[1, 4])
    with pytest.raises(pskv.InvalidArgumentError, match=r"row_ids \[-3\] out of range"):
        kv.row_sparse_pull("e", out=RowSparse.zeros(SHAPE), row_ids=[-3])
    with pytest.raises(pskv.ShapeMismatchError, match="row_sparse_pull of key 'e'"):
        kv.row_sparse_pull("e", out=RowSparse.zeros((3, 4)), row_ids=[0])
    whole = kv.pull("e")
    assert whole.indices.tolist() == [0, 1] and (whole.data == 1).all()


@needs_torch
def test_a_torch_sparse_push_with_rows_out_of_range_is_refused(make_store):
    kv = make_store("local")
    kv.init(0, torch.zeros(SHAPE))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that it does not check sparse invariants
        bad = torch.sparse_coo_tensor(torch.tensor([[1, 9]]), torch.ones(2, 4), SHAPE, check_invariants=False)
    with pytest.raises(pskv.InvalidArgumentError, match=r"sparse tensor row ids \[9\] out of range for 4 rows"):
        kv.push(0, bad)
    assert (kv.pull(0) == 0).all()


def test_pushpull_and_broadcast_refuse_row_sparse_values(make_store):
    kv = make_store("local")
    kv.init("e", RowSparse.zeros(SHAPE))
    with pytest.raises(pskv.NotSupportedError, match="value for key 'e' is row-sparse: pushpull takes dense values"):
        kv.pushpull("e", rsp([0]))
    kv.init("d", np.zeros(SHAPE, np.float32))
    with pytest.raises(pskv.NotSupportedError, match="out for key 'd' is row-sparse: pushpull takes dense values"):
        kv.pushpull("d", np.ones(SHAPE, np.float32), out=rsp([0]))
    assert (kv.pull("d") == 0).all()  # nothing ran
    with pytest.raises(pskv.NotSupportedError, match="broadcast takes dense values"):
        kv.broadcast("f", rsp([0]))


def test_gradient_compression_refuses_row_sparse_keys_and_values(make_store):
    kv = make_store("local")
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    with pytest.raises(pskv.NotSupportedError, match="init of key 'e': gradient compression '2bit' does not take row-sparse"):
        kv.init("e", rsp([0]))
    kv.init("d", np.zeros(SHAPE, np.float32))
    with pytest.raises(pskv.NotSupportedError, match="push of key 'd': gradient compression '2bit'"):
        kv.push("d", rsp([0]))
    kv.init("s", rsp([0], value=1.0), summed=True)  # keys compression leaves alone may be row-sparse
    kv.push("s", [rsp([1], value=1.0)] * 2)
    assert kv.pull("s").indices.tolist() == [1]
    small = make_store("local")
    small.set_gradient_compression({"type": "2bit", "threshold": 0.5, "min_size": 17})
    small.init("e", rsp([0], value=1.0))  # 16 elements: below min_size, not compressed
    small.push("e", rsp([2], value=0.3))
    assert small.pull("e").data[:, 0].tolist() == pytest.approx([0.3])


def test_distributed_stores_keep_row_sparse_keys_on_their_servers():
    """A dist store takes row-sparse values (tests/integration/test_sparse_dist.py has the rest): a
    row_sparse_pull into a row-sparse out gives exactly the requested rows and casts into floating
    outs; compression still refuses row-sparse keys, and a dense pull still refuses another dtype."""
    from pskv.testing import InProcessCluster

    def body(cfg):
        kv = pskv.create("dist_sync", cluster=cfg)
        try:
            kv.init(0, rsp([1, 3], value=2.0))
            kv.push(0, [rsp([0, 1], value=1.0), rsp([1], value=0.5)])
            out = RowSparse.zeros(SHAPE)
            kv.row_sparse_pull(0, out=out, row_ids=[3, 1, 1])
            cast = np.zeros(SHAPE, np.float64)
            kv.row_sparse_pull(0, out=cast, row_ids=[0])
            errors = []
            kv.init(1, np.zeros(SHAPE, np.float32))
            try:
                kv.pull(1, out=np.zeros(SHAPE, np.float64))  # no casting pulls there yet
            except pskv.DTypeMismatchError as exc:
                errors.append(str(exc))
            return out.indices.tolist(), out.data[:, 0].tolist(), cast[:, 0].tolist(), errors
        finally:
            kv.close()

    def compressed(cfg):
        kv = pskv.create("dist_sync", cluster=cfg)
        try:
            kv.set_gradient_compression({"type": "2bit"})
            with pytest.raises(pskv.CollectiveFailedError if kv.rank else pskv.NotSupportedError,
                               match="does not take row-sparse"):
                kv.init(0, rsp([0]))
            return True
        finally:
            kv.close()

    with InProcessCluster(1, 1, deadline=30.0) as cluster:
        [(ids, data, cast, errors)] = cluster.run_workers(body)
    assert ids == [1, 3] and data == [1.5, 0.0]  # the sum replaced the value: row 3 was not pushed
    assert cast == [1.0, 0.0, 0.0, 0.0]
    assert len(errors) == 1 and "pull of key 1: dtype float64" in errors[0]
    with InProcessCluster(1, 1, deadline=30.0) as cluster:
        assert cluster.run_workers(compressed) == [True]
