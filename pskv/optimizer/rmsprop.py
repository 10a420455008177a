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

from pskv.errors import InvalidArgumentError
from pskv.optimizer import _math
from pskv.optimizer._validate import as_bool, as_float, as_optional_float
from pskv.optimizer.base import Array, Optimizer
from pskv.optimizer.registry import register

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

    def _step(self, weight: Array, grad: Array, state: tuple[Array, ...], lr: float, wd: float, t: int) -> None:
        g = grad + wd * weight if wd != 0.0 else grad
        var = state[0]
        var *= self.rho
        var += (1.0 - self.rho) * (g * g)
        if self.centered:
            mean = state[1]
            mean *= self.rho
            mean += (1.0 - self.rho) * g
            denom = _math.sqrt(var - mean * mean) + self.epsilon
        else:
            denom = _math.sqrt(var) + self.epsilon
        if self.momentum > 0.0:
            mom = state[-1]
            mom *= self.momentum
            mom += g / denom
            weight -= lr * mom
        else:
            weight -= lr * (g / denom)
        if self.clip_weights is not None:
            _math.assign(weight, _math.clip(weight, -self.clip_weights, self.clip_weights))
