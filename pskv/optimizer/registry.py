"""The optimizer registry: lower-cased class name -> class, and ``create(name, **kwargs)``.

Kept apart from :mod:`pskv.optimizer.base` so the base module stays about the rules.
:func:`pskv.optimizer.base.register` (which checks that a class is an optimizer) adds
to :data:`OPTIMIZERS`; this module only reads it, so it needs the base class for
typing alone and no import cycle exists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pskv._registry import Registry
from pskv.optimizer._validate import construct

if TYPE_CHECKING:
    from pskv.optimizer.base import Optimizer

__all__ = ["OPTIMIZERS", "registered_names", "registered_class", "lookup", "create"]

#: Every registered optimizer class by lower-cased class name (the rule: pskv._registry).
OPTIMIZERS: Registry[type[Optimizer]] = Registry("optimizer")


def registered_names() -> list[str]:
    """Names of all registered optimizers, sorted."""
    return OPTIMIZERS.names()


def registered_class(name: str) -> type[Optimizer] | None:
    """The class registered under exactly ``name``, or ``None``."""
    return OPTIMIZERS.get(name)


def lookup(name: Any) -> type[Optimizer]:
    """The class registered under ``name`` (case-insensitive).

    Args:
        name: an optimizer name such as ``"sgd"`` or ``"Adam"``.

    Raises:
        InvalidArgumentError: no such name (the message lists the known ones).
    """
    return OPTIMIZERS.lookup(name)


def create(name: str, **kwargs: Any) -> Optimizer:
    """Build a registered optimizer by (case-insensitive) name.

    Args:
        name: e.g. ``"sgd"`` or ``"Adam"``.
        **kwargs: the optimizer's hyperparameters.

    Raises:
        InvalidArgumentError: unknown name (the message lists the known ones), unknown
            or invalid hyperparameters.
    """
    cls = lookup(name)
    return construct(f"optimizer {cls.name!r}", cls, kwargs, cls.aliases)  # type: ignore[no-any-return]
