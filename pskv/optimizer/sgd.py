"""Stochastic gradient descent with (Nesterov) momentum.

Both rules match ``torch.optim.SGD`` (``dampening=0``) exactly:

* ``g = grad + wd * w`` (L2 weight decay, added to the gradient),
* SGD: ``buf = momentum * buf + g; w -= lr * buf`` (``w -= lr * g`` without momentum),
* NAG: ``buf = momentum * buf + g; w -= lr * (g + momentum * buf)``.

The momentum buffer holds the un-scaled velocity (PyTorch's convention). MXNet's
buffer holds ``-lr * buf`` instead; the two agree whenever the learning rate is
constant and differ only in how a *changing* rate affects past velocity.

On torch tensors the decay and rescale factors are folded into fused steps
(``buf.mul_(momentum).add_(grad, alpha=rescale).add_(w, alpha=wd)``;
``w.add_(buf, alpha=-lr)``); NAG's ``w -= lr * (g + momentum * buf)`` becomes
``w *= 1 - lr * wd; w -= lr * rescale * grad; w -= lr * momentum * buf``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pskv.optimizer import _math
from pskv.optimizer._scratch import NumpyScratch, TorchScratch
from pskv.optimizer._validate import as_float
from pskv.optimizer.base import Array, Optimizer, register

__all__ = ["SGD", "NAG"]


def _numpy_l2(weight: Array, g: Array, wd: float, scratch: NumpyScratch) -> Array:
    """``g + wd * weight`` in scratch slot 0 (``g`` itself when ``wd`` is 0); uses slot 1."""
    if wd == 0.0:
        return g
    s1, s0 = scratch(1), scratch(0)
    np.multiply(weight, wd, out=s1)
    np.add(g, s1, out=s0)
    return s0


def _torch_plain_sgd(weights: list[Array], g: list[Array], scale: float, lr: float, wd: float) -> None:
    """``w -= lr * (scale * g + wd * w)`` for every tensor of the list."""
    torch = _math.torch_ops()
    if wd != 0.0:
        torch._foreach_mul_(weights, 1.0 - lr * wd)
    torch._foreach_add_(weights, g, alpha=-lr * scale)


def _torch_velocity(
    weights: list[Array], g: list[Array], scale: float, bufs: list[Array], momentum: float, wd: float
) -> None:
    """``buf = momentum * buf + scale * g + wd * w`` for every tensor of the list."""
    torch = _math.torch_ops()
    torch._foreach_mul_(bufs, momentum)
    torch._foreach_add_(bufs, g, alpha=scale)
    if wd != 0.0:
        torch._foreach_add_(bufs, weights, alpha=wd)


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

    _rule_uses_count = False
    default_lazy_update = True
    default_learning_rate = 0.01

    def __init__(self, *, momentum: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.momentum = as_float(type(self).__name__, "momentum", momentum, ge=0.0, lt=1.0)

    def _state_names(self) -> tuple[str, ...]:
        return ("momentum",) if self.momentum > 0.0 else ()

    def _params(self) -> dict[str, Any]:
        return {"momentum": self.momentum}

    def _numpy_rule(
        self, weight: Array, g: Array, state: tuple[Array, ...], lr: float, wd: float, t: int, scratch: NumpyScratch
    ) -> None:
        g = _numpy_l2(weight, g, wd, scratch)
        if state:
            buf = state[0]
            buf *= self.momentum
            buf += g
            g = buf
        s0 = scratch(0)  # g is consumed below element by element (it may be slot 0)
        np.multiply(g, lr, out=s0)
        weight -= s0

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
        if not states[0]:
            _torch_plain_sgd(weights, g, scale, lr, wd)
            return
        bufs = [st[0] for st in states]
        _torch_velocity(weights, g, scale, bufs, self.momentum, wd)
        _math.torch_ops()._foreach_add_(weights, bufs, alpha=-lr)


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

    def _numpy_rule(
        self, weight: Array, g: Array, state: tuple[Array, ...], lr: float, wd: float, t: int, scratch: NumpyScratch
    ) -> None:
        g = _numpy_l2(weight, g, wd, scratch)
        s0 = scratch(0)
        if state:
            buf = state[0]
            buf *= self.momentum
            buf += g
            s1 = scratch(1)
            np.multiply(buf, self.momentum, out=s1)
            np.add(g, s1, out=s0)  # g + momentum * buf
            g = s0
        np.multiply(g, lr, out=s0)
        weight -= s0

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
        if not states[0]:
            _torch_plain_sgd(weights, g, scale, lr, wd)
            return
        torch = _math.torch_ops()
        bufs = [st[0] for st in states]
        _torch_velocity(weights, g, scale, bufs, self.momentum, wd)  # reads the old weights
        _torch_plain_sgd(weights, g, scale, lr, wd)
        torch._foreach_add_(weights, bufs, alpha=-lr * self.momentum)
