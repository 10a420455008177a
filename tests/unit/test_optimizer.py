"""Optimizer rules, preprocessing, precision handling, registry and configs."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from pskv.errors import (
    DTypeMismatchError,
    InvalidArgumentError,
    KeyTypeError,
    ShapeMismatchError,
    UnsupportedValueError,
)
from pskv.optimizer import (
    NAG,
    SGD,
    AdaGrad,
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


# --------------------------------------------------------------------------- in-place rules
# The rules as plain (allocating) formulas: pskv's update rules before they were made
# allocation-free. A subclass that overrides _step runs the generic path (_preprocess,
# then _step), so these classes are also custom optimizers as users write them.
def _l2(grad: Any, weight: Any, wd: float) -> Any:
    return grad + wd * weight if wd != 0.0 else grad


def _plain_adam(weight: Any, g: Any, m: Any, v: Any, lr: float, t: int, opt: Any, correct_bias: bool) -> None:
    from pskv.optimizer import _math

    m *= opt.beta1
    m += (1.0 - opt.beta1) * g
    v *= opt.beta2
    v += (1.0 - opt.beta2) * (g * g)
    if correct_bias:
        step_size = lr / (1.0 - opt.beta1**t)
        denom = _math.sqrt(v) / (1.0 - opt.beta2**t) ** 0.5 + opt.epsilon
    else:
        step_size = lr
        denom = _math.sqrt(v) + opt.epsilon
    weight -= step_size * (m / denom)


class PlainSGD(SGD):
    def _step(self, weight: Any, grad: Any, state: Any, lr: float, wd: float, t: int) -> None:
        g = _l2(grad, weight, wd)
        if state:
            buf = state[0]
            buf *= self.momentum
            buf += g
            g = buf
        weight -= lr * g


class PlainNAG(NAG):
    def _step(self, weight: Any, grad: Any, state: Any, lr: float, wd: float, t: int) -> None:
        g = _l2(grad, weight, wd)
        if state:
            buf = state[0]
            buf *= self.momentum
            buf += g
            g = g + self.momentum * buf
        weight -= lr * g


class PlainAdam(Adam):
    def _step(self, weight: Any, grad: Any, state: Any, lr: float, wd: float, t: int) -> None:
        _plain_adam(weight, _l2(grad, weight, wd), state[0], state[1], lr, t, self, True)


class PlainAdamW(AdamW):
    def _step(self, weight: Any, grad: Any, state: Any, lr: float, wd: float, t: int) -> None:
        if wd != 0.0:
            weight *= 1.0 - lr * wd
        _plain_adam(weight, grad, state[0], state[1], lr, t, self, self.correct_bias)


class PlainAdaGrad(AdaGrad):
    def _step(self, weight: Any, grad: Any, state: Any, lr: float, wd: float, t: int) -> None:
        from pskv.optimizer import _math

        g = _l2(grad, weight, wd)
        history = state[0]
        history += g * g
        weight -= lr * (g / (_math.sqrt(history) + self.eps))


class PlainRMSProp(RMSProp):
    def _step(self, weight: Any, grad: Any, state: Any, lr: float, wd: float, t: int) -> None:
        from pskv.optimizer import _math

        g = _l2(grad, weight, wd)
        var = state[0]
        var *= self.rho
        var += (1.0 - self.rho) * (g * g)
        if self.centered:
            mean = state[1]
            mean *= self.rho
            mean += (1.0 - self.rho) * g
            denom = _math.sqrt(var - mean * mean) + self.epsilon
        else:
            denom = _math.sqrt(var) + self.epsilon
        if self.momentum > 0.0:
            mom = state[-1]
            mom *= self.momentum
            mom += g / denom
            weight -= lr * mom
        else:
            weight -= lr * (g / denom)
        if self.clip_weights is not None:
            _math.assign(weight, _math.clip(weight, -self.clip_weights, self.clip_weights))


class PlainFtrl(Ftrl):
    def _step(self, weight: Any, grad: Any, state: Any, lr: float, wd: float, t: int) -> None:
        from pskv.optimizer import _math

        z, n = state
        g2 = grad * grad
        z += grad - (_math.sqrt(n + g2) - _math.sqrt(n)) * weight / lr
        n += g2
        new = (_math.sign(z) * self.lamda1 - z) / ((self.beta + _math.sqrt(n)) / lr + wd)
        _math.assign(weight, _math.where(abs(z) > self.lamda1, new, 0.0))


_COMMON = {"rescale_grad": 0.5, "wd": 0.01}
PLAIN_CASES: list[tuple[str, type, type, dict[str, Any]]] = [
    ("sgd", SGD, PlainSGD, {"learning_rate": 0.1}),
    ("sgd-mom-clip", SGD, PlainSGD, {"learning_rate": 0.1, "momentum": 0.9, "clip_gradient": 0.7}),
    ("sgd-mom-nowd", SGD, PlainSGD, {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.0, "rescale_grad": 1.0}),
    ("nag", NAG, PlainNAG, {"learning_rate": 0.1, "momentum": 0.9}),
    ("nag-nomom", NAG, PlainNAG, {"learning_rate": 0.1, "clip_gradient": 0.5}),
    ("adam", Adam, PlainAdam, {"learning_rate": 0.01}),
    ("adam-clip-nowd", Adam, PlainAdam, {"learning_rate": 0.01, "wd": 0.0, "clip_gradient": 0.3}),
    ("adamw", AdamW, PlainAdamW, {"learning_rate": 0.01, "wd": 0.1}),
    ("adamw-nobias", AdamW, PlainAdamW, {"learning_rate": 0.01, "correct_bias": False, "clip_gradient": 1.0}),
    ("adagrad", AdaGrad, PlainAdaGrad, {"learning_rate": 0.1}),
    ("adagrad-nowd", AdaGrad, PlainAdaGrad, {"learning_rate": 0.1, "wd": 0.0, "rescale_grad": 1.0}),
    ("rmsprop", RMSProp, PlainRMSProp, {"learning_rate": 0.01}),
    ("rmsprop-mom-clipw", RMSProp, PlainRMSProp, {"learning_rate": 0.05, "momentum": 0.5, "clip_weights": 0.9}),
    ("rmsprop-centered", RMSProp, PlainRMSProp, {"learning_rate": 0.01, "centered": True, "clip_gradient": 0.4}),
    ("rmsprop-centered-nomom", RMSProp, PlainRMSProp, {"learning_rate": 0.01, "centered": True, "momentum": 0.0}),
    ("ftrl", Ftrl, PlainFtrl, {"learning_rate": 0.2, "lamda1": 0.3, "beta": 0.5}),
    ("ftrl-clip", Ftrl, PlainFtrl, {"learning_rate": 0.2, "lamda1": 0.1, "clip_gradient": 0.8, "wd": 0.0}),
]


def _plain_pair(case: tuple[str, type, type, dict[str, Any]], **extra: Any) -> tuple[Optimizer, Optimizer]:
    _, fast_cls, plain_cls, kwargs = case
    kw = {**_COMMON, **kwargs, **extra}
    fast, plain = fast_cls(**kw), plain_cls(**kw)
    assert type(fast)._fast_rules and not type(plain)._fast_rules
    return fast, plain


def _np_data(shape: tuple[int, ...], dtype: Any, steps: int, seed: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    w0 = rng.standard_normal(shape).astype(dtype)
    return w0, [rng.standard_normal(shape).astype(dtype) for _ in range(steps)]


@pytest.mark.parametrize("blocks", [False, True], ids=["whole", "blocks"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "float16-mp"])
@pytest.mark.parametrize("case", PLAIN_CASES, ids=[c[0] for c in PLAIN_CASES])
def test_numpy_rules_equal_plain_formulas_bit_for_bit(
    case: tuple, dtype: str, blocks: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-place NumPy rules do the plain formulas' operations in the same order: same bits."""
    from pskv.optimizer import base

    if blocks:
        monkeypatch.setattr(base, "_BLOCK_BYTES", 512)  # 64..256 elements a block, a partial last one
    mp = dtype.endswith("-mp")
    fast, plain = _plain_pair(case, multi_precision=mp)
    w0, grads = _np_data((37, 29), np.dtype(dtype.removesuffix("-mp")), 4)
    results = []
    for opt in (fast, plain):
        upd, w = get_updater(opt), w0.copy()
        with np.errstate(all="ignore"):  # float16 overflow / 0 / 0 are part of the comparison
            for g in grads:
                before = g.copy()
                upd("k", g, w)
                np.testing.assert_array_equal(g, before)  # the gradient is never written
        results.append((w, upd.states["k"] or ()))
    (w_fast, st_fast), (w_plain, st_plain) = results
    assert w_fast.dtype == w0.dtype
    np.testing.assert_array_equal(w_fast, w_plain)
    assert len(st_fast) == len(st_plain)
    for a, b in zip(st_fast, st_plain, strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def test_numpy_blocked_update_of_a_large_key_and_non_contiguous_weights() -> None:
    fast, plain = _plain_pair(PLAIN_CASES[5])  # adam
    w0, grads = _np_data((700, 800), np.dtype(np.float32), 2, seed=5)  # 560,000 elements: several blocks
    out = []
    for opt in (fast, plain):
        upd = get_updater(opt)
        big, strided = w0.copy(), w0.copy()
        for g in grads:
            upd(["big", "strided"], [g, g[:, ::2]], [big, strided[:, ::2]])
        out.append((big, strided))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    np.testing.assert_array_equal(out[0][1], out[1][1])
    np.testing.assert_array_equal(out[0][1][:, 1::2], w0[:, 1::2])  # untouched columns


def _torch_tolerance(dtype: str) -> dict[str, float]:
    return {
        "float64": {"rtol": 1e-12, "atol": 1e-14},
        "float32": {"rtol": 2e-5, "atol": 1e-6},
        "float16": {"rtol": 1e-2, "atol": 2e-3},
        "bfloat16": {"rtol": 5e-2, "atol": 2e-2},
    }[dtype]


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16-mp", "bfloat16-mp", "bfloat16"])
@pytest.mark.parametrize("case", PLAIN_CASES, ids=[c[0] for c in PLAIN_CASES])
def test_torch_rules_match_plain_formulas(case: tuple, dtype: str) -> None:
    """Fused torch rules over a list of keys (foreach) agree with the plain formulas key by key."""
    torch = pytest.importorskip("torch")
    mp = dtype.endswith("-mp")
    name = dtype.removesuffix("-mp")
    tdt = getattr(torch, name)
    fast, plain = _plain_pair(case, multi_precision=mp)
    shapes = [(7, 5), (3,), (40,), (2, 2, 2)]
    rng = np.random.default_rng(1)
    w0 = [torch.from_numpy(rng.standard_normal(s)).to(tdt) for s in shapes]
    grads = [[torch.from_numpy(rng.standard_normal(s)).to(tdt) for s in shapes] for _ in range(4)]
    keys = ["a", 1, "b", 2]
    fast_w = [torch.nn.Parameter(w.clone()) for w in w0]  # leaves that require grad
    plain_w = [w.clone() for w in w0]
    fast_upd, plain_upd = get_updater(fast), get_updater(plain)
    for gs in grads:
        copies = [g.clone() for g in gs]
        fast_upd(keys, gs, fast_w)  # one list call: torch._foreach_* over the 4 tensors
        for k, g, w in zip(keys, gs, plain_w, strict=True):
            plain_upd(k, g, w)
        assert all(torch.equal(g, c) for g, c in zip(gs, copies, strict=True))  # gradients never written
    tol = _torch_tolerance("float32" if mp else name)
    for k, fw, pw in zip(keys, fast_w, plain_w, strict=True):
        assert fw.dtype == tdt and fw.requires_grad
        np.testing.assert_allclose(fw.detach().double().numpy(), pw.double().numpy(), **tol)
        for a, b in zip(fast_upd.states[k] or (), plain_upd.states[k] or (), strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_allclose(a.double().numpy(), b.double().numpy(), **tol)


def test_torch_list_call_groups_by_dtype_rate_and_count() -> None:
    """Keys with different dtypes, lr_mult, master copies and counts in one call each get their own update."""
    torch = pytest.importorskip("torch")
    kw = {"learning_rate": 0.01, "wd": 0.01, "rescale_grad": 0.5}
    fast, plain = Adam(**kw, multi_precision=True), PlainAdam(**kw, multi_precision=True)
    for opt in (fast, plain):
        opt.set_lr_mult({"slow": 0.1})
    rng = np.random.default_rng(2)
    dtypes = {"a": torch.float32, "slow": torch.float32, "d": torch.float64, "h": torch.float16, "old": torch.float32}
    w0 = {k: torch.from_numpy(rng.standard_normal(6)).to(dt) for k, dt in dtypes.items()}
    fw = {k: w.clone() for k, w in w0.items()}
    pw = {k: w.clone() for k, w in w0.items()}
    fu, pu = get_updater(fast), get_updater(plain)
    for u, ws in ((fu, fw), (pu, pw)):
        u("old", torch.ones(6), ws["old"])  # "old" is one update ahead: another bias correction
    for _ in range(3):
        gs = {k: torch.from_numpy(rng.standard_normal(6)).to(dt) for k, dt in dtypes.items()}
        fu(list(gs), list(gs.values()), [fw[k] for k in gs])
        for k, g in gs.items():
            pu(k, g, pw[k])
    for k in dtypes:
        np.testing.assert_allclose(fw[k].double().numpy(), pw[k].double().numpy(), rtol=1e-5, atol=1e-6)
    assert fast.get_update_count("old") == 4 and fast.get_update_count("a") == 3


@pytest.mark.parametrize("name", ["sgd", "nag", "adam", "adamw", "adagrad", "rmsprop", "ftrl"])
def test_numpy_update_allocates_no_full_size_array(name: str) -> None:
    import tracemalloc

    kwargs = {"learning_rate": 0.01, "wd": 0.01, "rescale_grad": 0.5, "clip_gradient": 1.0}
    if name in ("sgd", "nag"):
        kwargs["momentum"] = 0.9
    upd = get_updater(create(name, **kwargs))
    n = 300_000  # 2.4 MB in float64: blocked
    rng = np.random.default_rng(0)
    w, g = rng.standard_normal(n), rng.standard_normal(n)
    small_w, small_g = rng.standard_normal(1000), rng.standard_normal(1000)
    upd([0, 1], [g, small_g], [w, small_w])  # states and scratch buffers come into being
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(3):
            upd([0, 1], [g, small_g], [w, small_w])
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024, f"{name}: {peak} bytes allocated at peak by an update of {w.nbytes}-byte weights"


def test_scratch_buffers_are_not_state_and_not_saved(tmp_path: Any) -> None:
    torch = pytest.importorskip("torch")
    upd = get_updater(Adam(learning_rate=0.01, wd=0.01, clip_gradient=1.0))
    w, tw = np.ones(100), torch.ones(10)
    for _ in range(2):
        upd(["n", "t"], [np.full(100, 0.5), torch.full((10,), 0.5)], [w, tw])
    assert [len(upd.states[k] or ()) for k in ("n", "t")] == [2, 2]
    upd.save_states(tmp_path / "s.safetensors", dump_optimizer=True)
    from safetensors.numpy import load_file

    assert sorted(load_file(tmp_path / "s.safetensors")) == ["0/mean", "0/var", "1/mean", "1/var"]
    resumed = get_updater(SGD())
    resumed.load_states(tmp_path / "s.safetensors")
    w2, tw2 = w.copy(), tw.clone()
    for u, a, b in ((upd, w, tw), (resumed, w2, tw2)):
        u(["n", "t"], [np.full(100, 0.25), torch.full((10,), 0.25)], [a, b])
    np.testing.assert_array_equal(w, w2)
    assert torch.equal(tw, tw2)


def test_scratch_is_per_thread() -> None:
    """Threads sharing one optimizer (each with its own keys) do not share scratch buffers."""
    import threading

    kwargs = {"learning_rate": 0.01, "wd": 0.01, "rescale_grad": 0.5}
    opt = Adam(**kwargs)
    w0, grads = _np_data((200_000,), np.dtype(np.float32), 20, seed=7)
    weights = {k: w0.copy() for k in ("x", "y")}
    barrier = threading.Barrier(2)

    def work(key: str) -> None:
        upd = get_updater(opt)  # own states, the optimizer (and its workspace) shared
        barrier.wait()
        for g in grads:
            upd(key, g * (2.0 if key == "y" else 1.0), weights[key])

    threads = [threading.Thread(target=work, args=(k,)) for k in weights]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for key, scale in (("x", 1.0), ("y", 2.0)):
        ref, alone = w0.copy(), get_updater(Adam(**kwargs))
        for g in grads:
            alone(key, g * scale, ref)
        np.testing.assert_array_equal(weights[key], ref)


def test_custom_rule_overriding_step_still_works() -> None:
    class Halve(SGD):
        def _step(self, weight: Any, grad: Any, state: Any, lr: float, wd: float, t: int) -> None:
            weight *= 0.5

    assert not Halve._fast_rules and SGD._fast_rules
    w = np.ones(3)
    get_updater(Halve(momentum=0.9))(0, np.ones(3), w)
    np.testing.assert_array_equal(w, 0.5)
    with pytest.raises(NotImplementedError):
        Optimizer()._step(np.ones(1), np.ones(1), (), 0.1, 0.0, 1)


@pytest.mark.parametrize("mp", [False, True])
@pytest.mark.parametrize("name", ["sgd", "nag", "adam", "adamw", "adagrad", "rmsprop", "ftrl"])
def test_torch_update_runs_only_in_place_ops(name: str, mp: bool) -> None:
    """After the first update, every aten op of an update writes into an existing tensor."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: set[str] = set()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.ops.add(str(func))
            return func(*args, **(kwargs or {}))

    kwargs: dict[str, Any] = {"learning_rate": 0.01, "wd": 0.01, "rescale_grad": 0.5, "multi_precision": mp}
    if name in ("sgd", "nag"):
        kwargs["momentum"] = 0.9
    dt = torch.float16 if mp else torch.float32
    ws = [torch.randn(1000).to(dt), torch.randn(5, 10).to(dt)]
    gs = [torch.randn(1000).to(dt), torch.randn(5, 10).to(dt)]
    for clip in (None, 1.0):
        upd = get_updater(create(name, clip_gradient=clip, **kwargs))
        for _ in range(2):  # states and scratch views come into being
            upd([0, 1], gs, ws)
            upd(0, gs[0], ws[0])
        record = Record()
        with record:
            upd([0, 1], gs, ws)
            upd(0, gs[0], ws[0])
        allocating = sorted(op for op in record.ops if not (op.split(".")[1].endswith("_") or op.endswith("out")))
        assert allocating == [], f"{name} (clip={clip}, mp={mp}) ran allocating ops {allocating}"


def test_updater_rechecks_a_key_whose_arrays_or_layout_change() -> None:
    """The updater skips re-validating a key only while its arrays look as last time."""
    torch = pytest.importorskip("torch")
    opt = SGD(learning_rate=0.5)
    upd = get_updater(opt)
    w = np.ones(3)
    upd(0, np.ones(3), w)
    upd(0, np.ones(3), w)  # the cached path
    np.testing.assert_array_equal(w, 0.0)
    opt.momentum = 0.5  # the layout changes under the updater: a momentum buffer appears
    upd(0, np.ones(3), w)
    assert len(upd.states[0] or ()) == 1
    np.testing.assert_array_equal(w, -0.5)
    w32 = np.ones(3, dtype=np.float32)  # dtype change: the state is converted
    upd(0, np.ones(3, dtype=np.float32), w32)
    assert upd.states[0] is not None and upd.states[0][0].dtype == np.float32
    np.testing.assert_array_equal(w32, 1.0 - 0.5 * (0.5 * 1.0 + 1.0))
    tw = torch.ones(3, dtype=torch.float32)  # backend change
    upd(0, torch.ones(3, dtype=torch.float32), tw)
    upd(0, np.ones(3, dtype=np.float32), tw)  # a NumPy gradient for a tensor weight: converted
    assert isinstance(upd.states[0][0], torch.Tensor)
    with pytest.raises(DTypeMismatchError):
        upd(0, torch.ones(3, dtype=torch.float64), tw)
    with pytest.raises(ShapeMismatchError):
        upd(0, torch.ones(4, dtype=torch.float32), torch.ones(4, dtype=torch.float32))


def test_optimizer_copies_get_their_own_scratch() -> None:
    import copy
    import pickle

    opt = Adam(learning_rate=0.1, rescale_grad=0.5)
    w = np.ones(4)
    get_updater(opt)(0, np.ones(4), w)
    for twin in (copy.deepcopy(opt), pickle.loads(pickle.dumps(opt)), copy.copy(opt)):
        assert twin.to_config() == opt.to_config() and twin.get_update_count(0) == 1
        w2 = np.ones(4)
        get_updater(twin)(1, np.ones(4), w2)
        np.testing.assert_array_equal(w2, w)  # count 1 for the new key: the same first step
