"""Evaluation metrics: values against scikit-learn, batch-split invariance, inputs, create() and errors."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pskv.errors import InvalidArgumentError, InvalidTypeError, ShapeMismatchError
from pskv.parallel import metrics as M

try:
    import torch
except ImportError:  # pragma: no cover - torch is an optional extra
    torch = None  # type: ignore[assignment]

needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")


def sk() -> Any:
    """sklearn.metrics, or skip the test (scikit-learn is only a reference here)."""
    return pytest.importorskip("sklearn.metrics")


def probabilities(rng: np.random.Generator, n: int, c: int) -> np.ndarray:
    logits = rng.standard_normal((n, c))
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def value(metric: M.EvalMetric) -> float:
    return float(metric.get()[1])


# ------------------------------------------------------------------ values against scikit-learn


@pytest.mark.parametrize("as_ids", [False, True])
def test_accuracy_matches_sklearn(as_ids: bool) -> None:
    rng = np.random.default_rng(0)
    probs = probabilities(rng, 50, 4)
    labels = rng.integers(0, 4, 50)
    preds = probs.argmax(axis=1).astype(np.float32) if as_ids else probs
    m = M.Accuracy()
    m.update([labels[:20], labels[20:]], [preds[:20], preds[20:]])
    assert m.num_inst == 50
    assert value(m) == pytest.approx(sk().accuracy_score(labels, probs.argmax(axis=1)), abs=1e-15)


def test_accuracy_axis() -> None:
    rng = np.random.default_rng(1)
    probs = probabilities(rng, 12, 3)
    labels = rng.integers(0, 3, 12)
    m = M.Accuracy(axis=0)
    m.update(labels, probs.T)
    assert value(m) == pytest.approx(np.mean(probs.argmax(axis=1) == labels))


@pytest.mark.parametrize("k", [1, 2, 3])
def test_top_k_accuracy_matches_sklearn(k: int) -> None:
    rng = np.random.default_rng(k)
    probs = probabilities(rng, 60, 5)
    labels = rng.integers(0, 5, 60)
    m = M.TopKAccuracy(top_k=k)
    m.update(labels, probs)
    assert m.name == f"top_k_accuracy_{k}"
    assert value(m) == pytest.approx(sk().top_k_accuracy_score(labels, probs, k=k, labels=range(5)), abs=1e-15)


def test_top_k_ties_count_for_the_label() -> None:
    m = M.TopKAccuracy(top_k=1)
    m.update(np.array([0, 1]), np.array([[0.5, 0.5], [0.5, 0.5]]))
    assert value(m) == 1.0


def test_cross_entropy_matches_sklearn() -> None:
    rng = np.random.default_rng(2)
    probs = probabilities(rng, 40, 6)
    labels = rng.integers(0, 6, 40)
    m = M.CrossEntropy()
    m.update(labels, probs)
    assert value(m) == pytest.approx(sk().log_loss(labels, probs, labels=range(6)), rel=1e-9)


def test_perplexity_matches_exp_log_loss_with_ignored_labels() -> None:
    rng = np.random.default_rng(3)
    probs = probabilities(rng, 24, 5)
    labels = rng.integers(0, 5, 24)
    keep = labels != 0
    m = M.Perplexity(ignore_label=0)
    m.update(labels.reshape(4, 6), probs.reshape(4, 6, 5))  # (batch, time, vocab)
    assert m.num_inst == keep.sum()
    expected = math.exp(sk().log_loss(labels, probs, labels=range(5), sample_weight=keep.astype(float)))
    assert value(m) == pytest.approx(expected, rel=1e-9)


def test_perplexity_ignore_label_outside_the_classes() -> None:
    m = M.Perplexity(ignore_label=-1)
    m.update(np.array([1, -1]), np.array([[0.5, 0.5], [1.0, 0.0]]))
    assert value(m) == pytest.approx(2.0)
    assert m.num_inst == 1


@pytest.mark.parametrize(
    ("metric", "reference"),
    [
        ("mse", lambda s, y, p: s.mean_squared_error(y, p)),
        ("mae", lambda s, y, p: s.mean_absolute_error(y, p)),
        ("rmse", lambda s, y, p: math.sqrt(s.mean_squared_error(y, p))),
    ],
)
def test_regression_matches_sklearn_over_uneven_batches(metric: str, reference: Callable[..., float]) -> None:
    rng = np.random.default_rng(4)
    y, p = rng.standard_normal(37), rng.standard_normal(37)
    p[32:] = p[32:].astype(np.float32)  # the last batch comes as float32
    m = M.create(metric)
    m.update(y[:32], p[:32].reshape(32, 1))  # label (N,) is reshaped to the prediction's (N, 1)
    m.update(y[32:], p[32:].astype(np.float32))
    assert m.num_inst == 37
    assert value(m) == pytest.approx(reference(sk(), y, p), rel=1e-12)


@pytest.mark.parametrize("average", ["macro", "micro"])
def test_f1_matches_sklearn_multiclass(average: str) -> None:
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 4, 80)
    preds = rng.integers(0, 6, 80)  # classes 4 and 5 only ever predicted
    m = M.F1(average=average)
    m.update(labels[:30], preds[:30].astype(np.float64))
    m.update(labels[30:], np.eye(6)[preds[30:]])  # one-hot scores
    assert m.confusion.shape == (6, 6)
    assert value(m) == pytest.approx(sk().f1_score(labels, preds, average=average, zero_division=0), rel=1e-12)


def test_f1_binary_matches_sklearn_and_mxnet_layout() -> None:
    rng = np.random.default_rng(6)
    labels = rng.integers(0, 2, 50)
    probs = probabilities(rng, 50, 2)
    m = M.F1(average="binary")
    m.update(labels, probs)
    assert value(m) == pytest.approx(sk().f1_score(labels, probs.argmax(axis=1), average="binary"), rel=1e-12)


def test_f1_macro_skips_classes_never_seen() -> None:
    m = M.F1()
    m.update(np.array([3, 3]), np.array([3, 3]))
    assert m.confusion.shape == (4, 4)
    assert value(m) == 1.0


def test_loss_is_the_mean_of_all_values() -> None:
    m = M.Loss()
    m.update(None, [np.array([1.0, 2.0]), np.array([[3.0], [6.0]])])
    m.update(None, np.float32(3.0))
    assert (m.num_inst, value(m)) == (5, 3.0)


# ------------------------------------------------------------------ batch-split invariance

CLASSIFIERS = ["acc", "top_k_acc", "ce", "perplexity", "f1", "mse", "mae", "rmse", "loss"]


def batch(name: str, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    if name in ("mse", "mae", "rmse", "loss"):
        return rng.standard_normal((n, 2)), rng.standard_normal((n, 2))
    return rng.integers(0, 4, n), probabilities(rng, n, 4)


def make(name: str) -> M.EvalMetric:
    return M.create(name, top_k=2) if name == "top_k_acc" else M.create(name)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(CLASSIFIERS), n=st.integers(1, 30), cut=st.floats(0, 1), seed=st.integers(0, 2**16))
def test_two_halves_equal_the_whole_batch(name: str, n: int, cut: float, seed: int) -> None:
    labels, preds = batch(name, np.random.default_rng(seed), n)
    k = int(cut * n)
    whole, halves, sliced = make(name), make(name), make(name)
    whole.update([labels], [preds])
    halves.update([labels[:k]], [preds[:k]])
    halves.update([labels[k:]], [preds[k:]])
    sliced.update([labels[:k], labels[k:]], [preds[:k], preds[k:]])  # one update per device slice
    for m in (halves, sliced):
        assert m.num_inst == whole.num_inst
        if name in ("acc", "top_k_acc", "f1"):
            assert value(m) == value(whole)
        else:
            assert value(m) == pytest.approx(value(whole), rel=1e-12)


# ------------------------------------------------------------------ inputs


@needs_torch
@pytest.mark.parametrize("name", CLASSIFIERS)
def test_torch_tensors_give_the_numpy_result(name: str) -> None:
    labels, preds = batch(name, np.random.default_rng(7), 16)
    expected, m = make(name), make(name)
    expected.update([labels], [preds])
    m.update([torch.from_numpy(labels)], [torch.tensor(preds, dtype=torch.float64, requires_grad=True)])
    assert value(m) == pytest.approx(value(expected), rel=1e-12)


def test_single_arrays_and_plain_lists() -> None:
    m = M.Accuracy()
    m.update(np.array([0, 1]), np.array([[0.9, 0.1], [0.8, 0.2]]))
    m.update([[1]], [[[0.1, 0.9]]])
    assert (m.num_inst, value(m)) == (3, pytest.approx(2 / 3))


def test_update_dict_pairs_by_names() -> None:
    m = M.Accuracy(output_names=["out"], label_names=["y"])
    m.update_dict({"other": np.array([5]), "y": np.array([1])}, {"aux": np.zeros((1, 3)), "out": np.array([[0, 1, 0]])})
    assert value(m) == 1.0
    unnamed = M.Accuracy()
    unnamed.update_dict({"y": np.array([1, 0])}, {"out": np.array([1, 1])})
    assert value(unnamed) == 0.5
    with pytest.raises(InvalidArgumentError, match="'y'"):
        m.update_dict({"label": np.array([1])}, {"out": np.array([1])})


# ------------------------------------------------------------------ state


def test_nan_before_any_update_and_after_reset() -> None:
    for name in CLASSIFIERS:
        m = make(name)
        assert math.isnan(value(m))
        labels, preds = batch(name, np.random.default_rng(8), 4)
        m.update(labels, preds)
        assert not math.isnan(value(m))
        m.reset()
        assert (m.num_inst, m.sum_metric) == (0, 0.0)
        assert math.isnan(value(m))
    f1 = M.F1()
    f1.update(np.array([5]), np.array([5]))
    f1.reset()
    assert f1.confusion.shape == (0, 0)


def test_get_name_value_and_str() -> None:
    m = M.Accuracy()
    m.update(np.array([1, 1]), np.array([1, 0]))
    assert m.get() == ("accuracy", 0.5)
    assert m.get_name_value() == [("accuracy", 0.5)]
    assert str(m) == "EvalMetric: {'accuracy': 0.5}"


# ------------------------------------------------------------------ composite and custom metrics


def test_composite_forwards_to_children() -> None:
    comp = M.CompositeEvalMetric(["acc", M.MSE()])
    comp.add(M.Loss())
    assert isinstance(comp.get_metric(1), M.MSE)
    assert comp.get_metric(-1).name == "loss"
    comp.update([np.array([1.0, 0.0])], [np.array([1.0, 1.0])])
    names, values = comp.get()
    assert names == ["accuracy", "mse", "loss"]
    assert values == [0.5, 0.5, 1.0]
    assert comp.get_name_value() == list(zip(names, values))
    comp.reset()
    assert all(math.isnan(v) for v in comp.get()[1])
    with pytest.raises(InvalidArgumentError, match="out of range"):
        comp.get_metric(3)


def test_composite_update_dict() -> None:
    comp = M.create([M.Accuracy(output_names=["a"], name="acc_a"), M.Accuracy(output_names=["b"], name="acc_b")])
    comp.update_dict({"y": np.array([1])}, {"a": np.array([1]), "b": np.array([0])})
    assert comp.get_name_value() == [("acc_a", 1.0), ("acc_b", 0.0)]


def test_custom_metric_value_and_sum_count() -> None:
    def exact(label: np.ndarray, pred: np.ndarray) -> float:
        return float(np.all(label == pred))

    m = M.np_metric(exact)
    assert m.name == "exact"
    m.update([np.array([1, 2]), np.array([3])], [np.array([1, 2]), np.array([4])])
    assert (m.num_inst, value(m)) == (2, 0.5)

    pairs = M.CustomMetric(lambda y, p: (float(np.sum(y == p)), y.size))
    assert pairs.name == "custom(<lambda>)"
    pairs.update(np.array([1, 2, 3]), np.array([1, 0, 3]))
    assert (pairs.num_inst, value(pairs)) == (3, pytest.approx(2 / 3))


def test_custom_metric_extra_outputs() -> None:
    strict = M.CustomMetric(lambda y, p: 1.0, name="one")
    with pytest.raises(ShapeMismatchError, match="'one'"):
        strict.update([np.zeros(1)], [np.zeros(1), np.zeros(1)])
    loose = M.CustomMetric(lambda y, p: 1.0, name="one", allow_extra_outputs=True)
    loose.update([np.zeros(1)], [np.zeros(1), np.zeros(1)])
    assert loose.num_inst == 1


# ------------------------------------------------------------------ create and the registry


def test_create_forms() -> None:
    assert isinstance(M.create("ACC"), M.Accuracy)
    assert isinstance(M.create("cross-entropy", eps=1e-6), M.CrossEntropy)
    assert M.create("top_k_accuracy", top_k=5).name == "top_k_accuracy_5"
    ready = M.MAE()
    assert M.create(ready) is ready
    assert isinstance(M.create(M.RMSE), M.RMSE)
    custom = M.create(lambda y, p: 0.0, name="zero")
    assert isinstance(custom, M.CustomMetric) and custom.name == "zero"
    comp = M.create(["acc", "f1", ready])
    assert isinstance(comp, M.CompositeEvalMetric)
    assert [m.name for m in comp.metrics] == ["accuracy", "f1", "mae"]


def test_get_config_round_trips_through_create() -> None:
    original = M.create(["acc", M.TopKAccuracy(3), M.F1("micro"), M.Perplexity(ignore_label=0)])
    copy = M.create(original.get_config())
    assert copy.get_config() == original.get_config()
    assert copy.get()[0] == ["accuracy", "top_k_accuracy_3", "f1", "perplexity"]


def test_create_errors() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown metric 'nope'; known: .*accuracy"):
        M.create("nope")
    with pytest.raises(InvalidArgumentError, match="accepted parameters"):
        M.create("acc", bogus=1)
    with pytest.raises(InvalidArgumentError, match="ready-made"):
        M.create(M.MSE(), name="x")
    with pytest.raises(InvalidTypeError):
        M.create(3)


def test_register_user_metrics() -> None:
    @M.register
    @M.alias("always_one_test")
    class AlwaysOneTest(M.EvalMetric):
        def __init__(self, name: str = "one") -> None:
            super().__init__(name)

        def update(self, labels: Any, preds: Any) -> None:
            self.sum_metric += 1.0
            self.num_inst += 1

    assert "alwaysonetest" in M.registered_names()
    assert isinstance(M.create("Always_One_Test"), AlwaysOneTest)
    with pytest.raises(InvalidArgumentError, match="already registered"):
        M.alias("acc")(AlwaysOneTest)
    with pytest.raises(InvalidTypeError):
        M.register(int)  # type: ignore[type-var]


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("name", "label", "pred"),
    [
        ("acc", np.zeros(3), np.zeros((4, 2))),
        ("acc", np.zeros(3), np.zeros(4)),
        ("top_k_acc", np.zeros(3), np.zeros((4, 2))),
        ("ce", np.zeros(3), np.full((4, 2), 0.5)),
        ("perplexity", np.zeros(3), np.full((4, 2), 0.5)),
        ("f1", np.zeros(3), np.zeros((4, 2))),
        ("mse", np.zeros(3), np.zeros((4, 1))),
        ("rmse", np.zeros((3, 2)), np.zeros((3, 3))),
    ],
)
def test_sample_count_mismatch(name: str, label: np.ndarray, pred: np.ndarray) -> None:
    m = make(name)
    with pytest.raises(ShapeMismatchError) as info:
        m.update([label], [pred])
    text = str(info.value)
    assert repr(m.name) in text and str(label.shape) in text and str(pred.shape) in text
    assert m.num_inst == 0


def test_label_and_prediction_counts_must_agree() -> None:
    with pytest.raises(ShapeMismatchError, match=r"'accuracy': got 2 label array\(s\) but 1 prediction"):
        M.Accuracy().update([np.zeros(1), np.zeros(1)], [np.zeros(1)])


def test_bad_class_ids_and_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="whole-number"):
        M.Accuracy().update(np.array([0.5]), np.array([[0.2, 0.8]]))
    with pytest.raises(InvalidArgumentError, match="out of range"):
        M.CrossEntropy().update(np.array([2]), np.array([[0.2, 0.8]]))
    with pytest.raises(InvalidArgumentError, match="non-negative"):
        M.F1().update(np.array([-1]), np.array([0]))
    with pytest.raises(InvalidArgumentError, match="binary"):
        M.F1(average="binary").update(np.array([2]), np.array([0]))
    with pytest.raises(InvalidArgumentError, match="average"):
        M.F1(average="weighted")
    with pytest.raises(InvalidArgumentError, match="top_k"):
        M.TopKAccuracy(top_k=0)
