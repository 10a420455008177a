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

import numpy as np

from pskv.optimizer import _math
from pskv.optimizer._scratch import NumpyScratch, TorchScratch
from pskv.optimizer._validate import as_float
from pskv.optimizer.base import Array, Optimizer, register

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

    default_lazy_update = True
    _rule_uses_count = False
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

    def _numpy_rule(
        self, weight: Array, g: Array, state: tuple[Array, ...], lr: float, wd: float, t: int, scratch: NumpyScratch
    ) -> None:
        z, n = state
        g2, a, b = scratch(1), scratch(2), scratch(3)
        np.multiply(g, g, out=g2)
        # z += g - (sqrt(n + g2) - sqrt(n)) * weight / lr
        np.add(n, g2, out=a)
        np.sqrt(a, out=a)
        np.sqrt(n, out=b)
        np.subtract(a, b, out=a)
        np.multiply(a, weight, out=a)
        np.divide(a, lr, out=a)
        np.subtract(g, a, out=a)
        z += a
        n += g2
        # new = (sign(z) * lamda1 - z) / ((beta + sqrt(n)) / lr + wd)
        np.sign(z, out=a)
        np.multiply(a, self.lamda1, out=a)
        np.subtract(a, z, out=a)
        np.sqrt(n, out=b)
        np.add(b, self.beta, out=b)
        np.divide(b, lr, out=b)
        np.add(b, wd, out=b)
        np.divide(a, b, out=a)
        # weight = new where |z| > lamda1, else 0
        mask = scratch(1, np.bool_)
        np.abs(z, out=b)
        np.greater(b, self.lamda1, out=mask)
        np.copyto(weight, a, where=mask)
        np.logical_not(mask, out=mask)
        np.copyto(weight, 0.0, where=mask)

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
        if scale != 1.0:  # the rule needs the gradient itself: into slot 0
            s0 = scratch(0)
            _math.mul_into(s0, g, scale)
            g = s0
        g2s, as_, bs, masks = scratch(1), scratch(2), scratch(3), scratch(4, torch.bool)
        for w, gi, (z, n), g2, a, b, mask in zip(weights, g, states, g2s, as_, bs, masks, strict=True):
            torch.mul(gi, gi, out=g2)
            torch.add(n, g2, out=a).sqrt_()
            torch.sqrt(n, out=b)
            a.sub_(b).mul_(w).div_(lr)
            torch.sub(gi, a, out=a)
            z.add_(a)
            n.add_(g2)
            torch.sign(z, out=a).mul_(self.lamda1).sub_(z)
            torch.sqrt(n, out=b).add_(self.beta).div_(lr).add_(wd)
            a.div_(b)
            torch.abs(z, out=b)
            torch.gt(b, self.lamda1, out=mask)
            w.copy_(a)
            w.masked_fill_(mask.logical_not_(), 0.0)


FTRL = Ftrl
