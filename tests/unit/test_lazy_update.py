"""MXNet's lazy (row-wise) optimizer updates: ``Optimizer.update_rows`` and the local/device stores using it.

The references below are row-by-row transcriptions of the lazy formulas (MXNet's
``for row in grad.indices: ...`` docstrings of ``sgd_update`` / ``sgd_mom_update`` /
``adam_update`` / ``_sparse_adagrad_update`` / ``ftrl_update``), each with pskv's
conventions for the rule itself (``docs/optimizers.md``: PyTorch's momentum buffer,
``epsilon`` outside the root, L2 decay added to the gradient). SGD with momentum is
written in MXNet's own state convention (``state = lr * buf``), which equals pskv's at
a constant rate. They are plain Python loops over rows in float64, written without the
optimizer code.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import pskv
from pskv import RowSparse
from pskv.errors import (
    DTypeMismatchError,
    InvalidArgumentError,
    InvalidTypeError,
    ShapeMismatchError,
    UnsupportedValueError,
)
from pskv.optimizer import NAG, SGD, AdaGrad, Adam, AdamW, Ftrl, Optimizer, RMSProp, create, get_updater
from tests.conftest import torch

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
needs_cuda = pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="needs a CUDA device")

R, D = 12, 3


# -- references: one row at a time ---------------------------------------------------------------
def _pre(opt, g):
    g = g * opt.rescale_grad
    if opt.clip_gradient is not None:
        g = np.clip(g, -opt.clip_gradient, opt.clip_gradient)
    return g


def ref_sgd(opt, w, g, st, t):
    """MXNet's lazy sgd(_mom)_update for one row; the state in MXNet's convention (lr * pskv's buffer)."""
    lr, wd = opt.learning_rate, opt.wd
    if opt.momentum == 0.0:
        w -= lr * (_pre(opt, g) + wd * w)
        return
    mom = st["momentum"] * lr  # MXNet's state
    mom[:] = opt.momentum * mom + lr * (_pre(opt, g) + wd * w)
    w -= mom
    st["momentum"][:] = mom / lr


def ref_nag(opt, w, g, st, t):
    lr, m = opt.learning_rate, opt.momentum
    g = _pre(opt, g) + opt.wd * w
    buf = st["momentum"]
    buf[:] = m * buf + g
    w -= lr * (g + m * buf)


def ref_adam(opt, w, g, st, t):
    """Lazy Adam: m, v of the row only; bias correction by the key's count t."""
    lr, b1, b2 = opt.learning_rate, opt.beta1, opt.beta2
    if isinstance(opt, AdamW):
        w *= 1.0 - lr * opt.wd
        g = _pre(opt, g)
    else:
        g = _pre(opt, g) + opt.wd * w
    m, v = st["mean"], st["var"]
    m[:] = b1 * m + (1 - b1) * g
    v[:] = b2 * v + (1 - b2) * g * g
    bc1, bc2 = 1 - b1**t, 1 - b2**t
    w -= (lr / bc1) * m / (np.sqrt(v) / math.sqrt(bc2) + opt.epsilon)


def ref_adagrad(opt, w, g, st, t):
    g = _pre(opt, g) + opt.wd * w
    h = st["history"]
    h += g * g
    w -= opt.learning_rate * g / (np.sqrt(h) + opt.eps)


def ref_ftrl(opt, w, g, st, t):
    """MXNet's ftrl_update for one row, as its docstring states it."""
    lr = opt.learning_rate
    g = _pre(opt, g)
    z, n = st["z"], st["n"]
    z += g - (np.sqrt(n + g * g) - np.sqrt(n)) * w / lr
    n += g * g
    new = (np.sign(z) * opt.lamda1 - z) / ((opt.beta + np.sqrt(n)) / lr + opt.wd)
    w[:] = np.where(np.abs(z) > opt.lamda1, new, 0.0)


def ref_rmsprop(opt, w, g, st, t):
    g = _pre(opt, g) + opt.wd * w
    rho = opt.rho
    var = st["var"]
    var[:] = rho * var + (1 - rho) * g * g
    if opt.centered:
        mean = st["mean"]
        mean[:] = rho * mean + (1 - rho) * g
        denom = np.sqrt(var - mean * mean) + opt.epsilon
    else:
        denom = np.sqrt(var) + opt.epsilon
    if opt.momentum > 0:
        mom = st["mom"]
        mom[:] = opt.momentum * mom + g / denom
        w -= opt.learning_rate * mom
    else:
        w -= opt.learning_rate * g / denom


CASES = {
    "sgd": (lambda: SGD(learning_rate=0.1, wd=0.01, rescale_grad=0.5, clip_gradient=0.4), ref_sgd),
    "sgd_momentum": (lambda: SGD(learning_rate=0.1, momentum=0.9, wd=0.01, clip_gradient=0.8), ref_sgd),
    "nag": (lambda: NAG(learning_rate=0.1, momentum=0.8, wd=0.02), ref_nag),
    "adam": (lambda: Adam(learning_rate=0.05, wd=0.01, rescale_grad=2.0), ref_adam),
    "adamw": (lambda: AdamW(learning_rate=0.05, wd=0.1), ref_adam),
    "adagrad": (lambda: AdaGrad(learning_rate=0.1, wd=0.01), ref_adagrad),
    "ftrl": (lambda: Ftrl(learning_rate=0.2, lamda1=0.05, beta=1.0, wd=0.01), ref_ftrl),
    "rmsprop_centered": (lambda: RMSProp(learning_rate=0.01, centered=True, lazy_update=True), ref_rmsprop),
}

# rows pushed per step: some rows first appear late (their Adam bias correction uses the key's count)
STEPS = [np.array([0, 3, 4, 9]), np.array([3, 5]), np.array([], dtype=np.int64), np.array([1, 3, 9, 11])]


def _setup(make_opt, seed=0):
    rng = np.random.default_rng(seed)
    opt = make_opt()
    w = rng.standard_normal((R, D))
    state = opt.create_state(0, w)
    return opt, w, state, rng


def _named(opt, w, state):
    names = opt.state_names(pskv.arrays.describe(w))
    return dict(zip(names, state or (), strict=True))


@pytest.mark.parametrize("case", sorted(CASES))
def test_update_rows_matches_the_row_by_row_reference_and_leaves_other_rows_bit_identical(case):
    make_opt, ref = CASES[case]
    opt, w, state, rng = _setup(make_opt)
    assert opt.lazy_update
    ref_w = w.copy()
    ref_st = {k: v.copy() for k, v in _named(opt, w, state).items()}
    for step, ids in enumerate(STEPS, start=1):
        rows = rng.standard_normal((len(ids), D))
        before_w, before_st = w.copy(), [a.copy() for a in state or ()]
        opt.update_rows("emb", w, ids, rows, state)
        assert opt.get_update_count("emb") == step  # one count per call, even with no rows
        for i, r in zip(ids, rows, strict=True):
            ref(opt, ref_w[i], r, {k: v[i] for k, v in ref_st.items()}, step)
        untouched = np.setdiff1d(np.arange(R), ids)
        assert np.array_equal(w[untouched], before_w[untouched])
        for a, b in zip(state or (), before_st, strict=True):
            assert np.array_equal(a[untouched], b[untouched])
        np.testing.assert_allclose(w, ref_w, rtol=1e-12, atol=1e-14)
        for name, a in _named(opt, w, state).items():
            np.testing.assert_allclose(a, ref_st[name], rtol=1e-12, atol=1e-14, err_msg=name)


@pytest.mark.parametrize("case", sorted(CASES))
def test_with_every_row_present_the_lazy_update_is_the_dense_update_bit_for_bit(case):
    make_opt, _ = CASES[case]
    lazy, w1, s1, rng = _setup(make_opt)
    dense, w2, s2, _ = _setup(make_opt)
    for _ in range(3):
        g = rng.standard_normal((R, D))
        lazy.update_rows(7, w1, np.arange(R), g, s1)
        dense.update(7, w2, g, s2)
    assert np.array_equal(w1, w2)
    for a, b in zip(s1 or (), s2 or (), strict=True):
        assert np.array_equal(a, b)


def test_plain_sgd_without_decay_is_lazy_and_dense_alike_with_rows_missing():
    """MXNet's math: with no momentum and wd=0 a zero gradient row does not move, so lazy == dense."""
    lazy, dense = SGD(learning_rate=0.3), SGD(learning_rate=0.3, lazy_update=False)
    w1 = np.random.default_rng(1).standard_normal((R, D))
    w2 = w1.copy()
    for ids in STEPS:
        g = np.random.default_rng(len(ids)).standard_normal((len(ids), D))
        lazy.update_rows(0, w1, ids, g, None)
        dense.update_rows(0, w2, ids, g, None)
    assert np.array_equal(w1, w2)


@pytest.mark.parametrize("make_opt", [lambda **k: SGD(momentum=0.9, wd=0.01, **k), lambda **k: Adam(**k),
                                      lambda **k: SGD(wd=0.1, **k)], ids=["sgd_momentum", "adam", "sgd_wd"])
def test_lazy_update_false_runs_the_dense_update_of_the_scattered_gradient(make_opt):
    opt, ref = make_opt(lazy_update=False), make_opt(lazy_update=False)
    rng = np.random.default_rng(2)
    w = rng.standard_normal((R, D))
    w_ref = w.copy()
    s, s_ref = opt.create_state(0, w), ref.create_state(0, w_ref)
    for step, ids in enumerate(STEPS):
        rows = rng.standard_normal((len(ids), D))
        before = w.copy()
        opt.update_rows(0, w, ids, rows, s)
        dense = np.zeros((R, D))
        dense[ids] = rows
        ref.update(0, w_ref, dense, s_ref)
        assert np.array_equal(w, w_ref)
        if step > 0:  # momentum, moments or decay move rows the gradient does not hold
            missing = np.setdiff1d(np.arange(R), ids)
            assert not np.array_equal(w[missing], before[missing])


def test_lazy_and_dense_differ_where_mxnet_says_they_do():
    """With momentum the dense update keeps moving rows absent from the gradient; the lazy one does not."""
    lazy, dense = SGD(learning_rate=0.1, momentum=0.9), SGD(learning_rate=0.1, momentum=0.9, lazy_update=False)
    w1 = np.ones((R, D))
    w2 = w1.copy()
    s1, s2 = lazy.create_state(0, w1), dense.create_state(0, w2)
    for ids in (np.arange(R), np.array([2])):
        g = np.ones((len(ids), D))
        lazy.update_rows(0, w1, ids, g, s1)
        dense.update_rows(0, w2, ids, g, s2)
    assert np.array_equal(w1[2], w2[2])
    assert np.array_equal(w1[0], np.full(D, 0.9)) and np.allclose(w2[0], 0.9 - 0.1 * 0.9)


def test_multi_precision_updates_the_master_rows_only():
    opt = SGD(learning_rate=0.1, momentum=0.9, multi_precision=True)
    w = np.random.default_rng(3).standard_normal((R, D)).astype(np.float16)
    state = opt.create_state(0, w)
    assert len(state) == 2 and state[0].dtype == np.float32
    before = [w.copy()] + [a.copy() for a in state]
    ids = np.array([1, 6])
    opt.update_rows(0, w, ids, np.ones((2, D), np.float16), state)
    rest = np.setdiff1d(np.arange(R), ids)
    for a, b in zip([w, *state], before, strict=True):
        assert np.array_equal(a[rest], b[rest])
    expected = before[1][ids] - np.float32(0.1)
    assert np.array_equal(state[0][ids], expected) and np.array_equal(w[ids], expected.astype(np.float16))


# -- hostile input -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("ids", "rows", "error", "words"), [
    (np.array([3, 1]), (2, D), InvalidArgumentError, "sorted and unique"),
    (np.array([1, 1]), (2, D), InvalidArgumentError, "sorted and unique"),
    (np.array([0, R]), (2, D), InvalidArgumentError, "out of range"),
    (np.array([-1, 2]), (2, D), InvalidArgumentError, "out of range"),
    (np.array([0.0, 1.0]), (2, D), InvalidTypeError, "integer"),
    ([0, 1], (2, D), InvalidTypeError, "integer"),
    (np.array([[0, 1]]), (2, D), InvalidArgumentError, "1-D"),
    (np.array([0, 1]), (3, D), ShapeMismatchError, "shape"),
    (np.array([0, 1]), (2, D + 1), ShapeMismatchError, "shape"),
])
def test_hostile_rows_are_refused_naming_the_key_and_change_nothing(ids, rows, error, words):
    opt = Adam()
    w = np.random.default_rng(4).standard_normal((R, D))
    state = opt.create_state("table", w)
    before = [w.copy()] + [a.copy() for a in state]
    with pytest.raises(error, match=words) as info:
        opt.update_rows("table", w, ids, np.ones(rows), state)
    assert "'table'" in str(info.value)
    assert all(np.array_equal(a, b) for a, b in zip([w, *state], before, strict=True))
    assert opt.get_update_count("table") == 0


def test_wrong_dtypes_and_state_are_refused():
    opt = SGD(momentum=0.9)
    w = np.zeros((R, D), np.float32)
    with pytest.raises(DTypeMismatchError, match="'k'"):
        opt.update_rows("k", w, np.array([0]), np.ones((1, D), np.float64), opt.create_state("k", w))
    with pytest.raises(InvalidArgumentError, match="expects state arrays"):
        opt.update_rows("k", w, np.array([0]), np.ones((1, D), np.float32), None)
    with pytest.raises(UnsupportedValueError, match="'k'"):
        opt.update_rows("k", np.zeros((R, D), np.int32), np.array([0]), np.ones((1, D), np.int32), None)
    with pytest.raises(InvalidArgumentError, match="no rows"):
        SGD().update_rows("k", np.ones(()), np.array([0]), np.ones(1), None)


# -- config ----------------------------------------------------------------------------------------------
def test_lazy_update_defaults_and_config_round_trip():
    defaults = {"sgd": True, "nag": True, "adam": True, "adamw": True, "adagrad": True, "ftrl": True,
                "rmsprop": False}
    for name, lazy in defaults.items():
        assert create(name).lazy_update is lazy, name
        for flag in (True, False):
            config = json.loads(json.dumps(create(name, lazy_update=flag).to_config()))
            assert config["params"]["lazy_update"] is flag
            assert Optimizer.from_config(config).lazy_update is flag
        older = create(name).to_config()
        del older["params"]["lazy_update"]  # a config written before lazy_update existed
        assert Optimizer.from_config(older).lazy_update is lazy
    with pytest.raises(InvalidArgumentError, match="lazy_update"):
        SGD(lazy_update="yes")


# -- the updater ---------------------------------------------------------------------------------------
def test_updater_takes_row_sparse_gradients_and_checks_every_key_first():
    opt = Adam(learning_rate=0.1)
    updater = get_updater(opt)
    w = np.random.default_rng(5).standard_normal((R, D)).astype(np.float32)
    ref_opt, ref_w = Adam(learning_rate=0.1), w.copy()
    ref_state = ref_opt.create_state(0, ref_w)
    g = RowSparse([4, 1], np.ones((2, D), np.float32), (R, D))
    updater(0, g, w)
    ref_opt.update_rows(0, ref_w, g.indices, g.data, ref_state)
    assert np.array_equal(w, ref_w)
    other = np.zeros((R, D), np.float32)
    before = (w.copy(), other.copy(), [a.copy() for a in updater.states[0]])
    with pytest.raises(InvalidArgumentError, match="'bad'"):
        updater.update_rows([0, "bad"], [np.array([2]), np.array([2, 2])],
                            [np.ones((1, D), np.float32), np.ones((2, D), np.float32)], [w, other])
    assert np.array_equal(w, before[0]) and np.array_equal(other, before[1])
    assert all(np.array_equal(a, b) for a, b in zip(updater.states[0], before[2], strict=True))
    assert opt.get_update_count(0) == 1 and "bad" not in updater.states


@needs_torch
def test_torch_weights_update_their_rows_like_numpy():
    for make_opt, _ in CASES.values():
        opt_np, w_np, s_np, rng = _setup(make_opt, seed=6)
        opt_t = make_opt()
        w_t = torch.tensor(w_np.copy())
        s_t = opt_t.create_state(0, w_t)
        for ids in STEPS:
            rows = rng.standard_normal((len(ids), D))
            before = w_t.clone()
            opt_np.update_rows(0, w_np, ids, rows, s_np)
            opt_t.update_rows(0, w_t, torch.from_numpy(ids), torch.from_numpy(rows), s_t)
            rest = np.setdiff1d(np.arange(R), ids)
            assert torch.equal(w_t[rest], before[rest])
        np.testing.assert_allclose(w_t.numpy(), w_np, rtol=1e-10, atol=1e-12, err_msg=str(type(opt_t)))
        for a, b in zip(s_t or (), s_np or (), strict=True):
            np.testing.assert_allclose(a.numpy(), b, rtol=1e-10, atol=1e-12)


@needs_torch
def test_updater_takes_an_embedding_sparse_gradient():
    emb = torch.nn.Embedding(R, D, sparse=True)
    emb(torch.tensor([[3, 5, 3]])).sum().backward()
    weight = emb.weight.detach().clone()
    before = weight.clone()
    updater = get_updater(SGD(learning_rate=1.0, momentum=0.5))
    updater("emb", emb.weight.grad, weight)
    changed = (weight != before).any(dim=1).nonzero().reshape(-1).tolist()
    assert changed == [3, 5]
    assert torch.equal(weight[3], before[3] - 2.0) and torch.equal(weight[5], before[5] - 1.0)


@needs_cuda
def test_cuda_weights_update_their_rows_on_the_device():
    opt, ref = Adam(learning_rate=0.1, wd=0.01), Adam(learning_rate=0.1, wd=0.01)
    w = torch.randn(R, D, device="cuda")
    w_ref = w.cpu().numpy().astype(np.float64)
    s, s_ref = opt.create_state(0, w), ref.create_state(0, w_ref)
    for ids in STEPS:
        rows = torch.randn(len(ids), D, device="cuda")
        opt.update_rows(0, w, torch.from_numpy(ids).cuda(), rows, s)
        ref.update_rows(0, w_ref, ids, rows.cpu().numpy().astype(np.float64), s_ref)
    assert w.device.type == "cuda" and all(a.device.type == "cuda" for a in s)
    np.testing.assert_allclose(w.cpu().numpy(), w_ref, rtol=1e-5, atol=1e-6)


# -- the local and device stores -----------------------------------------------------------------------
def _stored(kv, key):
    return kv.row_sparse_pull(key, row_ids=range(R)).todense()


@pytest.mark.parametrize("name", ["local", "device"])
@pytest.mark.parametrize("case", ["sgd_momentum", "adam", "ftrl"])
def test_a_lazy_push_touches_only_the_pushed_rows_and_their_state(make_store, name, case):
    make_opt, ref = CASES[case]
    kv = make_store(name)
    rng = np.random.default_rng(7)
    w0 = rng.standard_normal((R, D)).astype(np.float32)
    kv.init("emb", RowSparse.from_dense(w0, rows=range(R)))
    opt = make_opt()
    kv.set_optimizer(opt)
    ref_opt = make_opt()
    ref_w = w0.astype(np.float64)
    ref_st = {k: v.astype(np.float64) for k, v in _named(ref_opt, ref_w, ref_opt.create_state(0, ref_w)).items()}
    for step, ids in enumerate([np.arange(R), *STEPS], start=1):
        # two values per push (one per device), a row in both is summed first
        half = ids[: len(ids) // 2 + 1]
        a = rng.standard_normal((len(ids), D)).astype(np.float32)
        b = rng.standard_normal((len(half), D)).astype(np.float32)
        before = _stored(kv, "emb")
        states_before = [s.copy() for s in kv._updater.states.get("emb") or ()]
        kv.push("emb", [RowSparse(ids, a, (R, D)), RowSparse(half, b, (R, D))])
        after = _stored(kv, "emb")
        rest = np.setdiff1d(np.arange(R), ids)
        assert np.array_equal(after[rest], before[rest])
        if step > 1:
            for s, s0 in zip(kv._updater.states["emb"], states_before, strict=True):
                assert np.array_equal(s[rest], s0[rest])
        summed = a.astype(np.float64)
        summed[: len(half)] += b
        for i, r in zip(ids, summed, strict=True):
            ref(ref_opt, ref_w[i], r, {k: v[i] for k, v in ref_st.items()}, step)
        np.testing.assert_allclose(after, ref_w, rtol=1e-5, atol=1e-5)
    assert kv._entries["emb"].merge is None  # never a dense merge buffer: a push costs its rows


MXNET_LAZY = Path(__file__).resolve().parents[1] / "data" / "mxnet_lazy_local.json"


def _mxnet_runs():
    doc = json.loads(MXNET_LAZY.read_text(encoding="utf-8"))
    return [(doc["rows"], doc["dim"], run) for run in doc["runs"]]


@pytest.mark.parametrize("run", _mxnet_runs(),
                         ids=lambda r: f"{r[2]['optimizer']}-{'-'.join(sorted(r[2]['params']))}")
def test_pushes_replayed_on_pskv_give_mxnet_191s_lazy_updates(make_store, run):
    """``bench/mxnet_lazy_reference.py`` recorded MXNet 1.9.1's 'local' store: a row-sparse key, an optimizer,
    two row-sparse values per push, the table pulled after each push (SGD with and without momentum, SGD with
    lazy_update=False, Adam, AdaGrad, FTRL). pskv's pushes give the same tables up to float32 rounding."""
    rows, dim, rec = run
    kv = make_store("local")
    kv.init(0, RowSparse(np.arange(rows), np.array(rec["table"], np.float32), (rows, dim)))
    kv.set_optimizer(create(rec["optimizer"], **rec["params"]))
    for values, pulled in zip(rec["pushes"], rec["pulls"], strict=True):
        kv.push(0, [RowSparse(np.array(v["rows"], np.int64), np.array(v["data"], np.float32).reshape(-1, dim),
                              (rows, dim)) for v in values])
        got = kv.row_sparse_pull(0, row_ids=range(rows)).todense()
        np.testing.assert_allclose(got, np.array(pulled, np.float32), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["local", "device"])
def test_lazy_update_false_keeps_the_dense_update_in_the_store(make_store, name):
    lazy_kv, dense_kv = make_store(name), make_store(name)
    w0 = np.ones((R, D), np.float32)
    for kv, lazy in ((lazy_kv, True), (dense_kv, False)):
        kv.init(0, RowSparse.from_dense(w0, rows=range(R)))
        kv.set_optimizer(SGD(learning_rate=0.1, momentum=0.9, lazy_update=lazy))
        kv.push(0, RowSparse(np.arange(R), np.ones((R, D), np.float32), (R, D)))
        kv.push(0, RowSparse([2], np.ones((1, D), np.float32), (R, D)))
    lazy_w, dense_w = _stored(lazy_kv, 0), _stored(dense_kv, 0)
    assert np.array_equal(lazy_w[2], dense_w[2])
    assert np.allclose(lazy_w[0], 0.9) and np.allclose(dense_w[0], 0.9 - 0.09)  # momentum moves absent rows


def test_row_sparse_keys_gain_the_rows_a_lazy_push_updates(make_store):
    kv = make_store("local")
    kv.init("e", RowSparse([1], np.ones((1, D), np.float32), (R, D)))
    kv.set_optimizer(SGD(learning_rate=0.5))
    kv.push("e", RowSparse([1, 7], np.ones((2, D), np.float32), (R, D)))
    out = RowSparse.zeros((R, D))
    kv.pull("e", out=out, ignore_sparse=False)
    assert out.indices.tolist() == [1, 7] and out.data[:, 0].tolist() == [0.5, -0.5]


def test_a_dense_key_pushed_row_sparse_gradients_is_updated_lazily_too(make_store):
    """MXNet: lazy when the weight and its states share a storage type (dense here) and the gradient is row_sparse."""
    kv = make_store("local")
    kv.init("w", np.ones((R, D), np.float32))
    kv.set_optimizer(SGD(learning_rate=0.1, wd=0.5))
    kv.push("w", RowSparse([4], np.zeros((1, D), np.float32), (R, D)))
    out = kv.pull("w")
    assert np.allclose(out[4], 0.95) and (np.delete(out, 4, axis=0) == 1).all()


def test_a_failing_key_in_a_lazy_push_changes_no_key(make_store):
    kv = make_store("local")
    kv.init(["emb", "ints"], [RowSparse.from_dense(np.ones((R, D), np.float32), rows=range(R)),
                              np.zeros(4, np.int32)])
    kv.set_optimizer(Adam())
    with pytest.raises(UnsupportedValueError, match="'ints'"):
        kv.push(["emb", "ints"], [RowSparse([3], np.ones((1, D), np.float32), (R, D)), np.ones(4, np.int32)])
    assert (_stored(kv, "emb") == 1).all() and kv._updater.optimizer.get_update_count("emb") == 0


def test_optimizer_states_of_a_lazily_updated_key_save_and_load(make_store, tmp_path):
    kv = make_store("local")
    kv.init(0, RowSparse.zeros((R, D)))
    kv.set_optimizer(Adam(learning_rate=0.1))
    kv.push(0, RowSparse([2, 5], np.ones((2, D), np.float32), (R, D)))
    kv.save_optimizer_states(str(tmp_path / "s.safetensors"), dump_optimizer=True)
    fresh = make_store("local")
    fresh.init(0, RowSparse.from_dense(_stored(kv, 0)))
    fresh.load_optimizer_states(str(tmp_path / "s.safetensors"))
    assert fresh._updater.optimizer.lazy_update
    for store in (kv, fresh):
        store.push(0, RowSparse([5, 9], np.full((2, D), 0.5, np.float32), (R, D)))
    assert np.array_equal(_stored(kv, 0), _stored(fresh, 0))
    for a, b in zip(kv._updater.states[0], fresh._updater.states[0], strict=True):
        assert np.array_equal(a, b)


@needs_torch
@pytest.mark.parametrize("name", ["local", "device"])
def test_a_torch_table_takes_embedding_gradients_lazily(make_store, name):
    torch.manual_seed(0)
    emb = torch.nn.Embedding(R, D, sparse=True)
    torch_kv, numpy_kv = make_store(name), make_store(name)
    w0 = emb.weight.detach().clone()
    torch_kv.init("emb", w0.to_sparse(1))
    numpy_kv.init("emb", RowSparse.from_dense(w0.numpy(), rows=range(R)))
    for kv in (torch_kv, numpy_kv):
        kv.set_optimizer(Adam(learning_rate=0.1))
    for ids in ([[1, 4, 4]], [[4, 7, 7]]):
        emb.zero_grad()
        (emb(torch.tensor(ids)) ** 2).sum().backward()
        before = torch_kv.row_sparse_pull("emb", row_ids=range(R)).to_dense()
        torch_kv.push("emb", emb.weight.grad)
        numpy_kv.push("emb", RowSparse.from_torch(emb.weight.grad))
        after = torch_kv.row_sparse_pull("emb", row_ids=range(R)).to_dense()
        changed = (after != before).any(dim=1).nonzero().reshape(-1).tolist()
        assert changed == sorted(set(ids[0]))
    np.testing.assert_allclose(after.numpy(), _stored(numpy_kv, "emb"), rtol=1e-6, atol=1e-7)  # torch folds Adam differently


@needs_cuda
def test_a_cuda_table_on_the_device_store_updates_rows_on_the_gpu(make_store):
    kv = make_store("device")
    w0 = torch.randn(R, D, device="cuda")
    kv.init("emb", w0.to_sparse(1))
    kv.set_optimizer(SGD(learning_rate=0.5, momentum=0.9))
    grad = torch.sparse_coo_tensor(torch.tensor([[2, 9]]), torch.ones(2, D), (R, D)).cuda()
    kv.push("emb", grad)
    out = kv.row_sparse_pull("emb", row_ids=range(R)).to_dense()
    assert out.device.type == "cuda" and kv._entries["emb"].value.device.type == "cuda"
    expected = w0.clone()
    expected[[2, 9]] -= 0.5
    assert torch.equal(out, expected)
