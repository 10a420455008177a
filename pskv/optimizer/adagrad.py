"""AdaGrad in PyTorch's formulation.

::

    g = grad + wd * w                  (L2 weight decay)
    history += g * g
    w -= lr * g / (sqrt(history) + eps)

This equals ``torch.optim.Adagrad(lr_decay=0, initial_accumulator_value=0)``.
MXNet 1.x puts ``eps`` inside the root (``sqrt(history + eps)``) and adds ``wd * w``
outside the normalised step; pskv follows PyTorch for both.
"""

from __future__ import annotations

from typing import Any

from pskv.errors import InvalidArgumentError
from pskv.optimizer import _math
from pskv.optimizer._validate import as_float
from pskv.optimizer.base import Array, Optimizer
from pskv.optimizer.registry import register

__all__ = ["AdaGrad"]


@register
class AdaGrad(Optimizer):
    """AdaGrad (MXNet ``adagrad``).

    Args:
        eps: added to the root of the accumulated squared gradient (> 0; MXNet's
            name and default 1e-7).
        epsilon: alias of ``eps`` (MXNet 2 spelling); give one or the other.
        **kwargs: common hyperparameters of :class:`~pskv.optimizer.Optimizer`
            (default ``learning_rate`` 0.01).

    Raises:
        InvalidArgumentError: a hyperparameter is out of range, or both ``eps`` and
            ``epsilon`` are given.
    """

    default_learning_rate = 0.01
    aliases = ("epsilon",)

    def __init__(self, *, eps: float | None = None, epsilon: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if eps is not None and epsilon is not None:
            raise InvalidArgumentError("AdaGrad: give eps or its alias epsilon, not both")
        value = eps if eps is not None else (epsilon if epsilon is not None else 1e-7)
        self.eps = as_float(type(self).__name__, "eps", value, gt=0.0)

    def _state_names(self) -> tuple[str, ...]:
        return ("history",)

    def _params(self) -> dict[str, Any]:
        return {"eps": self.eps}

    def _step(self, weight: Array, grad: Array, state: tuple[Array, ...], lr: float, wd: float, t: int) -> None:
        g = grad + wd * weight if wd != 0.0 else grad
        history = state[0]
        history += g * g
        weight -= lr * (g / (_math.sqrt(history) + self.eps))
