"""Updater validation, optimizer swaps and the safetensors state file."""

from __future__ import annotations

import json
import os
import pickle
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from pskv.errors import (
    DTypeMismatchError,
    InvalidArgumentError,
    KeyTypeError,
    OptimizerStateError,
    ShapeMismatchError,
    UnsupportedValueError,
)
from pskv.optimizer import SGD, Adam, Optimizer, RMSProp, Updater, create, get_updater, states


def _grads(n: int, shape: tuple[int, ...] = (3, 4), seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for _ in range(n)]


def _snapshot(upd: Updater) -> dict[Any, list[np.ndarray]]:
    return {k: [np.array(s, copy=True) for s in (v or ())] for k, v in upd.states.items()}


# --------------------------------------------------------------------------- validation
def test_validation_failures_change_nothing() -> None:
    upd = get_updater(Adam(learning_rate=0.1))
    w = np.ones((3, 4))
    upd(0, _grads(1)[0], w)
    w_before, s_before, count = w.copy(), _snapshot(upd), upd.optimizer.get_update_count(0)
    bad_calls = [
        ((0, np.ones((4, 3)), w), ShapeMismatchError),
        ((0, np.ones((3, 4), dtype=np.float32), w), DTypeMismatchError),
        ((0, [[1.0] * 4] * 3, w), UnsupportedValueError),
        ((1.5, np.ones((3, 4)), w), KeyTypeError),
        (([0, 1], [np.ones((3, 4)), np.ones(2)], [w, np.ones(3)]), ShapeMismatchError),
        (([0, 0], [np.ones((3, 4))] * 2, [w, w]), InvalidArgumentError),
        (([0, 1], [np.ones((3, 4))], [w]), InvalidArgumentError),
    ]
    for args, exc in bad_calls:
        with pytest.raises(exc):
            upd(*args)
        np.testing.assert_array_equal(w, w_before)
        assert upd.optimizer.get_update_count(0) == count
        after = _snapshot(upd)
        assert after.keys() == s_before.keys()
        for k in after:
            for a, b in zip(after[k], s_before[k], strict=True):
                np.testing.assert_array_equal(a, b)


def test_error_messages_name_the_key() -> None:
    upd = get_updater(SGD())
    with pytest.raises(ShapeMismatchError, match="'emb'"):
        upd("emb", np.ones(2), np.ones(3))
    with pytest.raises(DTypeMismatchError, match="key 7"):
        upd(7, np.ones(3, dtype=np.float32), np.ones(3))
    with pytest.raises(UnsupportedValueError, match="key 7.*int64"):
        upd(7, np.ones(3, dtype=np.int64), np.ones(3, dtype=np.int64))


def test_weight_shape_change_is_reported() -> None:
    upd = get_updater(SGD(momentum=0.9))
    upd(0, np.ones(3), np.ones(3))
    with pytest.raises(ShapeMismatchError, match="key 0"):
        upd(0, np.ones(4), np.ones(4))


def test_list_call_updates_every_key() -> None:
    upd = get_updater(SGD(learning_rate=0.5))
    ws = [np.ones(2), np.ones(3)]
    upd(["a", "b"], [np.ones(2), np.ones(3)], ws)
    np.testing.assert_array_equal(ws[0], 0.5)
    np.testing.assert_array_equal(ws[1], 0.5)


def test_grad_on_other_backend_is_brought_to_the_weight() -> None:
    torch = pytest.importorskip("torch")
    upd = get_updater(SGD(learning_rate=0.5, momentum=0.5))
    w = torch.ones(3, dtype=torch.float64)
    upd(0, np.ones(3), w)
    wn = np.ones(3)
    upd(1, torch.ones(3, dtype=torch.float64), wn)
    assert torch.equal(w, torch.full((3,), 0.5, dtype=torch.float64))
    np.testing.assert_array_equal(wn, 0.5)
    assert isinstance(upd.states[0][0], torch.Tensor) and isinstance(upd.states[1][0], np.ndarray)


# --------------------------------------------------------------------------- set_optimizer
def test_set_optimizer_keeps_state_and_counts() -> None:
    torch = pytest.importorskip("torch")
    grads = _grads(5, seed=1)
    w0 = np.random.default_rng(2).standard_normal((3, 4))
    p = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    ref = torch.optim.Adam([p], lr=0.01)
    upd = get_updater(Adam(learning_rate=0.01))
    w = w0.copy()
    for i, g in enumerate(grads):
        if i == 3:
            ref.param_groups[0]["lr"] = 0.002
            upd.set_optimizer(Adam(learning_rate=0.002))
        p.grad = torch.from_numpy(g.copy())
        ref.step()
        upd("k", g, w)
    np.testing.assert_allclose(w, p.detach().numpy(), rtol=1e-10)
    assert upd.optimizer.get_update_count("k") == 5 and upd.optimizer.num_update == 5


def test_set_optimizer_layout_change_keeps_matching_arrays() -> None:
    upd = get_updater(RMSProp(learning_rate=0.1))
    w = np.ones(3)
    upd(0, np.ones(3), w)
    var = np.array(upd.states[0][0], copy=True)
    upd.set_optimizer(RMSProp(learning_rate=0.1, momentum=0.5))
    upd(0, np.zeros(3), w)  # zero grad: var decays by rho, mom gets 0
    state = upd.states[0]
    assert state is not None and len(state) == 2
    np.testing.assert_allclose(state[0], 0.9 * var)
    with pytest.raises(InvalidArgumentError):
        upd.set_optimizer("sgd")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- save / load
def _train(upd: Updater, weights: dict[Any, Any], grads: list[np.ndarray], conv: Any = lambda g: g) -> None:
    for g in grads:
        for k, w in weights.items():
            upd(k, conv(g), w)


@pytest.mark.parametrize("keys", [[0, 5], ["emb", "fc.weight"]], ids=["int", "str"])
@pytest.mark.parametrize("dump", [False, True])
def test_save_load_round_trip(tmp_path: Path, keys: list[Any], dump: bool) -> None:
    grads = _grads(6, seed=4)
    full = {k: np.ones((3, 4)) for k in keys}
    _train(get_updater(Adam(learning_rate=0.05)), full, grads)

    first = get_updater(Adam(learning_rate=0.05))
    part = {k: np.ones((3, 4)) for k in keys}
    _train(first, part, grads[:3])
    fname = tmp_path / "states.safetensors"
    first.save_states(fname, dump_optimizer=dump)

    second = get_updater(Adam(learning_rate=0.05 if not dump else 9.0, beta1=0.5 if dump else 0.9))
    second.load_states(fname)
    assert second.optimizer.get_update_count(keys[0]) == 3 and second.optimizer.num_update == 3
    if dump:
        assert second.optimizer.learning_rate == 0.05 and second.optimizer.beta1 == 0.9  # type: ignore[attr-defined]
    _train(second, part, grads[3:])
    for k in keys:
        np.testing.assert_allclose(part[k], full[k], rtol=1e-12)


def test_load_without_dump_keeps_optimizer(tmp_path: Path) -> None:
    a = get_updater(SGD(learning_rate=0.1, momentum=0.9))
    a(1, np.ones(2), np.ones(2))
    a.save_states(tmp_path / "s")
    opt = SGD(learning_rate=0.7, momentum=0.9)
    b = get_updater(opt)
    b.load_states(tmp_path / "s")
    assert b.optimizer is opt and opt.learning_rate == 0.7 and opt.get_update_count(1) == 1


def test_bytes_round_trip_and_pending_resave() -> None:
    upd = get_updater(SGD(learning_rate=0.1, momentum=0.9))
    upd("a", np.ones(2), np.ones(2))
    upd("b", np.ones(2), np.ones(2))
    data = upd.get_states(dump_optimizer=True)
    other = get_updater(SGD())
    other.set_states(data)
    # not yet used: states are still pending, and saving them again keeps them
    again = states.loads(other.get_states())
    assert [ks.key for ks in again.keys] == ["a", "b"]
    np.testing.assert_array_equal(again.keys[0].arrays[0], upd.states["a"][0])


def test_loaded_states_move_to_the_weights_backend(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    a = get_updater(SGD(learning_rate=0.1, momentum=0.9))
    a(0, np.ones(3), np.ones(3))
    a.save_states(tmp_path / "s")
    b = get_updater(SGD(learning_rate=0.1, momentum=0.9))
    b.load_states(tmp_path / "s")
    w = torch.full((3,), 0.9, dtype=torch.float64)
    b(0, torch.ones(3, dtype=torch.float64), w)
    assert isinstance(b.states[0][0], torch.Tensor)
    torch.testing.assert_close(b.states[0][0], torch.full((3,), 1.9, dtype=torch.float64))


def test_loaded_state_shape_mismatch(tmp_path: Path) -> None:
    a = get_updater(Adam())
    a(0, np.ones(3), np.ones(3))
    a.save_states(tmp_path / "s")
    b = get_updater(Adam())
    b.load_states(tmp_path / "s")
    w = np.ones(4)
    with pytest.raises(OptimizerStateError, match="shape"):
        b(0, np.ones(4), w)
    np.testing.assert_array_equal(w, 1.0)


@pytest.mark.parametrize("mp", [False, True])
def test_bfloat16_state_round_trip(tmp_path: Path, mp: bool) -> None:
    torch = pytest.importorskip("torch")
    grads = [torch.from_numpy(g).to(torch.bfloat16) for g in _grads(6, (5,), seed=9)]
    full = torch.linspace(-1, 1, 5, dtype=torch.bfloat16)
    part = full.clone()
    ref_upd = get_updater(Adam(learning_rate=0.01, multi_precision=mp))
    for g in grads:
        ref_upd(0, g, full)
    a = get_updater(Adam(learning_rate=0.01, multi_precision=mp))
    for g in grads[:3]:
        a(0, g, part)
    a.save_states(tmp_path / "bf16")
    doc = states.load(tmp_path / "bf16")
    expected = ("float32",) * 3 if mp else ("bfloat16",) * 2
    assert doc.keys[0].dtypes == expected
    if not mp:
        assert all(arr.dtype == np.uint16 for arr in doc.keys[0].arrays)
        assert doc.keys[0].names == ("mean", "var")
    b = get_updater(Adam(learning_rate=0.01, multi_precision=mp))
    b.load_states(tmp_path / "bf16")
    for g in grads[3:]:
        b(0, g, part)
    assert torch.equal(part, full)
    assert all(s.dtype == (torch.float32 if mp else torch.bfloat16) for s in b.states[0])


def test_bfloat16_bits_encoding_is_exact() -> None:
    torch = pytest.importorskip("torch")
    t = torch.tensor([1.0, -2.5, 3.140625, 1e-30, -0.0, float("inf")], dtype=torch.bfloat16)
    stored, dtype = states.encode_array(t)
    assert dtype == "bfloat16" and stored.dtype == np.uint16
    np.testing.assert_array_equal(stored, t.view(torch.int16).numpy().view(np.uint16))
    back = torch.from_numpy(states.decode_array(stored, dtype)).to(torch.bfloat16)
    assert torch.equal(back, t)


# --------------------------------------------------------------------------- file format
def test_file_is_plain_safetensors_without_pickle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pickle(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("pickle used")

    for name in ("dumps", "loads", "dump", "load"):
        monkeypatch.setattr(pickle, name, no_pickle)
    upd = get_updater(SGD(momentum=0.9))
    upd(3, np.ones(2), np.ones(2))
    fname = tmp_path / "s.safetensors"
    upd.save_states(fname, dump_optimizer=True)
    raw = fname.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    meta = header["__metadata__"]
    assert meta["format"] == "pskv.optimizer-states" and meta["version"] == "1"
    doc = json.loads(meta["states"])
    assert doc["keys"] == [
        {
            "key": 3,
            "key_type": "int",
            "count": 1,
            "states": [{"name": "momentum", "dtype": "float64", "tensor": "0/momentum"}],
        }
    ]
    assert doc["optimizer"]["name"] == "sgd"
    tensors = load_file(str(fname))
    np.testing.assert_array_equal(tensors["0/momentum"], np.ones(2))
    get_updater(SGD()).load_states(fname)
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []


def _write(path: Path, tensors: dict[str, np.ndarray], meta: dict[str, str] | None) -> Path:
    save_file(tensors, str(path), metadata=meta)
    return path


def _meta(body: Any, version: str = "1") -> dict[str, str]:
    return {"format": "pskv.optimizer-states", "version": version, "states": json.dumps(body)}


GOOD_KEY = {
    "key": 0,
    "key_type": "int",
    "count": 1,
    "states": [{"name": "momentum", "dtype": "float32", "tensor": "0/momentum"}],
}


@pytest.mark.parametrize(
    "tensors,meta,match",
    [
        ({"x": np.ones(2, np.float32)}, None, "not a pskv"),
        ({"x": np.ones(2, np.float32)}, {"format": "other"}, "not a pskv"),
        ({}, _meta({"num_update": 0, "keys": []}, version="2"), "version"),
        ({}, {"format": "pskv.optimizer-states", "version": "1", "states": "{"}, "JSON"),
        ({}, _meta({"keys": []}), "num_update"),
        ({}, _meta({"num_update": 1, "keys": [GOOD_KEY]}), "missing tensor"),
        ({"0/momentum": np.ones(2, np.float64)}, _meta({"num_update": 1, "keys": [GOOD_KEY]}), "stored as"),
        (
            {"0/momentum": np.ones(2, np.float32), "junk": np.ones(1, np.float32)},
            _meta({"num_update": 1, "keys": [GOOD_KEY]}),
            "junk",
        ),
        (
            {"0/momentum": np.ones(2, np.float32)},
            _meta({"num_update": 1, "keys": [{**GOOD_KEY, "key_type": "str"}]}),
            "key_type",
        ),
        ({"0/momentum": np.ones(2, np.float32)}, _meta({"num_update": 1, "keys": [GOOD_KEY, GOOD_KEY]}), "duplicate"),
        (
            {"0/momentum": np.ones(2, np.float32)},
            _meta({"num_update": 1, "keys": [GOOD_KEY], "optimizer": {"name": "zzz", "params": {}}}),
            "zzz",
        ),
    ],
)
def test_bad_files_rejected(
    tmp_path: Path, tensors: dict[str, np.ndarray], meta: dict[str, str] | None, match: str
) -> None:
    fname = _write(tmp_path / "bad", tensors, meta)
    upd = get_updater(SGD(momentum=0.9))
    upd(0, np.ones(2), np.ones(2))
    before = _snapshot(upd)
    with pytest.raises(OptimizerStateError, match=match):
        upd.load_states(fname)
    with pytest.raises(OptimizerStateError, match=match):
        upd.set_states(fname.read_bytes())
    assert upd.optimizer.get_update_count(0) == 1
    np.testing.assert_array_equal(upd.states[0][0], before[0][0])


@pytest.mark.parametrize("content", [b"", b"\x80\x04garbage", pickle.dumps({"a": 1}), b"\xff" * 64])
def test_foreign_bytes_rejected(tmp_path: Path, content: bytes) -> None:
    fname = tmp_path / "foreign"
    fname.write_bytes(content)
    with pytest.raises(OptimizerStateError):
        get_updater(SGD()).load_states(fname)


def test_truncated_file_rejected(tmp_path: Path) -> None:
    upd = get_updater(Adam())
    upd(0, np.ones(100), np.ones(100))
    data = upd.get_states()
    fname = tmp_path / "t"
    fname.write_bytes(data[:-50])
    with pytest.raises(OptimizerStateError):
        get_updater(Adam()).load_states(fname)
    with pytest.raises(OptimizerStateError):
        get_updater(Adam()).set_states(data[:-50])


def test_save_is_atomic_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fname = tmp_path / "s"
    upd = get_updater(SGD(momentum=0.9))
    upd(0, np.ones(2), np.ones(2))
    upd.save_states(fname)
    good = fname.read_bytes()

    def boom(src: Any, dst: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    upd(0, np.ones(2), np.ones(2))
    with pytest.raises(OSError, match="disk full"):
        upd.save_states(fname)
    assert fname.read_bytes() == good
    assert sorted(os.listdir(tmp_path)) == ["s"]


def test_updater_requires_optimizer_and_get_updater() -> None:
    with pytest.raises(InvalidArgumentError):
        Updater("sgd")  # type: ignore[arg-type]
    opt = create("sgd")
    assert isinstance(opt.get_updater(), Updater) and opt.get_updater().optimizer is opt
    assert isinstance(Optimizer.from_config(opt.to_config()), SGD)


def test_numpy_integer_keys_become_plain_ints(tmp_path: Path) -> None:
    opt = SGD(learning_rate=0.5, momentum=0.5)
    opt.set_lr_mult({np.int64(2): 0.5})
    upd = get_updater(opt)
    w = np.ones(2)
    upd(np.int32(2), np.ones(2), w)
    np.testing.assert_array_equal(w, 0.75)
    assert list(upd.states) == [2] and type(next(iter(upd.states))) is int
    assert list(opt.update_counts) == [2] and list(opt.lr_mult) == [2]
    upd.save_states(tmp_path / "s", dump_optimizer=True)
    assert states.load(tmp_path / "s").keys[0].key == 2
