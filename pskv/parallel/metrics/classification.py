"""Metrics over class ids and class scores: Accuracy, TopKAccuracy, CrossEntropy, Perplexity, F1.

Registered, with their aliases and in this order, when the module is imported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pskv.errors import InvalidArgumentError
from pskv.parallel.metrics._inputs import NDArray, _pairs, _predicted_ids, _scores_2d, _shape_error
from pskv.parallel.metrics.base import EvalMetric, alias, register

__all__ = ["Accuracy", "TopKAccuracy", "CrossEntropy", "Perplexity", "F1"]


@register
@alias("acc", "accuracy")
class Accuracy(EvalMetric):
    """Fraction of samples whose predicted class equals the label.

    Predictions are scores whose argmax over ``axis`` is the class, or class ids already
    when their shape equals the label's.

    Args:
        axis: the class axis of score predictions.
        name: as in :class:`EvalMetric`.
        output_names: as in :class:`EvalMetric`.
        label_names: as in :class:`EvalMetric`.
    """

    def __init__(
        self,
        axis: int = 1,
        name: str = "accuracy",
        output_names: Sequence[str] | None = None,
        label_names: Sequence[str] | None = None,
    ) -> None:
        super().__init__(name, output_names=output_names, label_names=label_names, axis=axis)
        self.axis = axis

    def update(self, labels: Any, preds: Any) -> None:
        for label, pred in _pairs(self.name, labels, preds):
            label_ids, pred_ids = _predicted_ids(self.name, label, pred, self.axis)
            self.sum_metric += float(np.count_nonzero(label_ids == pred_ids))
            self.num_inst += label_ids.size


@register
@alias("top_k_accuracy", "top_k_acc")
class TopKAccuracy(EvalMetric):
    """Fraction of samples whose label is among the ``top_k`` highest-scored classes.

    A label counts as hit when fewer than ``top_k`` classes score strictly higher than it,
    so ties are resolved in the label's favour (deterministically, unlike a sort).

    Args:
        top_k: how many of the best classes count, >= 1; the name gets ``_<top_k>`` appended.
        name: as in :class:`EvalMetric`.
        output_names: as in :class:`EvalMetric`.
        label_names: as in :class:`EvalMetric`.

    Raises:
        InvalidArgumentError: ``top_k`` < 1.
    """

    def __init__(
        self,
        top_k: int = 1,
        name: str = "top_k_accuracy",
        output_names: Sequence[str] | None = None,
        label_names: Sequence[str] | None = None,
    ) -> None:
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
            raise InvalidArgumentError(f"TopKAccuracy: top_k must be an int >= 1, got {top_k!r}")
        super().__init__(f"{name}_{int(top_k)}", output_names=output_names, label_names=label_names, top_k=int(top_k))
        self._base_name = name
        self.top_k = int(top_k)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config["name"] = self._base_name  # the constructor appends the suffix again
        return config

    def update(self, labels: Any, preds: Any) -> None:
        for label, pred in _pairs(self.name, labels, preds):
            if pred.shape == label.shape:  # class ids: a hit is an exact match
                label_ids, pred_ids = _predicted_ids(self.name, label, pred, -1)
                hits = int(np.count_nonzero(label_ids == pred_ids))
            else:
                label_ids, scores = _scores_2d(self.name, label, pred)
                true_score = scores[np.arange(label_ids.size), label_ids]
                better = np.count_nonzero(scores > true_score[:, None], axis=1)
                hits = int(np.count_nonzero(better < self.top_k))
            self.sum_metric += float(hits)
            self.num_inst += label_ids.size


@register
@alias("ce", "cross-entropy")
class CrossEntropy(EvalMetric):
    """Mean of ``-log(p[label] + eps)`` over samples; predictions are ``(N, C)`` probabilities.

    Args:
        eps: added to the probability before the log, so a zero gives a large finite loss.
        name: as in :class:`EvalMetric`.
        output_names: as in :class:`EvalMetric`.
        label_names: as in :class:`EvalMetric`.
    """

    def __init__(
        self,
        eps: float = 1e-12,
        name: str = "cross-entropy",
        output_names: Sequence[str] | None = None,
        label_names: Sequence[str] | None = None,
    ) -> None:
        super().__init__(name, output_names=output_names, label_names=label_names, eps=eps)
        self.eps = float(eps)

    def update(self, labels: Any, preds: Any) -> None:
        for label, pred in _pairs(self.name, labels, preds):
            ids, probs = _scores_2d(self.name, label, pred)
            picked = probs[np.arange(ids.size), ids].astype(np.float64)
            self.sum_metric += float(-np.log(picked + self.eps).sum())
            self.num_inst += ids.size


@register
@alias("perplexity")
class Perplexity(EvalMetric):
    """``exp`` of the mean negative log-likelihood of the labels (language models).

    Predictions hold probabilities along ``axis``; the labels have the predictions' shape
    without that axis (or any shape with as many elements). Probabilities are clipped
    below at 1e-10.

    Args:
        ignore_label: a label value whose entries are skipped (e.g. padding), or None.
        axis: the class axis of the predictions.
        name: as in :class:`EvalMetric`.
        output_names: as in :class:`EvalMetric`.
        label_names: as in :class:`EvalMetric`.
    """

    def __init__(
        self,
        ignore_label: int | None = None,
        axis: int = -1,
        name: str = "perplexity",
        output_names: Sequence[str] | None = None,
        label_names: Sequence[str] | None = None,
    ) -> None:
        super().__init__(name, output_names=output_names, label_names=label_names, ignore_label=ignore_label, axis=axis)
        self.ignore_label = ignore_label
        self.axis = axis

    def update(self, labels: Any, preds: Any) -> None:
        for label, pred in _pairs(self.name, labels, preds):
            if pred.ndim == 0 or not -pred.ndim <= self.axis < pred.ndim:
                raise _shape_error(self.name, f"predictions have no class axis {self.axis}", label.shape, pred.shape)
            scores = np.moveaxis(pred, self.axis, -1)
            scores = scores.reshape(-1, scores.shape[-1])
            if scores.shape[0] != label.size:
                raise _shape_error(self.name, "different numbers of samples", label.shape, pred.shape)
            flat = label.reshape(-1)
            keep = np.ones(flat.shape, dtype=bool) if self.ignore_label is None else flat != self.ignore_label
            ids, probs = _scores_2d(self.name, flat[keep], scores[keep])
            picked = np.maximum(probs[np.arange(ids.size), ids].astype(np.float64), 1e-10)
            self.sum_metric += float(-np.log(picked).sum())
            self.num_inst += ids.size

    def get(self) -> tuple[Any, Any]:
        if self.num_inst == 0:
            return self.name, math.nan
        return self.name, math.exp(self.sum_metric / self.num_inst)


@register
@alias("f1")
class F1(EvalMetric):
    """F1 score from a confusion matrix accumulated over all updates (grows as classes appear).

    Predictions are scores (argmax over axis 1) or class ids of the label's shape.

    Args:
        average: ``'macro'`` (unweighted mean of the per-class F1 over the classes seen in
            labels or predictions), ``'micro'`` (F1 of the pooled counts; equals accuracy for
            single-label data) or ``'binary'`` (F1 of class 1; ids must be 0 or 1). Same
            meanings as scikit-learn's ``f1_score``; MXNet's binary F1 is ``'binary'``.
        name: as in :class:`EvalMetric`.
        output_names: as in :class:`EvalMetric`.
        label_names: as in :class:`EvalMetric`.

    Raises:
        InvalidArgumentError: unknown ``average``.
    """

    AVERAGES = ("macro", "micro", "binary")

    def __init__(
        self,
        average: str = "macro",
        name: str = "f1",
        output_names: Sequence[str] | None = None,
        label_names: Sequence[str] | None = None,
    ) -> None:
        if average not in self.AVERAGES:
            raise InvalidArgumentError(f"F1: average must be one of {', '.join(self.AVERAGES)}, got {average!r}")
        self.average = average
        self.confusion: NDArray = np.zeros((0, 0), dtype=np.int64)
        super().__init__(name, output_names=output_names, label_names=label_names, average=average)

    def reset(self) -> None:
        super().reset()
        self.confusion = np.zeros((2, 2) if self.average == "binary" else (0, 0), dtype=np.int64)

    def update(self, labels: Any, preds: Any) -> None:
        for label, pred in _pairs(self.name, labels, preds):
            label_ids, pred_ids = _predicted_ids(self.name, label, pred, 1)
            if label_ids.size == 0:
                continue
            k = max(int(label_ids.max()), int(pred_ids.max())) + 1
            if self.average == "binary" and k > 2:
                raise InvalidArgumentError(f"metric {self.name!r}: binary F1 needs class ids 0 and 1, got id {k - 1}")
            if k > self.confusion.shape[0]:
                grown = np.zeros((k, k), dtype=np.int64)
                n = self.confusion.shape[0]
                grown[:n, :n] = self.confusion
                self.confusion = grown
            n = self.confusion.shape[0]
            counts = np.bincount(label_ids * n + pred_ids, minlength=n * n)
            self.confusion += counts.reshape(n, n)
            self.num_inst += label_ids.size
        self.sum_metric = self._score() * self.num_inst if self.num_inst else 0.0

    def _score(self) -> float:
        cm = self.confusion.astype(np.float64)
        tp = np.diag(cm)
        fp = cm.sum(axis=0) - tp
        fn = cm.sum(axis=1) - tp
        if self.average == "micro":
            denominator = 2 * tp.sum() + fp.sum() + fn.sum()
            return float(2 * tp.sum() / denominator) if denominator else 0.0
        denominators = 2 * tp + fp + fn
        per_class = np.divide(2 * tp, denominators, out=np.zeros_like(tp), where=denominators > 0)
        if self.average == "binary":
            return float(per_class[1])
        seen = denominators > 0  # classes that occurred as a label or a prediction
        return float(per_class[seen].mean()) if seen.any() else 0.0
