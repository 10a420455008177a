"""Optimizer rules, preprocessing, precision handling, registry and configs."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from pskv.errors import InvalidArgumentError, KeyTypeError, UnsupportedValueError
from pskv.optimizer import (
    SGD,
    Adam,
    AdamW,
    FactorScheduler,
    Ftrl,
    Optimizer,
    RMSProp,
    create,
    get_updater,
    registered_names,
)

STEPS = 5
SHAPE = (4, 5)


def _data(seed: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    w0 = rng.standard_normal(SHAPE)
    grads = [rng.standard_normal(SHAPE) for _ in range(STEPS)]
    return w0, grads


# --------------------------------------------------------------------------- vs torch.optim
TORCH_CASES: list[tuple[str, str, dict[str, Any], Callable[[Any, Any], Any]]] = [
    ("sgd-plain", "sgd", {"learning_rate": 0.1}, lambda t, p: t.optim.SGD(p, lr=0.1)),
    (
        "sgd-momentum-wd",
        "sgd",
        {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01},
        lambda t, p: t.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
    ),
    (
        "nag",
        "nag",
        {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01},
        lambda t, p: t.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True),
    ),
    (
        "adam",
        "adam",
        {"learning_rate": 0.01, "wd": 0.01},
        lambda t, p: t.optim.Adam(p, lr=0.01, weight_decay=0.01, eps=1e-8),
    ),
    (
        "adamw",
        "adamw",
        {"learning_rate": 0.01, "wd": 0.1, "epsilon": 1e-8, "beta1": 0.8, "beta2": 0.99},
        lambda t, p: t.optim.AdamW(p, lr=0.01, weight_decay=0.1, eps=1e-8, betas=(0.8, 0.99)),
    ),
    (
        "adagrad",
        "adagrad",
        {"learning_rate": 0.1, "eps": 1e-10, "wd": 0.01},
        lambda t, p: t.optim.Adagrad(p, lr=0.1, eps=1e-10, weight_decay=0.01),
    ),
    (
        "rmsprop-plain",
        "rmsprop",
        {"learning_rate": 0.01, "rho": 0.9},
        lambda t, p: t.optim.RMSprop(p, lr=0.01, alpha=0.9, eps=1e-8),
    ),
    (
        "rmsprop-momentum",
        "rmsprop",
        {"learning_rate": 0.01, "rho": 0.95, "momentum": 0.5, "wd": 0.01},
        lambda t, p: t.optim.RMSprop(p, lr=0.01, alpha=0.95, eps=1e-8, momentum=0.5, weight_decay=0.01),
    ),
    (
        "rmsprop-centered",
        "rmsprop",
        {"learning_rate": 0.01, "rho": 0.9, "centered": True, "epsilon": 1e-6},
        lambda t, p: t.optim.RMSprop(p, lr=0.01, alpha=0.9, eps=1e-6, momentum=0.9, centered=True),
    ),
    (
        "rmsprop-centered-nomom",
        "rmsprop",
        {"learning_rate": 0.01, "centered": True, "momentum": 0.0},
        lambda t, p: t.optim.RMSprop(p, lr=0.01, alpha=0.9, eps=1e-8, centered=True),
    ),
]


def _torch_reference(torch: Any, make: Callable[[Any, Any], Any], w0: np.ndarray, grads: list[np.ndarray]) -> list:
    p = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    opt = make(torch, [p])
    out = []
    for g in grads:
        p.grad = torch.from_numpy(g.copy())
        opt.step()
        out.append(p.detach().numpy().copy())
    return out


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("case", TORCH_CASES, ids=[c[0] for c in TORCH_CASES])
def test_matches_torch_optim(case: tuple, backend: str) -> None:
    torch = pytest.importorskip("torch")
    _, name, kwargs, make = case
    w0, grads = _data()
    expected = _torch_reference(torch, make, w0, grads)
    updater = get_updater(create(name, **kwargs))
    if backend == "numpy":
        weight = w0.copy()
        for g, exp in zip(grads, expected, strict=True):
            updater(7, g.copy(), weight)
            np.testing.assert_allclose(weight, exp, rtol=1e-10, atol=1e-13)
    else:
        weight = torch.nn.Parameter(torch.from_numpy(w0.copy()))  # a leaf that requires grad
        for g, exp in zip(grads, expected, strict=True):
            updater("w", torch.from_numpy(g.copy()), weight)
            assert isinstance(weight, torch.Tensor) and weight.dtype == torch.float64
            np.testing.assert_allclose(weight.detach().numpy(), exp, rtol=1e-10, atol=1e-13)
        assert all(isinstance(s, torch.Tensor) for s in updater.states["w"] or ())


def _ftrl_reference(
    w0: np.ndarray,
    grads: list[np.ndarray],
    lr: float,
    lamda1: float,
    beta: float,
    wd: float,
    rescale: float,
    clip: float | None,
) -> np.ndarray:
    """Element-by-element transcription of MXNet's FTRL update."""
    w = w0.ravel().tolist()
    z = [0.0] * len(w)
    n = [0.0] * len(w)
    for grad in grads:
        for i, gi in enumerate(grad.ravel().tolist()):
            g = gi * rescale
            if clip is not None:
                g = min(max(g, -clip), clip)
            z[i] += g - ((n[i] + g * g) ** 0.5 - n[i] ** 0.5) * w[i] / lr
            n[i] += g * g
            if abs(z[i]) > lamda1:
                sgn = 1.0 if z[i] > 0 else -1.0
                w[i] = (sgn * lamda1 - z[i]) / ((beta + n[i] ** 0.5) / lr + wd)
            else:
                w[i] = 0.0
    return np.array(w).reshape(w0.shape)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_ftrl_matches_reference(backend: str) -> None:
    w0, grads = _data(3)
    kw = {"learning_rate": 0.2, "lamda1": 0.3, "beta": 0.5, "wd": 0.05, "rescale_grad": 1.5, "clip_gradient": 2.0}
    expected = _ftrl_reference(w0, grads, 0.2, 0.3, 0.5, 0.05, 1.5, 2.0)
    updater = get_updater(Ftrl(**kw))
    if backend == "numpy":
        weight = w0.copy()
        for g in grads:
            updater(0, g, weight)
        result = weight
    else:
        torch = pytest.importorskip("torch")
        t = torch.from_numpy(w0.copy())
        for g in grads:
            updater(0, torch.from_numpy(g), t)
        result = t.numpy()
    assert (result == 0).any() and (result != 0).any()  # both branches exercised
    np.testing.assert_allclose(result, expected, rtol=1e-10, atol=1e-13)


def test_adamw_without_bias_correction() -> None:
    w = np.array([1.0, -2.0])
    g = np.array([0.5, 0.25])
    get_updater(AdamW(learning_rate=0.1, wd=0.2, correct_bias=False, epsilon=1e-6))(0, g, w)
    m, v = 0.1 * g, 0.001 * g * g
    expected = np.array([1.0, -2.0]) * (1 - 0.1 * 0.2) - 0.1 * m / (np.sqrt(v) + 1e-6)
    np.testing.assert_allclose(w, expected, rtol=1e-14)


def test_rmsprop_clip_weights() -> None:
    w = np.array([0.99, -0.99, 0.0])
    get_updater(RMSProp(learning_rate=0.5, clip_weights=1.0))(0, np.array([-1.0, 1.0, 1.0]), w)
    np.testing.assert_array_equal(w[:2], [1.0, -1.0])
    assert -1.0 <= w[2] < 0.0


# --------------------------------------------------------------------------- preprocessing
def test_rescale_then_clip_then_wd() -> None:
    w = np.ones(3)
    grad = np.array([1.0, -3.0, 0.2])
    opt = SGD(learning_rate=0.5, wd=0.1, rescale_grad=2.0, clip_gradient=1.0)
    get_updater(opt)(0, grad, w)
    # g = clip(2 * grad, -1, 1) = [1, -1, 0.4]; w -= 0.5 * (g + 0.1 * w)
    np.testing.assert_allclose(w, [0.45, 1.45, 0.75], rtol=1e-15)


def test_lr_mult_and_wd_mult_per_key() -> None:
    opt = SGD(learning_rate=0.1, wd=0.5)
    opt.set_lr_mult({"a": 0.5, 2: 0.0})
    opt.set_wd_mult({3: 0.0})
    upd = get_updater(opt)
    ws = {k: np.ones(2) for k in ("a", 2, 3, "other")}
    for k, w in ws.items():
        upd(k, np.ones(2), w)
    np.testing.assert_allclose(ws["a"], 1 - 0.05 * (1 + 0.5))
    np.testing.assert_allclose(ws[2], 1.0)
    np.testing.assert_allclose(ws[3], 1 - 0.1 * 1.0)
    np.testing.assert_allclose(ws["other"], 1 - 0.1 * 1.5)


def test_per_key_counts_and_scheduler() -> None:
    sched = FactorScheduler(step=2, factor=0.5, base_lr=123.0)
    opt = SGD(learning_rate=1.0, lr_scheduler=sched)
    assert sched.base_lr == 1.0  # the optimizer's rate wins (MXNet)
    upd = get_updater(opt)
    w = np.zeros(1)
    lrs = []
    for _ in range(4):
        before = w.copy()
        upd(0, np.ones(1), w)
        lrs.append(float(before[0] - w[0]))
    assert lrs == [1.0, 1.0, 0.5, 0.5]
    upd(1, np.ones(1), np.zeros(1))
    assert opt.get_update_count(0) == 4 and opt.get_update_count(1) == 1 and opt.num_update == 4
    assert opt.learning_rate == 0.5
    with pytest.raises(InvalidArgumentError, match="lr_scheduler"):
        opt.set_learning_rate(0.1)


def test_scheduler_base_lr_used_when_no_learning_rate() -> None:
    opt = Adam(lr_scheduler=FactorScheduler(step=10, base_lr=0.3))
    assert opt.learning_rate == 0.3
    plain = SGD()
    plain.set_learning_rate(0.25)
    assert plain.learning_rate == 0.25


def test_adam_bias_correction_uses_per_key_count() -> None:
    opt = Adam(learning_rate=0.1)
    upd = get_updater(opt)
    a, b = np.zeros(1), np.zeros(1)
    for _ in range(3):
        upd("a", np.ones(1), a)
    upd("b", np.ones(1), b)
    # first Adam step of a key moves by lr * g / (|g| + eps) whatever the other keys did
    np.testing.assert_allclose(b, [-0.1 / (1 + 1e-8)], rtol=1e-12)


# --------------------------------------------------------------------------- precision
def _run(name: str, weight: Any, grads: list, kwargs: dict[str, Any], key: Any = 0) -> None:
    upd = get_updater(create(name, **kwargs))
    for g in grads:
        upd(key, g, weight)


@pytest.mark.parametrize(
    "name,kwargs", [("sgd", {"learning_rate": 0.01, "momentum": 0.5}), ("adam", {"learning_rate": 1e-4})]
)
def test_multi_precision_numpy_float16(name: str, kwargs: dict[str, Any]) -> None:
    grads16 = [np.full(8, 0.01, dtype=np.float16) for _ in range(20)]
    mp = np.ones(8, dtype=np.float16)
    _run(name, mp, grads16, {**kwargs, "multi_precision": True})
    ref32 = np.ones(8, dtype=np.float32)
    _run(name, ref32, [g.astype(np.float32) for g in grads16], kwargs)
    naive = np.ones(8, dtype=np.float16)
    _run(name, naive, grads16, kwargs)
    assert mp.dtype == np.float16
    np.testing.assert_array_equal(mp, ref32.astype(np.float16))
    assert not np.array_equal(mp, naive)
    np.testing.assert_array_equal(naive, np.ones(8, dtype=np.float16))  # tiny steps vanish in fp16


def test_multi_precision_state_layout() -> None:
    opt = Adam(multi_precision=True)
    state = opt.create_state(0, np.ones(3, dtype=np.float16))
    assert state is not None and len(state) == 3
    assert all(s.dtype == np.float32 for s in state)
    np.testing.assert_array_equal(state[0], np.ones(3, dtype=np.float32))
    assert opt.create_state(0, np.ones(3, dtype=np.float32)) is not None
    assert len(opt.create_state(0, np.ones(3, dtype=np.float32)) or ()) == 2  # no master for fp32


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_multi_precision_torch(dtype: str) -> None:
    torch = pytest.importorskip("torch")
    tdt = getattr(torch, dtype)
    grads = [torch.full((6,), 0.01, dtype=tdt) for _ in range(20)]
    mp = torch.ones(6, dtype=tdt)
    _run("sgd", mp, grads, {"learning_rate": 0.01, "multi_precision": True})
    ref = torch.ones(6, dtype=torch.float32)
    _run("sgd", ref, [g.float() for g in grads], {"learning_rate": 0.01})
    naive = torch.ones(6, dtype=tdt)
    _run("sgd", naive, grads, {"learning_rate": 0.01})
    assert mp.dtype == tdt
    assert torch.equal(mp, ref.to(tdt))
    assert not torch.equal(mp, naive)


@pytest.mark.parametrize("mp", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["sgd", "nag", "adam", "adamw", "adagrad", "rmsprop", "ftrl"])
def test_low_precision_torch_weights_every_optimizer(name: str, dtype: str, mp: bool) -> None:
    torch = pytest.importorskip("torch")
    tdt = getattr(torch, dtype)
    w = torch.linspace(-1, 1, 10, dtype=tdt)
    before = w.clone()
    upd = get_updater(create(name, learning_rate=0.1, wd=0.01, multi_precision=mp))
    for _ in range(3):
        upd(0, torch.full((10,), 0.5, dtype=tdt), w)
    assert w.dtype == tdt and torch.isfinite(w.float()).all()
    assert not torch.equal(w, before)
    state_dtype = torch.float32 if mp else tdt
    assert all(s.dtype == state_dtype for s in upd.states[0] or ())


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_int_weights_rejected(dtype: Any) -> None:
    opt = SGD(momentum=0.9)
    w = np.ones(3, dtype=dtype)
    with pytest.raises(UnsupportedValueError, match=r"key 'k'.*int"):
        opt.create_state("k", w)
    with pytest.raises(UnsupportedValueError, match=r"key 5.*int"):
        opt.update(5, w, w, None)
    with pytest.raises(UnsupportedValueError, match=r"key 5.*int"):
        get_updater(opt)(5, w.copy(), w)
    np.testing.assert_array_equal(w, 1)


def test_update_rejects_wrong_state_arity() -> None:
    opt = Adam()
    w = np.ones(2)
    with pytest.raises(InvalidArgumentError, match="mean"):
        opt.update(0, w, w.copy(), None)
    assert opt.get_update_count(0) == 0


# --------------------------------------------------------------------------- registry / config
def test_registry_names_and_case_insensitive_create() -> None:
    assert {"sgd", "nag", "adam", "adamw", "adagrad", "rmsprop", "ftrl"} <= set(registered_names())
    assert isinstance(create("SGD", momentum=0.9), SGD)
    assert isinstance(create("AdamW"), AdamW)
    assert type(Optimizer.create_optimizer("nag")).__name__ == "NAG"


def test_unknown_optimizer_lists_known_names() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        create("lamb")
    for name in ("sgd", "adam", "ftrl"):
        assert name in str(info.value)
    with pytest.raises(InvalidArgumentError, match="adagrad"):
        Optimizer.from_config({"name": "nope", "params": {}})


def _config_cases() -> list[Optimizer]:
    sched = {
        "name": "cosine",
        "params": {
            "max_update": 100,
            "final_lr": 0.001,
            "warmup_steps": 5,
            "base_lr": 0.3,
            "warmup_begin_lr": 0.01,
            "warmup_mode": "constant",
        },
    }
    common = {"wd": 0.001, "rescale_grad": 0.25, "clip_gradient": 5.0, "multi_precision": True, "begin_num_update": 2}
    extra = {
        "sgd": {"momentum": 0.9},
        "nag": {"momentum": 0.8},
        "adam": {"beta1": 0.8, "beta2": 0.95, "epsilon": 1e-7},
        "adamw": {"correct_bias": False, "epsilon": 1e-5},
        "adagrad": {"eps": 1e-9},
        "rmsprop": {"centered": True, "momentum": 0.3, "rho": 0.8, "clip_weights": 3.0},
        "ftrl": {"lamda1": 0.2, "beta": 2.0},
    }
    out = []
    for name in registered_names():
        opt = create(name, learning_rate=0.3, **common, **extra.get(name, {}))
        opt.set_lr_mult({1: 0.5, "1": 2.0, "emb": 0.1})
        opt.set_wd_mult({0: 0.0})
        out.append(opt)
        out.append(create(name, lr_scheduler=sched))
        out.append(create(name))
    return out


@pytest.mark.parametrize("opt", _config_cases(), ids=repr)
def test_config_round_trip(opt: Optimizer) -> None:
    cfg = opt.to_config()
    text = json.dumps(cfg, allow_nan=False)
    back = Optimizer.from_config(json.loads(text))
    assert type(back) is type(opt)
    assert back.to_config() == cfg
    assert back.lr_mult == opt.lr_mult and back.wd_mult == opt.wd_mult
    assert {type(k) for k in back.lr_mult} == {type(k) for k in opt.lr_mult}
    assert back.learning_rate == opt.learning_rate
    if opt.lr_scheduler is not None:
        assert back.lr_scheduler is not None
        assert [back.lr_scheduler(n) for n in range(0, 120, 7)] == [opt.lr_scheduler(n) for n in range(0, 120, 7)]


def test_config_keeps_int_and_str_keys_apart() -> None:
    opt = SGD()
    opt.set_lr_mult({1: 0.5, "1": 2.0})
    back = Optimizer.from_config(json.loads(json.dumps(opt.to_config())))
    assert back.lr_mult == {1: 0.5, "1": 2.0}


@pytest.mark.parametrize(
    "config,match",
    [
        ({"name": "sgd"}, "'name' and 'params'"),
        ({"name": "sgd", "params": {"lr": 0.1}}, "lr"),
        ({"name": "sgd", "params": {"momentum": "x"}}, "momentum"),
        ({"name": "adam", "params": {"beta1": 1.0}}, "beta1"),
        ({"name": "sgd", "params": {"lr_mult": {"a": 1}}}, "lr_mult"),
        ({"name": "sgd", "params": {"lr_scheduler": {"name": "zigzag", "params": {}}}}, "zigzag"),
        ("sgd", "'name' and 'params'"),
    ],
)
def test_from_config_rejects_bad_input(config: Any, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        Optimizer.from_config(config)


def test_from_config_on_subclass_checks_kind() -> None:
    with pytest.raises(InvalidArgumentError, match="not a"):
        Adam.from_config(SGD().to_config())
    assert isinstance(SGD.from_config(create("nag").to_config()), SGD)


@pytest.mark.parametrize(
    "name,kwargs,param",
    [
        ("sgd", {"learning_rate": -0.1}, "learning_rate"),
        ("sgd", {"learning_rate": float("nan")}, "learning_rate"),
        ("sgd", {"momentum": 1.0}, "momentum"),
        ("sgd", {"momentum": -0.1}, "momentum"),
        ("sgd", {"wd": -1.0}, "wd"),
        ("sgd", {"rescale_grad": 0.0}, "rescale_grad"),
        ("sgd", {"clip_gradient": 0.0}, "clip_gradient"),
        ("sgd", {"multi_precision": 1}, "multi_precision"),
        ("sgd", {"begin_num_update": -1}, "begin_num_update"),
        ("sgd", {"lr_scheduler": "cosine"}, "lr_scheduler"),
        ("adam", {"beta1": 1.0}, "beta1"),
        ("adam", {"beta2": -0.5}, "beta2"),
        ("adam", {"epsilon": 0.0}, "epsilon"),
        ("adamw", {"correct_bias": "yes"}, "correct_bias"),
        ("adagrad", {"eps": -1e-7}, "eps"),
        ("adagrad", {"eps": 1e-7, "epsilon": 1e-7}, "epsilon"),
        ("rmsprop", {"rho": 1.5}, "rho"),
        ("rmsprop", {"momentum": 1.0}, "momentum"),
        ("rmsprop", {"rho": 0.9, "gamma1": 0.9}, "gamma1"),
        ("rmsprop", {"clip_weights": -1.0}, "clip_weights"),
        ("ftrl", {"learning_rate": 0.0}, "learning_rate"),
        ("ftrl", {"lamda1": -1.0}, "lamda1"),
        ("sgd", {"nesterov": True}, "nesterov"),
    ],
)
def test_bad_hyperparameters(name: str, kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidArgumentError, match=param):
        create(name, **kwargs)


def test_bad_multipliers() -> None:
    opt = SGD()
    with pytest.raises(InvalidArgumentError, match="lr_mult"):
        opt.set_lr_mult({"a": -1.0})
    with pytest.raises(KeyTypeError):
        opt.set_wd_mult({1.5: 1.0})
    with pytest.raises(InvalidArgumentError):
        opt.set_learning_rate(-1.0)


def test_mxnet_aliases() -> None:
    r = RMSProp(gamma1=0.8, gamma2=0.5)
    assert (r.rho, r.momentum) == (0.8, 0.5)
    assert RMSProp().momentum == 0.0 and RMSProp(centered=True).momentum == 0.9
    assert create("adagrad", epsilon=1e-6).eps == 1e-6  # type: ignore[attr-defined]
    assert "gamma1" not in r.to_config()["params"]


# --------------------------------------------------------------------------- CUDA
@pytest.mark.cuda
@pytest.mark.parametrize("case", TORCH_CASES[1:5], ids=[c[0] for c in TORCH_CASES[1:5]])
def test_cuda_weights_stay_on_device(case: tuple, tmp_path: Any) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    _, name, kwargs, make = case
    w0, grads = _data()
    expected = _torch_reference(torch, make, w0, grads)
    upd = get_updater(create(name, **kwargs))
    weight = torch.from_numpy(w0.copy()).cuda()
    for g in grads[:3]:
        upd(0, torch.from_numpy(g).cuda(), weight)
    assert weight.is_cuda and all(s.is_cuda for s in upd.states[0] or ())
    upd.save_states(tmp_path / "cuda.safetensors", dump_optimizer=True)
    resumed = get_updater(create(name))
    resumed.load_states(tmp_path / "cuda.safetensors")
    for g in grads[3:]:
        resumed(0, torch.from_numpy(g), weight)  # CPU grad, CUDA weight
    assert weight.is_cuda and all(s.is_cuda for s in resumed.states[0] or ())
    np.testing.assert_allclose(weight.cpu().numpy(), expected[-1], rtol=1e-9, atol=1e-12)


@pytest.mark.cuda
def test_cuda_multi_precision_float16() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    grads = [torch.full((6,), 0.01, dtype=torch.float16, device="cuda") for _ in range(20)]
    mp = torch.ones(6, dtype=torch.float16, device="cuda")
    _run("sgd", mp, grads, {"learning_rate": 0.01, "multi_precision": True})
    ref = torch.ones(6, dtype=torch.float32, device="cuda")
    _run("sgd", ref, [g.float() for g in grads], {"learning_rate": 0.01})
    assert mp.is_cuda and torch.equal(mp, ref.half())
