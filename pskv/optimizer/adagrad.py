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

import numpy as np

from pskv.errors import InvalidArgumentError
from pskv.optimizer import _math
from pskv.optimizer._scratch import NumpyScratch, TorchScratch
from pskv.optimizer._validate import as_float
from pskv.optimizer.base import Array, Optimizer, register

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

    _rule_uses_count = False
    default_lazy_update = True
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

    def _numpy_rule(
        self, weight: Array, g: Array, state: tuple[Array, ...], lr: float, wd: float, t: int, scratch: NumpyScratch
    ) -> None:
        s1 = scratch(1)
        if wd != 0.0:  # g + wd * weight, into slot 0
            s0 = scratch(0)
            np.multiply(weight, wd, out=s1)
            np.add(g, s1, out=s0)
            g = s0
        history = state[0]
        np.multiply(g, g, out=s1)
        history += s1
        np.sqrt(history, out=s1)
        np.add(s1, self.eps, out=s1)
        np.divide(g, s1, out=s1)
        np.multiply(s1, lr, out=s1)
        weight -= s1

    def _torch_rule(
        self,
        weights: list[Array],
        g: list[Array],
        scale: float,
        states: list[tuple[Array, ...]],
        lr: float,
        wd: float,
        t: int,
        scratch: TorchScratch,
    ) -> None:
        torch = _math.torch_ops()
        if wd != 0.0:  # scale * g + wd * w, into slot 0
            s0 = scratch(0)
            _math.mul_into(s0, g, scale)
            torch._foreach_add_(s0, weights, alpha=wd)
            g, scale = s0, 1.0
        history = [st[0] for st in states]
        torch._foreach_addcmul_(history, g, g, value=scale * scale)
        denom = scratch(1)
        _math.sqrt_into(denom, history)
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(weights, g, denom, value=-lr * scale)
