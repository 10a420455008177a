"""Stochastic gradient descent with (Nesterov) momentum.

Both rules match ``torch.optim.SGD`` (``dampening=0``) exactly:

* ``g = grad + wd * w`` (L2 weight decay, added to the gradient),
* SGD: ``buf = momentum * buf + g; w -= lr * buf`` (``w -= lr * g`` without momentum),
* NAG: ``buf = momentum * buf + g; w -= lr * (g + momentum * buf)``.

The momentum buffer holds the un-scaled velocity (PyTorch's convention). MXNet's
buffer holds ``-lr * buf`` instead; the two agree whenever the learning rate is
constant and differ only in how a *changing* rate affects past velocity.
"""

from __future__ import annotations

from typing import Any

from pskv.optimizer._validate import as_float
from pskv.optimizer.base import Array, Optimizer
from pskv.optimizer.registry import register

__all__ = ["SGD", "NAG"]


@register
class SGD(Optimizer):
    """SGD with optional momentum and L2 weight decay (MXNet ``sgd``).

    Args:
        momentum: momentum factor in ``[0, 1)``; 0 keeps no state.
        **kwargs: common hyperparameters of :class:`~pskv.optimizer.Optimizer`
            (default ``learning_rate`` 0.01).

    Raises:
        InvalidArgumentError: a hyperparameter is out of range.
    """

    default_learning_rate = 0.01

    def __init__(self, *, momentum: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.momentum = as_float(type(self).__name__, "momentum", momentum, ge=0.0, lt=1.0)

    def _state_names(self) -> tuple[str, ...]:
        return ("momentum",) if self.momentum > 0.0 else ()

    def _params(self) -> dict[str, Any]:
        return {"momentum": self.momentum}

    def _step(self, weight: Array, grad: Array, state: tuple[Array, ...], lr: float, wd: float, t: int) -> None:
        g = grad + wd * weight if wd != 0.0 else grad
        if state:
            buf = state[0]
            buf *= self.momentum
            buf += g
            g = buf
        weight -= lr * g


@register
class NAG(SGD):
    """SGD with Nesterov momentum (MXNet ``nag``; ``torch.optim.SGD(nesterov=True)``).

    Args:
        momentum: momentum factor in ``[0, 1)``; 0 makes this plain SGD.
        **kwargs: common hyperparameters of :class:`~pskv.optimizer.Optimizer`
            (default ``learning_rate`` 0.01).

    Raises:
        InvalidArgumentError: a hyperparameter is out of range.
    """

    def _step(self, weight: Array, grad: Array, state: tuple[Array, ...], lr: float, wd: float, t: int) -> None:
        g = grad + wd * weight if wd != 0.0 else grad
        if state:
            buf = state[0]
            buf *= self.momentum
            buf += g
            g = g + self.momentum * buf
        weight -= lr * g
