"""Learning-rate schedulers with MXNet's names, parameters and formulas.

A scheduler maps the optimizer's update count ``num_update`` to a learning rate.
Unlike MXNet's, these schedulers are *stateless*: the rate is a pure function of
``num_update`` and the parameters, so calling them out of order, or after a restore,
gives the same answer, and ``to_config`` captures everything.

Warmup (all schedulers): for ``num_update < warmup_steps`` the rate is
``warmup_begin_lr + (base_lr - warmup_begin_lr) * num_update / warmup_steps``
(``'linear'``) or ``warmup_begin_lr`` (``'constant'``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from pskv._registry import Registry
from pskv.errors import InvalidArgumentError
from pskv.optimizer._validate import as_float, as_int, construct

__all__ = [
    "LRScheduler",
    "FactorScheduler",
    "MultiFactorScheduler",
    "PolyScheduler",
    "CosineScheduler",
    "scheduler_names",
]

#: Scheduler classes by config name (the re-registration rule: pskv._registry).
SCHEDULERS: Registry[type[LRScheduler]] = Registry("lr scheduler")


def scheduler_names() -> list[str]:
    """Config names of the registered schedulers, sorted."""
    return SCHEDULERS.names()


class LRScheduler:
    """Base class: warmup handling, ``base_lr`` and config round trip.

    Subclasses set ``config_name`` and implement :meth:`_after_warmup` and
    :meth:`_params`.

    Args:
        base_lr: the rate after warmup (an optimizer overwrites it with its own
            ``learning_rate``).
        warmup_steps: number of warmup updates (0 = no warmup).
        warmup_begin_lr: the rate at update 0 of the warmup.
        warmup_mode: ``'linear'`` or ``'constant'``.

    Raises:
        InvalidArgumentError: a parameter is out of range.
    """

    config_name: ClassVar[str] = ""

    def __init__(
        self,
        base_lr: float = 0.01,
        warmup_steps: int = 0,
        warmup_begin_lr: float = 0.0,
        warmup_mode: str = "linear",
    ) -> None:
        owner = type(self).__name__
        self.base_lr = as_float(owner, "base_lr", base_lr, ge=0.0)
        self.warmup_steps = as_int(owner, "warmup_steps", warmup_steps, ge=0)
        self.warmup_begin_lr = as_float(owner, "warmup_begin_lr", warmup_begin_lr, ge=0.0, le=self.base_lr)
        if warmup_mode not in ("linear", "constant"):
            raise InvalidArgumentError(f"{owner}: warmup_mode must be 'linear' or 'constant', got {warmup_mode!r}")
        self.warmup_mode = warmup_mode

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.config_name:
            SCHEDULERS.add(cls.config_name, cls)

    def get_warmup_lr(self, num_update: int) -> float:
        """The warmup rate at ``num_update`` (meaningful for ``num_update < warmup_steps``)."""
        if self.warmup_mode == "constant":
            return self.warmup_begin_lr
        return self.warmup_begin_lr + (self.base_lr - self.warmup_begin_lr) * num_update / self.warmup_steps

    def __call__(self, num_update: int) -> float:
        """The learning rate for update number ``num_update``."""
        if num_update < self.warmup_steps:
            return self.get_warmup_lr(num_update)
        return self._after_warmup(num_update)

    def _after_warmup(self, num_update: int) -> float:
        raise NotImplementedError

    def _params(self) -> dict[str, Any]:
        return {
            "base_lr": self.base_lr,
            "warmup_steps": self.warmup_steps,
            "warmup_begin_lr": self.warmup_begin_lr,
            "warmup_mode": self.warmup_mode,
        }

    def to_config(self) -> dict[str, Any]:
        """JSON-safe ``{"name": ..., "params": {...}}`` rebuilding this scheduler.

        Raises:
            InvalidArgumentError: the class has no registered ``config_name``.
        """
        if SCHEDULERS.get(self.config_name) is not type(self):
            raise InvalidArgumentError(f"{type(self).__name__} is not a registered scheduler; cannot build a config")
        return {"name": self.config_name, "params": self._params()}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> LRScheduler:
        """Rebuild a scheduler from :meth:`to_config` output.

        Args:
            config: ``{"name": <config name>, "params": {...}}``.

        Raises:
            InvalidArgumentError: malformed config, unknown name or invalid parameters.
        """
        if not isinstance(config, Mapping) or set(config) != {"name", "params"}:
            raise InvalidArgumentError(f"a scheduler config is a dict with keys 'name' and 'params', got {config!r}")
        name, params = config["name"], config["params"]
        sched_cls = SCHEDULERS.get(name.lower()) if isinstance(name, str) else None
        if sched_cls is None:
            raise InvalidArgumentError(f"unknown lr scheduler {name!r}; known: {', '.join(scheduler_names())}")
        return construct(f"scheduler {name!r}", sched_cls, params)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._params().items())
        return f"{type(self).__name__}({args})"


class FactorScheduler(LRScheduler):
    """Multiply the rate by ``factor`` every ``step`` updates, never below ``stop_factor_lr``.

    ``lr(n) = base_lr * factor ** k`` with ``k = max(0, (n - 1) // step)`` (so the
    first decay applies from update ``step + 1``, as in MXNet), clamped from below by
    ``stop_factor_lr`` once ``k >= 1``.

    Args:
        step: updates between two decays (>= 1).
        factor: decay factor in ``[0, 1]``.
        stop_factor_lr: the rate never decays below this.
        base_lr: see :class:`LRScheduler`.
        warmup_steps: see :class:`LRScheduler`.
        warmup_begin_lr: see :class:`LRScheduler`.
        warmup_mode: see :class:`LRScheduler`.

    Raises:
        InvalidArgumentError: a parameter is out of range.
    """

    config_name = "factor"

    def __init__(
        self,
        step: int,
        factor: float = 1.0,
        stop_factor_lr: float = 1e-8,
        base_lr: float = 0.01,
        warmup_steps: int = 0,
        warmup_begin_lr: float = 0.0,
        warmup_mode: str = "linear",
    ) -> None:
        super().__init__(base_lr, warmup_steps, warmup_begin_lr, warmup_mode)
        self.step = as_int("FactorScheduler", "step", step, ge=1)
        self.factor = as_float("FactorScheduler", "factor", factor, ge=0.0, le=1.0)
        self.stop_factor_lr = as_float("FactorScheduler", "stop_factor_lr", stop_factor_lr, ge=0.0)

    def _after_warmup(self, num_update: int) -> float:
        k = max(0, (num_update - 1) // self.step)
        if k == 0:
            return self.base_lr
        return max(self.base_lr * self.factor**k, self.stop_factor_lr)

    def _params(self) -> dict[str, Any]:
        return {"step": self.step, "factor": self.factor, "stop_factor_lr": self.stop_factor_lr, **super()._params()}


class MultiFactorScheduler(LRScheduler):
    """Multiply the rate by ``factor`` once past each update count listed in ``step``.

    ``lr(n) = base_lr * factor ** (number of s in step with n > s)``.

    Args:
        step: strictly increasing update counts (each >= 1).
        factor: decay factor in ``[0, 1]``.
        base_lr: see :class:`LRScheduler`.
        warmup_steps: see :class:`LRScheduler`.
        warmup_begin_lr: see :class:`LRScheduler`.
        warmup_mode: see :class:`LRScheduler`.

    Raises:
        InvalidArgumentError: ``step`` is empty or not increasing, or a parameter is out of range.
    """

    config_name = "multifactor"

    def __init__(
        self,
        step: Sequence[int],
        factor: float = 1.0,
        base_lr: float = 0.01,
        warmup_steps: int = 0,
        warmup_begin_lr: float = 0.0,
        warmup_mode: str = "linear",
    ) -> None:
        super().__init__(base_lr, warmup_steps, warmup_begin_lr, warmup_mode)
        if isinstance(step, (str, bytes)) or not isinstance(step, Sequence) or not step:
            raise InvalidArgumentError(f"MultiFactorScheduler: step must be a non-empty list of ints, got {step!r}")
        steps = [as_int("MultiFactorScheduler", "step", s, ge=1) for s in step]
        if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
            raise InvalidArgumentError(f"MultiFactorScheduler: step must be strictly increasing, got {step!r}")
        self.step = steps
        self.factor = as_float("MultiFactorScheduler", "factor", factor, ge=0.0, le=1.0)

    def _after_warmup(self, num_update: int) -> float:
        k = sum(1 for s in self.step if num_update > s)
        return self.base_lr * self.factor**k

    def _params(self) -> dict[str, Any]:
        return {"step": list(self.step), "factor": self.factor, **super()._params()}


class _DecayToFinal(LRScheduler):
    """Shared parameters of the schedulers that decay to ``final_lr`` at ``max_update``."""

    def _init_decay(self, max_update: int, final_lr: float) -> None:
        owner = type(self).__name__
        self.max_update = as_int(owner, "max_update", max_update, ge=1)
        if self.warmup_steps >= self.max_update:
            raise InvalidArgumentError(
                f"{owner}: warmup_steps ({self.warmup_steps}) must be < max_update ({self.max_update})"
            )
        self.final_lr = as_float(owner, "final_lr", final_lr, ge=0.0)

    def _progress(self, num_update: int) -> float:
        return (num_update - self.warmup_steps) / (self.max_update - self.warmup_steps)


class PolyScheduler(_DecayToFinal):
    """Polynomial decay from ``base_lr`` to ``final_lr`` over ``max_update`` updates.

    ``lr(n) = final_lr + (base_lr - final_lr) * (1 - (n - w) / (max_update - w)) ** pwr``
    for ``w <= n <= max_update`` (``w = warmup_steps``), ``final_lr`` afterwards.

    Args:
        max_update: the update at which ``final_lr`` is reached (> warmup_steps).
        base_lr: see :class:`LRScheduler`.
        pwr: the power (> 0).
        final_lr: the rate after ``max_update``.
        warmup_steps: see :class:`LRScheduler`.
        warmup_begin_lr: see :class:`LRScheduler`.
        warmup_mode: see :class:`LRScheduler`.

    Raises:
        InvalidArgumentError: a parameter is out of range.
    """

    config_name = "poly"

    def __init__(
        self,
        max_update: int,
        base_lr: float = 0.01,
        pwr: float = 2,
        final_lr: float = 0.0,
        warmup_steps: int = 0,
        warmup_begin_lr: float = 0.0,
        warmup_mode: str = "linear",
    ) -> None:
        super().__init__(base_lr, warmup_steps, warmup_begin_lr, warmup_mode)
        self._init_decay(max_update, final_lr)
        self.pwr = as_float("PolyScheduler", "pwr", pwr, gt=0.0)

    def _after_warmup(self, num_update: int) -> float:
        if num_update > self.max_update:
            return self.final_lr
        decay: float = (1.0 - self._progress(num_update)) ** self.pwr
        return self.final_lr + (self.base_lr - self.final_lr) * decay

    def _params(self) -> dict[str, Any]:
        return {"max_update": self.max_update, "pwr": self.pwr, "final_lr": self.final_lr, **super()._params()}


class CosineScheduler(_DecayToFinal):
    """Cosine decay from ``base_lr`` to ``final_lr`` over ``max_update`` updates.

    ``lr(n) = final_lr + (base_lr - final_lr) * (1 + cos(pi * (n - w) / (max_update - w))) / 2``
    for ``w <= n <= max_update`` (``w = warmup_steps``), ``final_lr`` afterwards.

    Args:
        max_update: the update at which ``final_lr`` is reached (> warmup_steps).
        base_lr: see :class:`LRScheduler`.
        final_lr: the rate after ``max_update``.
        warmup_steps: see :class:`LRScheduler`.
        warmup_begin_lr: see :class:`LRScheduler`.
        warmup_mode: see :class:`LRScheduler`.

    Raises:
        InvalidArgumentError: a parameter is out of range.
    """

    config_name = "cosine"

    def __init__(
        self,
        max_update: int,
        base_lr: float = 0.01,
        final_lr: float = 0.0,
        warmup_steps: int = 0,
        warmup_begin_lr: float = 0.0,
        warmup_mode: str = "linear",
    ) -> None:
        super().__init__(base_lr, warmup_steps, warmup_begin_lr, warmup_mode)
        self._init_decay(max_update, final_lr)

    def _after_warmup(self, num_update: int) -> float:
        if num_update > self.max_update:
            return self.final_lr
        return (
            self.final_lr + (self.base_lr - self.final_lr) * (1.0 + math.cos(math.pi * self._progress(num_update))) / 2
        )

    def _params(self) -> dict[str, Any]:
        return {"max_update": self.max_update, "final_lr": self.final_lr, **super()._params()}
