"""Metrics over values: MSE, MAE, RMSE (element-wise errors) and Loss (the mean of given losses).

Registered, with their aliases and in this order, when the module is imported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pskv.parallel.metrics._inputs import NDArray, _as_list, _as_numpy, _pairs, _shape_error
from pskv.parallel.metrics.base import EvalMetric, alias, register

__all__ = ["MSE", "MAE", "RMSE", "Loss"]


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
