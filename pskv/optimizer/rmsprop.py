"""RMSProp (plain and centered) in PyTorch's formulation.

::

    g = grad + wd * w                                   (L2 weight decay)
    var = rho * var + (1 - rho) * g * g
    centered:  mean = rho * mean + (1 - rho) * g;  denom = sqrt(var - mean * mean) + epsilon
    otherwise: denom = sqrt(var) + epsilon
    momentum > 0:  mom = momentum * mom + g / denom;  w -= lr * mom
    otherwise:     w -= lr * g / denom
    clip_weights:  w = clip(w, -clip_weights, clip_weights)

This equals ``torch.optim.RMSprop(alpha=rho, eps=epsilon, momentum=momentum,
centered=centered)``. MXNet puts ``epsilon`` inside the root and keeps
``-lr * mom`` as its buffer (same result for a constant rate); MXNet's plain
variant has no momentum, which pskv's ``momentum=None`` default reproduces.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pskv.errors import InvalidArgumentError
from pskv.optimizer import _math
from pskv.optimizer._scratch import NumpyScratch, TorchScratch
from pskv.optimizer._validate import as_bool, as_float, as_optional_float
from pskv.optimizer.base import Array, Optimizer, register

__all__ = ["RMSProp"]


def _pick(owner: str, name: str, value: float | None, alias: str, alias_value: float | None) -> float | None:
    if value is not None and alias_value is not None:
        raise InvalidArgumentError(f"{owner}: give {name} or its alias {alias}, not both")
    return value if value is not None else alias_value


@register
class RMSProp(Optimizer):
    """RMSProp (MXNet ``rmsprop``; Tieleman & Hinton, centered variant after Graves 2013).

    Args:
        rho: decay of the moving averages, in ``[0, 1)`` (MXNet 1.x ``gamma1``).
        momentum: momentum factor in ``[0, 1)`` (MXNet 1.x ``gamma2``). ``None``
            means MXNet's behaviour: 0.9 when ``centered`` else 0 (no momentum).
        epsilon: added to the root (> 0).
        centered: normalise by the estimated variance instead of the second moment.
        clip_weights: ``None`` or a bound (> 0) the weights are clipped to after each update.
        gamma1: alias of ``rho`` (MXNet 1.x name).
        gamma2: alias of ``momentum`` (MXNet 1.x name).
        **kwargs: common hyperparameters of :class:`~pskv.optimizer.Optimizer`
            (default ``learning_rate`` 0.001).

    Raises:
        InvalidArgumentError: a hyperparameter is out of range, or a parameter is
            given together with its alias.
    """

    _rule_uses_count = False
    default_learning_rate = 0.001
    aliases = ("gamma1", "gamma2")

    def __init__(
        self,
        *,
        rho: float | None = None,
        momentum: float | None = None,
        epsilon: float = 1e-8,
        centered: bool = False,
        clip_weights: float | None = None,
        gamma1: float | None = None,
        gamma2: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        owner = type(self).__name__
        self.centered = as_bool(owner, "centered", centered)
        rho = _pick(owner, "rho", rho, "gamma1", gamma1)
        momentum = _pick(owner, "momentum", momentum, "gamma2", gamma2)
        self.rho = as_float(owner, "rho", 0.9 if rho is None else rho, ge=0.0, lt=1.0)
        if momentum is None:
            momentum = 0.9 if self.centered else 0.0
        self.momentum = as_float(owner, "momentum", momentum, ge=0.0, lt=1.0)
        self.epsilon = as_float(owner, "epsilon", epsilon, gt=0.0)
        self.clip_weights = as_optional_float(owner, "clip_weights", clip_weights, gt=0.0)

    def _state_names(self) -> tuple[str, ...]:
        names = ("var", "mean") if self.centered else ("var",)
        return (*names, "mom") if self.momentum > 0.0 else names

    def _params(self) -> dict[str, Any]:
        return {
            "rho": self.rho,
            "momentum": self.momentum,
            "epsilon": self.epsilon,
            "centered": self.centered,
            "clip_weights": self.clip_weights,
        }

    def _numpy_rule(
        self, weight: Array, g: Array, state: tuple[Array, ...], lr: float, wd: float, t: int, scratch: NumpyScratch
    ) -> None:
        s1 = scratch(1)
        if wd != 0.0:  # g + wd * weight, into slot 0
            s0 = scratch(0)
            np.multiply(weight, wd, out=s1)
            np.add(g, s1, out=s0)
            g = s0
        rho = self.rho
        var = state[0]
        var *= rho
        np.multiply(g, g, out=s1)
        np.multiply(s1, 1.0 - rho, out=s1)
        var += s1
        if self.centered:
            mean = state[1]
            mean *= rho
            np.multiply(g, 1.0 - rho, out=s1)
            mean += s1
            np.multiply(mean, mean, out=s1)
            np.subtract(var, s1, out=s1)
            np.sqrt(s1, out=s1)
        else:
            np.sqrt(var, out=s1)
        np.add(s1, self.epsilon, out=s1)  # s1 = denom
        np.divide(g, s1, out=s1)
        if self.momentum > 0.0:
            mom = state[-1]
            mom *= self.momentum
            mom += s1
            np.multiply(mom, lr, out=s1)
        else:
            np.multiply(s1, lr, out=s1)
        weight -= s1
        if self.clip_weights is not None:
            np.clip(weight, -self.clip_weights, self.clip_weights, out=weight)

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
        rho = self.rho
        var = [st[0] for st in states]
        torch._foreach_mul_(var, rho)
        torch._foreach_addcmul_(var, g, g, value=(1.0 - rho) * scale * scale)
        denom = scratch(1)
        if self.centered:
            mean = [st[1] for st in states]
            torch._foreach_mul_(mean, rho)
            torch._foreach_add_(mean, g, alpha=(1.0 - rho) * scale)
            torch._foreach_copy_(denom, var)
            torch._foreach_addcmul_(denom, mean, mean, value=-1.0)
            torch._foreach_sqrt_(denom)
        else:
            _math.sqrt_into(denom, var)
        torch._foreach_add_(denom, self.epsilon)
        if self.momentum > 0.0:
            mom = [st[-1] for st in states]
            torch._foreach_mul_(mom, self.momentum)
            torch._foreach_addcdiv_(mom, g, denom, value=scale)
            torch._foreach_add_(weights, mom, alpha=-lr)
        else:
            torch._foreach_addcdiv_(weights, g, denom, value=-lr * scale)
        if self.clip_weights is not None:
            _math.clamp_(weights, -self.clip_weights, self.clip_weights)
