"""create() and the metrics made of other things: CompositeEvalMetric (a list), CustomMetric (a function).

They sit together because each needs the others: :func:`create` builds a composite from a
list and a custom metric from a function, and a composite builds its children with
:func:`create`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pskv.errors import InvalidArgumentError, InvalidTypeError
from pskv.parallel.metrics._inputs import NDArray, _as_list, _as_numpy, _pairs
from pskv.parallel.metrics.base import METRICS, EvalMetric, alias, register, registered_names

__all__ = ["create", "CompositeEvalMetric", "CustomMetric", "np_metric"]


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


@register
@alias("composite")
class CompositeEvalMetric(EvalMetric):
    """Several metrics updated together; :meth:`get` returns a list of names and a list of values.

    Args:
        metrics: child metrics in any form :func:`create` accepts, or None.
        name: as in :class:`EvalMetric`.
        output_names: as in :class:`EvalMetric`.
        label_names: as in :class:`EvalMetric`.
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
        output_names: as in :class:`EvalMetric`.
        label_names: as in :class:`EvalMetric`.

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
