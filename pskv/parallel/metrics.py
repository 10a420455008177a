"""Evaluation metrics with MXNet's ``mx.metric`` interface, over NumPy arrays and PyTorch tensors.

Every metric keeps float64 sums and integer counts (``sum_metric`` / ``num_inst``), so the
result does not depend on how the samples were split into batches: updating with the two
halves of a batch gives exactly what updating with the whole batch gives. A data-parallel
group relies on that, since it calls ``update`` once per device slice.

Differences from MXNet, all deliberate:

* ``MSE``, ``MAE`` and ``RMSE`` average over every element seen (``num_inst`` counts
  elements), where MXNet averages the per-batch means (``num_inst`` counts batches) and so
  weighs a short last batch like a full one. ``RMSE`` is the square root of the overall
  MSE, not a mean of per-batch RMSEs.
* ``F1`` is multi-class and its ``average`` means what it means in scikit-learn
  (``'macro'``, ``'micro'``, ``'binary'``); MXNet's ``F1`` is binary only and uses
  ``average`` to choose between averaging per-batch scores and pooling the counts.
  MXNet's F1 is ``F1(average='binary')`` here.
* ``TopKAccuracy`` accepts ``top_k=1`` and always appends ``_<k>`` to its name.
* Class ids must be whole numbers; fractional labels or predicted ids raise instead of
  being truncated.

Tensors may live on any device: they are copied to the host with
``.detach().cpu().numpy()``. torch is never imported by this module.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from pskv._registry import Registry
from pskv.arrays import is_torch, to_numpy
from pskv.errors import InvalidArgumentError, InvalidTypeError, ShapeMismatchError

__all__ = [
    "EvalMetric",
    "Accuracy",
    "TopKAccuracy",
    "CrossEntropy",
    "Perplexity",
    "MSE",
    "MAE",
    "RMSE",
    "F1",
    "Loss",
    "CompositeEvalMetric",
    "CustomMetric",
    "np_metric",
    "create",
    "register",
    "alias",
    "registered_names",
]

NDArray = np.ndarray[Any, Any]

# ---------------------------------------------------------------------------- registry

#: Metric classes by lower-cased name and alias (the re-registration rule: pskv._registry).
METRICS: Registry[type[EvalMetric]] = Registry("metric")
_M = TypeVar("_M", bound="type[EvalMetric]")


def _register_name(klass: type[EvalMetric], name: str) -> None:
    METRICS.add(name, klass)


def _check_metric_class(klass: object) -> None:
    if not (isinstance(klass, type) and issubclass(klass, EvalMetric)):
        raise InvalidTypeError(f"only EvalMetric subclasses can be registered, got {klass!r}")


def register(klass: _M) -> _M:
    """Class decorator: make ``klass`` available to :func:`create` under its lower-cased class name.

    Registering the same class again (e.g. after a module reload) is harmless.

    Args:
        klass: an :class:`EvalMetric` subclass.

    Raises:
        InvalidTypeError: ``klass`` is not an EvalMetric subclass.
        InvalidArgumentError: a different class already holds the name.
    """
    _check_metric_class(klass)
    _register_name(klass, klass.__name__)
    return klass


def alias(*names: str) -> Callable[[_M], _M]:
    """Class decorator factory: register an :class:`EvalMetric` subclass under extra names.

    Args:
        *names: the extra names (matched case-insensitively by :func:`create`).

    Raises:
        InvalidTypeError: the decorated object is not an EvalMetric subclass.
        InvalidArgumentError: a name is empty or already held by a different class.
    """
    for name in names:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"metric aliases must be non-empty strings, got {name!r}")

    def decorate(klass: _M) -> _M:
        _check_metric_class(klass)
        for name in names:
            _register_name(klass, name)
        return klass

    return decorate


def registered_names() -> list[str]:
    """Every name :func:`create` accepts, sorted."""
    return METRICS.names()


def create(metric: Any, *args: Any, **kwargs: Any) -> EvalMetric:
    """Build a metric (MXNet ``mx.metric.create``).

    Args:
        metric: a registered name (case-insensitive, e.g. ``'acc'``, ``'F1'``), an
            :class:`EvalMetric` instance (returned as is), an EvalMetric subclass
            (instantiated), a :meth:`EvalMetric.get_config` dict, a function ``feval(label, pred)`` (wrapped in
            :class:`CustomMetric`), or a list of those (a :class:`CompositeEvalMetric`).
        *args: positional arguments of the metric's constructor.
        **kwargs: keyword arguments of the metric's constructor.

    Raises:
        InvalidArgumentError: unknown name (the message lists the known ones), arguments the
            constructor does not accept, or arguments given with a ready-made instance.
        InvalidTypeError: ``metric`` is none of the accepted kinds.
    """
    if isinstance(metric, EvalMetric):
        if args or kwargs:
            raise InvalidArgumentError(f"create() got constructor arguments for the ready-made metric {metric.name!r}")
        return metric
    if isinstance(metric, Mapping):  # a get_config() dict
        config = dict(metric)
        if "metric" not in config:
            raise InvalidArgumentError(f"a metric config needs a 'metric' entry, got keys {sorted(config)}")
        return create(config.pop("metric"), *args, **{**config, **kwargs})
    if isinstance(metric, (list, tuple)):
        composite = CompositeEvalMetric()
        for child in metric:
            composite.add(create(child, *args, **kwargs))
        return composite
    if isinstance(metric, str):
        klass = METRICS.get(metric.lower())
        if klass is None:
            raise InvalidArgumentError(f"unknown metric {metric!r}; known: {', '.join(registered_names())}")
        return _construct(klass, args, kwargs)
    if isinstance(metric, type) and issubclass(metric, EvalMetric):
        return _construct(metric, args, kwargs)
    if callable(metric):
        return CustomMetric(metric, *args, **kwargs)
    raise InvalidTypeError(
        f"metric must be a name, an EvalMetric, a function or a list of those, got {type(metric).__name__}"
    )


def _construct(klass: type[EvalMetric], args: tuple[Any, ...], kwargs: dict[str, Any]) -> EvalMetric:
    """``klass(*args, **kwargs)``, with argument errors reported as InvalidArgumentError."""
    signature = inspect.signature(klass)
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise InvalidArgumentError(
            f"metric {klass.__name__}: {exc}; accepted parameters: {', '.join(signature.parameters)}"
        ) from exc
    return klass(*args, **kwargs)


# ---------------------------------------------------------------------------- helpers


def _as_numpy(x: Any) -> NDArray:
    """A host NumPy array with the values of ``x`` (tensors on any device, arrays, array-likes)."""
    if isinstance(x, np.ndarray):
        return x
    if is_torch(x):
        return to_numpy(x)
    return np.asarray(x)


def _as_list(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _shape_error(metric: str, detail: str, label_shape: Sequence[int], pred_shape: Sequence[int]) -> ShapeMismatchError:
    """A ShapeMismatchError whose message speaks of labels and predictions, not of stored keys."""
    err = ShapeMismatchError(metric, "update", tuple(label_shape), tuple(pred_shape))
    err.args = (
        f"metric {metric!r}: {detail}: labels have shape {tuple(label_shape)}, "
        f"predictions have shape {tuple(pred_shape)}",
    )
    return err


def _pairs(metric: str, labels: Any, preds: Any) -> list[tuple[NDArray, NDArray]]:
    """Labels and predictions as NumPy pairs; their numbers must agree.

    Raises:
        ShapeMismatchError: different numbers of label and prediction arrays.
    """
    label_list, pred_list = _as_list(labels), _as_list(preds)
    if len(label_list) != len(pred_list):
        err = ShapeMismatchError(metric, "update", (len(label_list),), (len(pred_list),))
        err.args = (
            f"metric {metric!r}: got {len(label_list)} label array(s) but {len(pred_list)} prediction array(s)",
        )
        raise err
    return [(_as_numpy(label), _as_numpy(pred)) for label, pred in zip(label_list, pred_list)]


def _class_ids(metric: str, what: str, x: NDArray) -> NDArray:
    """``x`` flattened to int64 class ids.

    Raises:
        InvalidArgumentError: ``x`` holds fractional, non-finite or negative values.
    """
    flat = x.reshape(-1)
    if flat.dtype.kind == "b":
        return flat.astype(np.int64)
    if flat.dtype.kind == "f" and not (np.isfinite(flat).all() and (flat == np.floor(flat)).all()):
        raise InvalidArgumentError(f"metric {metric!r}: {what} must be whole-number class ids")
    if flat.dtype.kind not in "iuf":
        raise InvalidArgumentError(f"metric {metric!r}: {what} must be numeric class ids, got dtype {flat.dtype}")
    ids = flat.astype(np.int64)
    if ids.size and int(ids.min()) < 0:
        raise InvalidArgumentError(f"metric {metric!r}: {what} must be non-negative class ids, got {int(ids.min())}")
    return ids


def _predicted_ids(metric: str, label: NDArray, pred: NDArray, axis: int) -> tuple[NDArray, NDArray]:
    """Label ids and predicted ids (argmax of scores over ``axis`` unless ``pred`` already holds ids).

    Raises:
        ShapeMismatchError: the two disagree in the number of samples.
        InvalidArgumentError: fractional or negative class ids.
    """
    ids = pred
    if pred.shape != label.shape:
        if pred.ndim == 0 or not -pred.ndim <= axis < pred.ndim:
            raise _shape_error(metric, f"predictions have no class axis {axis}", label.shape, pred.shape)
        ids = np.argmax(pred, axis=axis)
    if ids.size != label.size:
        raise _shape_error(metric, "different numbers of samples", label.shape, pred.shape)
    return _class_ids(metric, "labels", label), _class_ids(metric, "predicted class ids", ids)


def _scores_2d(metric: str, label: NDArray, pred: NDArray) -> tuple[NDArray, NDArray]:
    """Label ids ``(N,)`` and a score matrix ``(N, C)``; every label must be ``< C``.

    Raises:
        ShapeMismatchError: ``pred`` is not ``(N, C)`` for the ``N`` labels.
        InvalidArgumentError: a label is not a class id in ``[0, C)``.
    """
    if pred.ndim != 2 or pred.shape[0] != label.size:
        raise _shape_error(metric, "predictions must be (samples, classes)", label.shape, pred.shape)
    ids = _class_ids(metric, "labels", label)
    if ids.size and int(ids.max()) >= pred.shape[1]:
        raise InvalidArgumentError(
            f"metric {metric!r}: label {int(ids.max())} is out of range for {pred.shape[1]} classes"
        )
    return ids, pred


# ---------------------------------------------------------------------------- base class


class EvalMetric:
    """Base class of all metrics: accumulates ``sum_metric`` over ``num_inst`` instances.

    Args:
        name: the metric's name, reported by :meth:`get`.
        output_names: names of the predictions :meth:`update_dict` uses, in order
            (``None``: all values of the prediction dict).
        label_names: names of the labels :meth:`update_dict` uses, in order
            (``None``: all values of the label dict).
        **kwargs: further constructor arguments, recorded for :meth:`get_config`.
    """

    def __init__(
        self,
        name: str,
        output_names: Sequence[str] | None = None,
        label_names: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        self.name = str(name)
        self.output_names = list(output_names) if output_names is not None else None
        self.label_names = list(label_names) if label_names is not None else None
        self._kwargs = kwargs
        self.num_inst: int = 0
        self.sum_metric: float = 0.0
        self.reset()

    def __str__(self) -> str:
        return f"EvalMetric: {dict(self.get_name_value())}"

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments: ``create(**config)`` builds an equivalent, empty metric."""
        config = dict(self._kwargs)
        config.update(
            metric=type(self).__name__, name=self.name, output_names=self.output_names, label_names=self.label_names
        )
        return config

    def update(self, labels: Any, preds: Any) -> None:
        """Add a batch: ``labels`` and ``preds`` are arrays / tensors, or lists of them paired in order.

        Raises:
            ShapeMismatchError: the numbers of labels and predictions, or of their samples, differ.
            InvalidArgumentError: values the metric cannot score (e.g. fractional class ids).
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement update")

    def update_dict(self, label: Mapping[str, Any], pred: Mapping[str, Any]) -> None:
        """Add a batch given as dicts name -> array, paired by ``label_names`` / ``output_names``.

        Without names, all values of each dict are used in their order.

        Raises:
            InvalidArgumentError: a named output or label is missing from its dict.
            ShapeMismatchError: as in :meth:`update`.
        """
        self.update(_select(label, self.label_names, "label"), _select(pred, self.output_names, "output"))

    def reset(self) -> None:
        """Forget everything seen so far."""
        self.num_inst = 0
        self.sum_metric = 0.0

    def get(self) -> tuple[Any, Any]:
        """``(name, value)``; the value is nan before the first instance."""
        if self.num_inst == 0:
            return self.name, math.nan
        return self.name, self.sum_metric / self.num_inst

    def get_name_value(self) -> list[tuple[str, float]]:
        """The ``(name, value)`` pairs of :meth:`get` as a list (one pair per reported value)."""
        name, value = self.get()
        if not isinstance(name, list):
            name, value = [name], [value]
        return list(zip(name, value))


def _select(values: Mapping[str, Any], names: list[str] | None, what: str) -> list[Any]:
    if names is None:
        return list(values.values())
    missing = [n for n in names if n not in values]
    if missing:
        raise InvalidArgumentError(f"{what} name(s) {missing} not among the given {what}s {sorted(values)}")
    return [values[n] for n in names]


# ---------------------------------------------------------------------------- classification


@register
@alias("acc", "accuracy")
class Accuracy(EvalMetric):
    """Fraction of samples whose predicted class equals the label.

    Predictions are scores whose argmax over ``axis`` is the class, or class ids already
    when their shape equals the label's.

    Args:
        axis: the class axis of score predictions.
        name, output_names, label_names: as in :class:`EvalMetric`.
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
        name, output_names, label_names: as in :class:`EvalMetric`.

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
        name, output_names, label_names: as in :class:`EvalMetric`.
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
        name, output_names, label_names: as in :class:`EvalMetric`.
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
        name, output_names, label_names: as in :class:`EvalMetric`.

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


# ---------------------------------------------------------------------------- regression


class _ElementwiseError(EvalMetric):
    """Shared update of MSE / MAE / RMSE: sums an element-wise error over every element."""

    @staticmethod
    def _error(diff: NDArray) -> NDArray:
        raise NotImplementedError

    def update(self, labels: Any, preds: Any) -> None:
        for label, pred in _pairs(self.name, labels, preds):
            if label.shape != pred.shape:
                if label.size != pred.size:
                    raise _shape_error(self.name, "different numbers of elements", label.shape, pred.shape)
                label = label.reshape(pred.shape)
            diff = label.astype(np.float64) - pred.astype(np.float64)
            self.sum_metric += float(self._error(diff).sum())
            self.num_inst += diff.size


@register
@alias("mse")
class MSE(_ElementwiseError):
    """Mean squared error over every element seen (not MXNet's mean of per-batch means).

    Labels are reshaped to the predictions' shape when the sizes agree.
    """

    def __init__(
        self, name: str = "mse", output_names: Sequence[str] | None = None, label_names: Sequence[str] | None = None
    ) -> None:
        super().__init__(name, output_names=output_names, label_names=label_names)

    @staticmethod
    def _error(diff: NDArray) -> NDArray:
        return np.square(diff)


@register
@alias("mae")
class MAE(_ElementwiseError):
    """Mean absolute error over every element seen (not MXNet's mean of per-batch means).

    Labels are reshaped to the predictions' shape when the sizes agree.
    """

    def __init__(
        self, name: str = "mae", output_names: Sequence[str] | None = None, label_names: Sequence[str] | None = None
    ) -> None:
        super().__init__(name, output_names=output_names, label_names=label_names)

    @staticmethod
    def _error(diff: NDArray) -> NDArray:
        return np.abs(diff)


@register
@alias("rmse")
class RMSE(MSE):
    """Square root of the overall mean squared error (not MXNet's mean of per-batch RMSEs)."""

    def __init__(
        self, name: str = "rmse", output_names: Sequence[str] | None = None, label_names: Sequence[str] | None = None
    ) -> None:
        super().__init__(name, output_names=output_names, label_names=label_names)

    def get(self) -> tuple[Any, Any]:
        if self.num_inst == 0:
            return self.name, math.nan
        return self.name, math.sqrt(self.sum_metric / self.num_inst)


@register
@alias("loss")
class Loss(EvalMetric):
    """Mean of loss values: the predictions *are* the losses (every element counts); labels are ignored."""

    def __init__(
        self, name: str = "loss", output_names: Sequence[str] | None = None, label_names: Sequence[str] | None = None
    ) -> None:
        super().__init__(name, output_names=output_names, label_names=label_names)

    def update(self, labels: Any, preds: Any) -> None:
        del labels  # the losses are already computed against the labels
        for pred in _as_list(preds):
            values = _as_numpy(pred)
            self.sum_metric += float(values.astype(np.float64).sum())
            self.num_inst += values.size


# ---------------------------------------------------------------------------- combinations


@register
@alias("composite")
class CompositeEvalMetric(EvalMetric):
    """Several metrics updated together; :meth:`get` returns a list of names and a list of values.

    Args:
        metrics: child metrics in any form :func:`create` accepts, or None.
        name, output_names, label_names: as in :class:`EvalMetric`.
    """

    def __init__(
        self,
        metrics: Sequence[Any] | None = None,
        name: str = "composite",
        output_names: Sequence[str] | None = None,
        label_names: Sequence[str] | None = None,
    ) -> None:
        self.metrics: list[EvalMetric] = [create(m) for m in (metrics or [])]
        super().__init__(name, output_names=output_names, label_names=label_names)

    def add(self, metric: Any) -> None:
        """Append a child metric (any form :func:`create` accepts)."""
        self.metrics.append(create(metric))

    def get_metric(self, index: int) -> EvalMetric:
        """The child metric at ``index``.

        Raises:
            InvalidArgumentError: ``index`` is out of range.
        """
        if not -len(self.metrics) <= index < len(self.metrics):
            raise InvalidArgumentError(f"metric index {index} is out of range for {len(self.metrics)} metric(s)")
        return self.metrics[index]

    def update(self, labels: Any, preds: Any) -> None:
        for metric in self.metrics:
            metric.update(labels, preds)

    def update_dict(self, label: Mapping[str, Any], pred: Mapping[str, Any]) -> None:
        if self.label_names is not None:
            label = {n: label[n] for n in self.label_names if n in label}
        if self.output_names is not None:
            pred = {n: pred[n] for n in self.output_names if n in pred}
        for metric in self.metrics:
            metric.update_dict(label, pred)

    def reset(self) -> None:
        super().reset()
        for metric in getattr(self, "metrics", []):
            metric.reset()

    def get(self) -> tuple[Any, Any]:
        names: list[str] = []
        values: list[float] = []
        for metric in self.metrics:
            name, value = metric.get()
            names.extend(name if isinstance(name, list) else [name])
            values.extend(value if isinstance(value, list) else [value])
        return names, values

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config["metrics"] = [m.get_config() for m in self.metrics]
        return config


@register
class CustomMetric(EvalMetric):
    """A metric computed by a function ``feval(label, pred)`` of NumPy arrays, per label/prediction pair.

    ``feval`` returns either a value (counted as one instance) or a ``(sum, count)`` pair.

    Args:
        feval: the function.
        name: the metric's name; default ``feval``'s name (``custom(<lambda>)`` for lambdas).
        allow_extra_outputs: pair labels and predictions up to the shorter list instead of
            requiring equal numbers.
        output_names, label_names: as in :class:`EvalMetric`.

    Raises:
        InvalidTypeError: ``feval`` is not callable.
    """

    def __init__(
        self,
        feval: Callable[[NDArray, NDArray], Any],
        name: str | None = None,
        allow_extra_outputs: bool = False,
        output_names: Sequence[str] | None = None,
        label_names: Sequence[str] | None = None,
    ) -> None:
        if not callable(feval):
            raise InvalidTypeError(f"CustomMetric: feval must be callable, got {type(feval).__name__}")
        if name is None:
            name = getattr(feval, "__name__", type(feval).__name__)
            if "<" in name:
                name = f"custom({name})"
        super().__init__(
            name,
            output_names=output_names,
            label_names=label_names,
            feval=feval,
            allow_extra_outputs=allow_extra_outputs,
        )
        self._feval = feval
        self._allow_extra_outputs = allow_extra_outputs

    def update(self, labels: Any, preds: Any) -> None:
        if self._allow_extra_outputs:
            pairs = [(_as_numpy(a), _as_numpy(b)) for a, b in zip(_as_list(labels), _as_list(preds))]
        else:
            pairs = _pairs(self.name, labels, preds)
        for label, pred in pairs:
            result = self._feval(label, pred)
            if isinstance(result, tuple):
                total, count = result
                self.sum_metric += float(total)
                self.num_inst += int(count)
            else:
                self.sum_metric += float(result)
                self.num_inst += 1


def np_metric(
    numpy_feval: Callable[[NDArray, NDArray], Any], name: str | None = None, allow_extra_outputs: bool = False
) -> CustomMetric:
    """A :class:`CustomMetric` from a NumPy function ``feval(label, pred)`` (MXNet ``mx.metric.np``).

    Usable as a decorator: ``@np_metric`` turns the function into the metric.

    Args:
        numpy_feval: returns a value or a ``(sum, count)`` pair for one label/prediction pair.
        name: the metric's name; default the function's name.
        allow_extra_outputs: as in :class:`CustomMetric`.

    Raises:
        InvalidTypeError: ``numpy_feval`` is not callable.
    """
    return CustomMetric(numpy_feval, name=name, allow_extra_outputs=allow_extra_outputs)
