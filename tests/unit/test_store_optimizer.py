"""Optimizers running inside a store: set_optimizer, state files, errors."""

from __future__ import annotations

import numpy as np
import pytest

import pskv
from pskv.optimizer import SGD, Adam
from tests.conftest import Arrays

SHAPE = (3, 5)


def sgd_reference(w, grads_per_step, lr, momentum, rescale, wd=0.0):
    """Plain NumPy SGD with momentum (PyTorch convention), the sum of device grads per step."""
    w = w.astype(np.float64).copy()
    buf = None
    for grads in grads_per_step:
        g = rescale * sum(grads) + wd * w
        buf = g if buf is None else momentum * buf + g
        w -= lr * buf
    return w


def steps(n, devices=4, seed=0):
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(SHAPE) for _ in range(devices)] for _ in range(n)]


def test_sgd_in_store_matches_reference(kv, arr):
    w0 = np.random.default_rng(1).standard_normal(SHAPE)
    kv.set_optimizer(SGD(learning_rate=0.1, momentum=0.9, wd=0.01, rescale_grad=0.25))
    kv.init("w", arr.from_np(w0))
    grads = steps(4)
    for g in grads:
        kv.push("w", [arr.from_np(x) for x in g])
    want = sgd_reference(w0, grads, 0.1, 0.9, 0.25, wd=0.01)
    np.testing.assert_allclose(Arrays.np(kv.pull("w")), want, rtol=1e-12)


def test_set_optimizer_again_keeps_state_and_takes_new_hyperparameters(kv):
    w0 = np.zeros(SHAPE)
    kv.init(0, w0)
    kv.set_optimizer(SGD(learning_rate=0.1, momentum=0.5))
    grads = steps(2, devices=1)
    kv.push(0, grads[0])
    kv.set_optimizer(SGD(learning_rate=0.01, momentum=0.5))
    kv.push(0, grads[1])
    buf1 = grads[0][0]
    w1 = -0.1 * buf1
    buf2 = 0.5 * buf1 + grads[1][0]  # momentum survived the second set_optimizer
    np.testing.assert_allclose(kv.pull(0), w1 - 0.01 * buf2, rtol=1e-12)


def test_optimizer_states_round_trip_through_a_file(make_store, tmp_path):
    grads = steps(6, devices=2, seed=3)
    w0 = np.ones(SHAPE)

    def fresh():
        kv = make_store("local")
        kv.init(["a", "b"], [w0, w0 * 2])
        return kv

    continuous = fresh()
    continuous.set_optimizer(Adam(learning_rate=0.01))
    for g in grads:
        continuous.push(["a", "b"], [g, g])

    first = fresh()
    first.set_optimizer(Adam(learning_rate=0.01))
    for g in grads[:3]:
        first.push(["a", "b"], [g, g])
    path = tmp_path / "opt.safetensors"
    first.save_optimizer_states(str(path), dump_optimizer=True)
    weights = first.pull(["a", "b"])

    resumed = make_store("local")
    resumed.init(["a", "b"], weights)
    resumed.load_optimizer_states(str(path))  # no optimizer yet: installed from the file
    for g in grads[3:]:
        resumed.push(["a", "b"], [g, g])
    for k in ("a", "b"):
        np.testing.assert_allclose(resumed.pull(k), continuous.pull(k), rtol=1e-12)

    other = make_store("local")
    other.init(["a", "b"], weights)
    other.set_optimizer(Adam(learning_rate=0.5))
    other.load_optimizer_states(str(path))  # dumped config replaces the lr too
    for g in grads[3:]:
        other.push(["a", "b"], [g, g])
    np.testing.assert_allclose(other.pull("a"), continuous.pull("a"), rtol=1e-12)


def test_state_file_errors(make_store, tmp_path):
    kv = make_store("local")
    kv.init(0, np.zeros(SHAPE))
    with pytest.raises(pskv.OptimizerStateError, match="no optimizer is set"):
        kv.save_optimizer_states(str(tmp_path / "x"))
    kv.set_optimizer(SGD(learning_rate=0.1))
    kv.push(0, np.ones(SHAPE))
    path = tmp_path / "no_config.safetensors"
    kv.save_optimizer_states(str(path))
    bare = make_store("local")
    with pytest.raises(pskv.OptimizerStateError, match="holds no optimizer config"):
        bare.load_optimizer_states(str(path))
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x00" * 64)
    with pytest.raises(pskv.OptimizerStateError):
        kv.load_optimizer_states(str(junk))
    # the file system's errors too, naming the file (as the dist stores do): every pskv error is a KVStoreError
    with pytest.raises(pskv.OptimizerStateError, match="load_optimizer_states: cannot read .*missing"):
        kv.load_optimizer_states(str(tmp_path / "missing"))
    with pytest.raises(pskv.OptimizerStateError, match="save_optimizer_states: cannot write .*nodir"):
        kv.save_optimizer_states(str(tmp_path / "nodir" / "x"))


def test_set_optimizer_rejects_other_objects(kv):
    with pytest.raises(pskv.InvalidTypeError, match="pskv.optimizer.Optimizer"):
        kv.set_optimizer(lambda *a: None)


def test_optimizer_on_int_values_raises_and_changes_nothing(kv):
    kv.init(0, np.ones(SHAPE, np.int64))
    kv.set_optimizer(SGD(learning_rate=0.1))
    with pytest.raises(pskv.UnsupportedValueError, match="int64"):
        kv.push(0, np.ones(SHAPE, np.int64))
    np.testing.assert_array_equal(kv.pull(0), np.ones(SHAPE, np.int64))


def test_multi_precision_float16_in_store(kv):
    kv.init(0, np.ones(SHAPE, np.float16))
    kv.set_optimizer(SGD(learning_rate=1e-4, multi_precision=True))
    for _ in range(10):
        kv.push(0, np.ones(SHAPE, np.float16))
    # fp32 master accumulates 10 tiny steps that fp16 alone would round away
    np.testing.assert_allclose(kv.pull(0).astype(np.float32), np.float16(1 - 1e-3), rtol=1e-3)
    plain = pskv.create("local")
    try:
        plain.init(0, np.ones(SHAPE, np.float16))
        plain.set_optimizer(SGD(learning_rate=1e-4))
        for _ in range(10):
            plain.push(0, np.ones(SHAPE, np.float16))
        assert plain.pull(0)[0, 0] == np.float16(1.0)
    finally:
        plain.close()


def test_optimizer_failure_in_key_list_changes_no_key(make_store):
    kv = make_store("local")
    kv.init([1, 2], [np.ones(SHAPE), np.ones(SHAPE, np.int32)])
    kv.set_optimizer(SGD(learning_rate=0.1))
    with pytest.raises(pskv.UnsupportedValueError, match="key 2"):
        kv.push([1, 2], [np.ones(SHAPE), np.ones(SHAPE, np.int32)])
    np.testing.assert_array_equal(kv.pull(1), np.ones(SHAPE))
