"""Learning-rate schedulers: formulas, warmup, validation and config round trip."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from pskv.errors import InvalidArgumentError
from pskv.optimizer import (
    SGD,
    CosineScheduler,
    FactorScheduler,
    LRScheduler,
    MultiFactorScheduler,
    PolyScheduler,
)
from pskv.optimizer.lr_scheduler import scheduler_names


def test_factor_scheduler_steps_and_floor() -> None:
    s = FactorScheduler(step=3, factor=0.5, stop_factor_lr=0.1, base_lr=1.0)
    # first decay from update step + 1 (MXNet: num_update > count + step)
    assert [s(n) for n in (0, 1, 3, 4, 6, 7, 9, 10)] == [1.0, 1.0, 1.0, 0.5, 0.5, 0.25, 0.25, 0.125]
    assert s(13) == 0.1 and s(1000) == 0.1
    # stateless: going back in time gives the earlier value again
    assert s(4) == 0.5


def test_factor_scheduler_warmup_linear() -> None:
    s = FactorScheduler(step=10, factor=0.1, base_lr=1.0, warmup_steps=4, warmup_begin_lr=0.2)
    assert [s(n) for n in range(4)] == pytest.approx([0.2, 0.4, 0.6, 0.8], abs=1e-15)
    assert s(4) == 1.0 and s(10) == 1.0
    assert s(11) == pytest.approx(0.1, rel=1e-15)


def test_multifactor_scheduler() -> None:
    s = MultiFactorScheduler(step=[2, 5], factor=0.1, base_lr=2.0)
    got = [s(n) for n in (1, 2, 3, 5, 6, 100)]
    assert got == pytest.approx([2.0, 2.0, 0.2, 0.2, 0.02, 0.02], rel=1e-15)


def test_multifactor_constant_warmup() -> None:
    s = MultiFactorScheduler(
        step=[10], factor=0.5, base_lr=1.0, warmup_steps=3, warmup_begin_lr=0.1, warmup_mode="constant"
    )
    assert [s(n) for n in range(5)] == [0.1, 0.1, 0.1, 1.0, 1.0]


def test_poly_scheduler() -> None:
    s = PolyScheduler(max_update=10, base_lr=1.0, pwr=2, final_lr=0.1)
    for n in (0, 3, 7, 10):
        assert s(n) == pytest.approx(0.1 + 0.9 * (1 - n / 10) ** 2, rel=1e-14)
    assert s(11) == 0.1 and s(10**6) == 0.1


def test_poly_scheduler_with_warmup() -> None:
    s = PolyScheduler(max_update=12, base_lr=0.5, pwr=1, warmup_steps=2, warmup_begin_lr=0.1)
    assert s(0) == pytest.approx(0.1) and s(1) == pytest.approx(0.3)
    assert s(2) == pytest.approx(0.5)
    assert s(7) == pytest.approx(0.5 * (1 - 5 / 10))
    assert s(12) == pytest.approx(0.0, abs=1e-15)


def test_cosine_scheduler() -> None:
    s = CosineScheduler(max_update=20, base_lr=1.0, final_lr=0.2, warmup_steps=4, warmup_begin_lr=0.0)
    assert s(2) == pytest.approx(0.5)
    for n in (4, 9, 14, 20):
        expected = 0.2 + 0.8 * (1 + math.cos(math.pi * (n - 4) / 16)) / 2
        assert s(n) == pytest.approx(expected, rel=1e-14)
    assert s(12) == pytest.approx(0.6, rel=1e-14)  # half way
    assert s(21) == 0.2


def test_optimizer_overrides_base_lr_for_decay() -> None:
    s = CosineScheduler(max_update=10, base_lr=5.0)
    opt = SGD(learning_rate=1.0, lr_scheduler=s)
    assert s.base_lr == 1.0
    assert opt.learning_rate == 1.0  # num_update 0
    opt.num_update = 5
    assert opt.learning_rate == pytest.approx(0.5)


ALL = [
    FactorScheduler(step=7, factor=0.9, stop_factor_lr=1e-4, base_lr=0.3, warmup_steps=2, warmup_begin_lr=0.01),
    MultiFactorScheduler(step=[3, 9, 27], factor=0.3, base_lr=0.7, warmup_mode="constant", warmup_steps=1),
    PolyScheduler(max_update=50, base_lr=0.2, pwr=1.5, final_lr=0.01, warmup_steps=5),
    CosineScheduler(max_update=40, base_lr=0.9, final_lr=0.1, warmup_steps=3, warmup_begin_lr=0.05),
]


@pytest.mark.parametrize("sched", ALL, ids=repr)
def test_config_round_trip(sched: LRScheduler) -> None:
    cfg = sched.to_config()
    back = LRScheduler.from_config(json.loads(json.dumps(cfg, allow_nan=False)))
    assert type(back) is type(sched)
    assert back.to_config() == cfg
    assert [back(n) for n in range(60)] == [sched(n) for n in range(60)]


def test_registered_scheduler_names() -> None:
    assert scheduler_names() == ["cosine", "factor", "multifactor", "poly"]


@pytest.mark.parametrize(
    "make,param",
    [
        (lambda: FactorScheduler(step=0), "step"),
        (lambda: FactorScheduler(step=2, factor=1.5), "factor"),
        (lambda: FactorScheduler(step=2, stop_factor_lr=-1), "stop_factor_lr"),
        (lambda: FactorScheduler(step=2, base_lr=0.1, warmup_begin_lr=0.5), "warmup_begin_lr"),
        (lambda: FactorScheduler(step=2, warmup_steps=-1), "warmup_steps"),
        (lambda: FactorScheduler(step=2, warmup_mode="cubic"), "warmup_mode"),
        (lambda: MultiFactorScheduler(step=[5, 5]), "increasing"),
        (lambda: MultiFactorScheduler(step=[]), "step"),
        (lambda: MultiFactorScheduler(step=[0, 5]), "step"),
        (lambda: PolyScheduler(max_update=0), "max_update"),
        (lambda: PolyScheduler(max_update=10, pwr=0), "pwr"),
        (lambda: PolyScheduler(max_update=10, warmup_steps=10), "warmup_steps"),
        (lambda: CosineScheduler(max_update=10, final_lr=-0.1), "final_lr"),
        (lambda: CosineScheduler(max_update=2.5), "max_update"),
    ],
)
def test_invalid_parameters(make: Any, param: str) -> None:
    with pytest.raises(InvalidArgumentError, match=param):
        make()


@pytest.mark.parametrize(
    "config,match",
    [
        ({"name": "cosine", "params": {}}, "max_update"),
        ({"name": "cosine", "params": {"max_update": 3, "power": 2}}, "power"),
        ({"name": "linear", "params": {}}, "cosine"),
        ({"params": {}}, "'name' and 'params'"),
        ({"name": "poly", "params": []}, "params"),
    ],
)
def test_from_config_errors(config: Any, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        LRScheduler.from_config(config)


def test_unregistered_scheduler_has_no_config() -> None:
    class Constant(LRScheduler):
        def _after_warmup(self, num_update: int) -> float:
            return self.base_lr

    with pytest.raises(InvalidArgumentError, match="not a registered"):
        Constant().to_config()
    with pytest.raises(InvalidArgumentError, match="not a registered"):
        SGD(lr_scheduler=Constant()).to_config()
    assert SGD(learning_rate=0.4, lr_scheduler=Constant()).learning_rate == 0.4
