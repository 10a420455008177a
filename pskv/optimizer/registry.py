"""The optimizer registry: lower-cased class name -> class, and ``create(name, **kwargs)``.

Kept apart from :mod:`pskv.optimizer.base` so the base module stays about the rules;
``register`` imports the base class lazily because the base class imports this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from pskv.errors import InvalidArgumentError
from pskv.optimizer._validate import construct

if TYPE_CHECKING:
    from pskv.optimizer.base import Optimizer

__all__ = ["register", "registered_names", "registered_class", "lookup", "create"]

_REGISTRY: dict[str, type[Optimizer]] = {}
_T = TypeVar("_T", bound="type[Optimizer]")


def register(cls: _T) -> _T:
    """Class decorator: register an optimizer under its lower-cased class name.

    Registering the same class again (e.g. after a module reload) replaces it.

    Args:
        cls: an :class:`~pskv.optimizer.Optimizer` subclass.

    Raises:
        InvalidArgumentError: ``cls`` is not an Optimizer subclass, or a different
            class already holds the name.
    """
    from pskv.optimizer.base import Optimizer

    if not (isinstance(cls, type) and issubclass(cls, Optimizer)):
        raise InvalidArgumentError(f"only Optimizer subclasses can be registered, got {cls!r}")
    name = cls.__name__.lower()
    old = _REGISTRY.get(name)
    if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        raise InvalidArgumentError(
            f"optimizer name {name!r} is already registered by {old.__module__}.{old.__qualname__}"
        )
    cls.name = name
    _REGISTRY[name] = cls
    return cls


def registered_names() -> list[str]:
    """Names of all registered optimizers, sorted."""
    return sorted(_REGISTRY)


def registered_class(name: str) -> type[Optimizer] | None:
    """The class registered under exactly ``name``, or ``None``."""
    return _REGISTRY.get(name)


def lookup(name: Any) -> type[Optimizer]:
    """The class registered under ``name`` (case-insensitive).

    Args:
        name: an optimizer name such as ``"sgd"`` or ``"Adam"``.

    Raises:
        InvalidArgumentError: no such name (the message lists the known ones).
    """
    cls = _REGISTRY.get(name.lower()) if isinstance(name, str) else None
    if cls is None:
        raise InvalidArgumentError(f"unknown optimizer {name!r}; known: {', '.join(registered_names())}")
    return cls


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
