"""One re-registration rule for stores, optimizers, schedulers and metrics (pskv._registry)."""

from __future__ import annotations

import pytest

from pskv._registry import Registry
from pskv.errors import InvalidArgumentError
from pskv.optimizer import SGD, register, registered_names
from pskv.optimizer.lr_scheduler import SCHEDULERS
from pskv.parallel.metrics import METRICS


def test_the_same_class_again_replaces_and_a_different_one_is_refused():
    r: Registry[type] = Registry("widget")

    class Widget:
        pass
    assert r.add("Widget", Widget) is Widget
    r.add("widget", Widget)  # a reload
    other = type("Widget", (), {})
    other.__qualname__ = "elsewhere.Widget"
    with pytest.raises(InvalidArgumentError, match="widget name 'widget' is already registered by"):
        r.add("WIDGET", other)
    assert r["WiDgEt"] is Widget and r.names() == ["widget"]
    with pytest.raises(InvalidArgumentError, match="unknown widget 'gadget'; known: widget"):
        r.lookup("gadget")


def test_optimizers_schedulers_and_metrics_share_the_rule():
    register(SGD)  # again: fine
    assert "sgd" in registered_names()

    class SGD2(SGD):
        pass
    SGD2.__name__ = "SGD"
    with pytest.raises(InvalidArgumentError, match="already registered"):
        register(SGD2)
    assert {"factor", "cosine"} <= set(SCHEDULERS) and "acc" in METRICS


def test_compressors_share_the_rule():
    from pskv.compression import COMPRESSORS, TwoBit
    from pskv.compression import register as register_compressor

    register_compressor(TwoBit)  # again: fine
    other = type("TwoBit", (TwoBit,), {"type": "2bit"})
    with pytest.raises(InvalidArgumentError, match="gradient compression type name '2bit' is already registered"):
        register_compressor(other)
    assert COMPRESSORS["2bit"] is TwoBit
