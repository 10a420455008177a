"""The metric base class and the registry: :class:`EvalMetric`, ``METRICS``, :func:`register`, :func:`alias`.

:func:`~pskv.parallel.metrics.composite.create` lives in :mod:`.composite`, beside the two
metrics it builds for lists and functions (and which call it in turn).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from pskv._registry import Registry
from pskv.errors import InvalidArgumentError, InvalidTypeError

__all__ = ["EvalMetric", "METRICS", "register", "alias", "registered_names"]

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
