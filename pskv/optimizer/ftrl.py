"""FTRL-Proximal (McMahan et al., "Ad Click Prediction: a View from the Trenches").

MXNet's rule, unchanged (``g`` is the rescaled, clipped gradient; ``wd`` enters the
denominator rather than the gradient)::

    z += g - (sqrt(n + g * g) - sqrt(n)) * w / lr
    n += g * g
    w = (sign(z) * lamda1 - z) / ((beta + sqrt(n)) / lr + wd)   where |z| > lamda1
    w = 0                                                        elsewhere
"""

from __future__ import annotations

from typing import Any

from pskv.optimizer import _math
from pskv.optimizer._validate import as_float
from pskv.optimizer.base import Array, Optimizer
from pskv.optimizer.registry import register

__all__ = ["Ftrl", "FTRL"]


@register
class Ftrl(Optimizer):
    """FTRL-Proximal (MXNet ``ftrl``).

    Args:
        lamda1: L1 regularisation strength (>= 0; MXNet's spelling).
        beta: per-coordinate learning-rate offset (>= 0).
        **kwargs: common hyperparameters of :class:`~pskv.optimizer.Optimizer`
            (default ``learning_rate`` 0.1; it must be > 0 since the rule divides by it).

    Raises:
        InvalidArgumentError: a hyperparameter is out of range.
    """

    default_learning_rate = 0.1

    def __init__(self, *, lamda1: float = 0.01, beta: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = type(self).__name__
        if self.lr_scheduler is None:
            as_float(owner, "learning_rate", self._lr, gt=0.0)
        self.lamda1 = as_float(owner, "lamda1", lamda1, ge=0.0)
        self.beta = as_float(owner, "beta", beta, ge=0.0)

    def _state_names(self) -> tuple[str, ...]:
        return ("z", "n")

    def _params(self) -> dict[str, Any]:
        return {"lamda1": self.lamda1, "beta": self.beta}

    def _step(self, weight: Array, grad: Array, state: tuple[Array, ...], lr: float, wd: float, t: int) -> None:
        z, n = state
        g2 = grad * grad
        z += grad - (_math.sqrt(n + g2) - _math.sqrt(n)) * weight / lr
        n += g2
        new = (_math.sign(z) * self.lamda1 - z) / ((self.beta + _math.sqrt(n)) / lr + wd)
        _math.assign(weight, _math.where(abs(z) > self.lamda1, new, 0.0))


FTRL = Ftrl
