"""Adam and AdamW in PyTorch's formulation.

With ``t`` the key's update count, ``bc1 = 1 - beta1**t`` and ``bc2 = 1 - beta2**t``::

    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    w -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + epsilon)

This equals ``torch.optim.Adam`` / ``AdamW``. MXNet folds the bias correction into
the rate instead (``w -= lr * sqrt(bc2) / bc1 * m / (sqrt(v) + epsilon)``), which
differs only in where ``epsilon`` sits.

* Adam: L2 weight decay, ``g = grad + wd * w`` (``torch.optim.Adam(weight_decay=wd)``).
* AdamW: decoupled decay, ``w -= lr * wd * w`` before the step
  (``torch.optim.AdamW(weight_decay=wd)``).
"""

from __future__ import annotations

from typing import Any

from pskv.optimizer import _math
from pskv.optimizer._validate import as_bool, as_float
from pskv.optimizer.base import Array, Optimizer
from pskv.optimizer.registry import register

__all__ = ["Adam", "AdamW"]


def _adam_step(
    weight: Array,
    g: Array,
    m: Array,
    v: Array,
    lr: float,
    t: int,
    beta1: float,
    beta2: float,
    epsilon: float,
    correct_bias: bool,
) -> None:
    m *= beta1
    m += (1.0 - beta1) * g
    v *= beta2
    v += (1.0 - beta2) * (g * g)
    if correct_bias:
        step_size = lr / (1.0 - beta1**t)
        denom = _math.sqrt(v) / (1.0 - beta2**t) ** 0.5 + epsilon
    else:
        step_size = lr
        denom = _math.sqrt(v) + epsilon
    weight -= step_size * (m / denom)


@register
class Adam(Optimizer):
    """Adam with L2 weight decay (MXNet ``adam``).

    Args:
        beta1: decay of the first moment, in ``[0, 1)``.
        beta2: decay of the second moment, in ``[0, 1)``.
        epsilon: added to the bias-corrected root of the second moment (> 0).
        **kwargs: common hyperparameters of :class:`~pskv.optimizer.Optimizer`
            (default ``learning_rate`` 0.001).

    Raises:
        InvalidArgumentError: a hyperparameter is out of range.
    """

    default_learning_rate = 0.001

    def __init__(self, *, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = type(self).__name__
        self.beta1 = as_float(owner, "beta1", beta1, ge=0.0, lt=1.0)
        self.beta2 = as_float(owner, "beta2", beta2, ge=0.0, lt=1.0)
        self.epsilon = as_float(owner, "epsilon", epsilon, gt=0.0)

    def _state_names(self) -> tuple[str, ...]:
        return ("mean", "var")

    def _params(self) -> dict[str, Any]:
        return {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon}

    def _step(self, weight: Array, grad: Array, state: tuple[Array, ...], lr: float, wd: float, t: int) -> None:
        g = grad + wd * weight if wd != 0.0 else grad
        _adam_step(weight, g, state[0], state[1], lr, t, self.beta1, self.beta2, self.epsilon, True)


@register
class AdamW(Optimizer):
    """Adam with decoupled weight decay (MXNet 2 ``adamw``, ``torch.optim.AdamW``).

    Args:
        beta1: decay of the first moment, in ``[0, 1)``.
        beta2: decay of the second moment, in ``[0, 1)``.
        epsilon: added to the (bias-corrected) root of the second moment (> 0);
            MXNet's default 1e-6.
        correct_bias: apply Adam's bias correction (MXNet's ``correct_bias``).
        **kwargs: common hyperparameters of :class:`~pskv.optimizer.Optimizer`
            (default ``learning_rate`` 0.001; ``wd`` is the decoupled decay).

    Raises:
        InvalidArgumentError: a hyperparameter is out of range.
    """

    default_learning_rate = 0.001

    def __init__(
        self,
        *,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-6,
        correct_bias: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        owner = type(self).__name__
        self.beta1 = as_float(owner, "beta1", beta1, ge=0.0, lt=1.0)
        self.beta2 = as_float(owner, "beta2", beta2, ge=0.0, lt=1.0)
        self.epsilon = as_float(owner, "epsilon", epsilon, gt=0.0)
        self.correct_bias = as_bool(owner, "correct_bias", correct_bias)

    def _state_names(self) -> tuple[str, ...]:
        return ("mean", "var")

    def _params(self) -> dict[str, Any]:
        return {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon, "correct_bias": self.correct_bias}

    def _step(self, weight: Array, grad: Array, state: tuple[Array, ...], lr: float, wd: float, t: int) -> None:
        if wd != 0.0:
            weight *= 1.0 - lr * wd
        _adam_step(weight, grad, state[0], state[1], lr, t, self.beta1, self.beta2, self.epsilon, self.correct_bias)
