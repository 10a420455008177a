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

On torch tensors the last line is computed as
``w.addcdiv_(m, sqrt(v) + epsilon * sqrt(bc2), value=-(lr / bc1) * sqrt(bc2))``, the same
value with one pass fewer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pskv.optimizer import _math
from pskv.optimizer._scratch import NumpyScratch, TorchScratch
from pskv.optimizer._validate import as_bool, as_float
from pskv.optimizer.base import Array, Optimizer, register

__all__ = ["Adam", "AdamW"]


def _numpy_adam(
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
    scratch: NumpyScratch,
) -> None:
    """The Adam step on NumPy arrays (``g`` read-only, or scratch slot 0; uses slots 0 and 1)."""
    s1 = scratch(1)
    m *= beta1
    np.multiply(g, 1.0 - beta1, out=s1)
    m += s1
    v *= beta2
    np.multiply(g, g, out=s1)
    np.multiply(s1, 1.0 - beta2, out=s1)
    v += s1
    denom = scratch(0)  # g is no longer read
    np.sqrt(v, out=denom)
    if correct_bias:
        step_size = lr / (1.0 - beta1**t)
        np.divide(denom, (1.0 - beta2**t) ** 0.5, out=denom)
    else:
        step_size = lr
    np.add(denom, epsilon, out=denom)
    np.divide(m, denom, out=denom)
    np.multiply(denom, step_size, out=denom)
    weight -= denom


def _torch_adam(
    weights: list[Array],
    g: list[Array],
    scale: float,
    states: list[tuple[Array, ...]],
    lr: float,
    t: int,
    beta1: float,
    beta2: float,
    epsilon: float,
    correct_bias: bool,
    scratch: TorchScratch,
) -> None:
    """The Adam step on a list of tensors (gradient ``scale * g``; uses scratch slot 0)."""
    torch = _math.torch_ops()
    ms = [st[0] for st in states]
    vs = [st[1] for st in states]
    torch._foreach_mul_(ms, beta1)
    torch._foreach_add_(ms, g, alpha=(1.0 - beta1) * scale)
    torch._foreach_mul_(vs, beta2)
    torch._foreach_addcmul_(vs, g, g, value=(1.0 - beta2) * scale * scale)
    if correct_bias:
        root_bc2 = (1.0 - beta2**t) ** 0.5
        step_size = lr / (1.0 - beta1**t)
    else:
        root_bc2, step_size = 1.0, lr
    denom = scratch(0)  # g is no longer read
    _math.sqrt_into(denom, vs)
    # m / (sqrt(v) / root_bc2 + eps) == root_bc2 * m / (sqrt(v) + eps * root_bc2)
    torch._foreach_add_(denom, epsilon * root_bc2)
    torch._foreach_addcdiv_(weights, ms, denom, value=-step_size * root_bc2)


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

    default_lazy_update = True
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

    def _numpy_rule(
        self, weight: Array, g: Array, state: tuple[Array, ...], lr: float, wd: float, t: int, scratch: NumpyScratch
    ) -> None:
        if wd != 0.0:  # g + wd * weight, into slot 0
            s1, s0 = scratch(1), scratch(0)
            np.multiply(weight, wd, out=s1)
            np.add(g, s1, out=s0)
            g = s0
        _numpy_adam(weight, g, state[0], state[1], lr, t, self.beta1, self.beta2, self.epsilon, True, scratch)

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
        if wd != 0.0:  # the squared gradient needs scale * g + wd * w itself: into slot 0
            s0 = scratch(0)
            _math.mul_into(s0, g, scale)
            _math.torch_ops()._foreach_add_(s0, weights, alpha=wd)
            g, scale = s0, 1.0
        _torch_adam(weights, g, scale, states, lr, t, self.beta1, self.beta2, self.epsilon, True, scratch)


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

    default_lazy_update = True
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

    def _numpy_rule(
        self, weight: Array, g: Array, state: tuple[Array, ...], lr: float, wd: float, t: int, scratch: NumpyScratch
    ) -> None:
        if wd != 0.0:
            weight *= 1.0 - lr * wd
        args = (self.beta1, self.beta2, self.epsilon, self.correct_bias)
        _numpy_adam(weight, g, state[0], state[1], lr, t, *args, scratch)

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
        if wd != 0.0:
            _math.torch_ops()._foreach_mul_(weights, 1.0 - lr * wd)
        args = (self.beta1, self.beta2, self.epsilon, self.correct_bias)
        _torch_adam(weights, g, scale, states, lr, t, *args, scratch)
