"""Argument checks shared by optimizers and learning-rate schedulers.

Every check raises :class:`~pskv.errors.InvalidArgumentError` naming the owner (the
optimizer or scheduler), the parameter and the rejected value, and returns the value
normalised to a plain Python type so configs stay JSON-safe.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from pskv.errors import InvalidArgumentError, KeyTypeError

__all__ = [
    "as_float",
    "as_int",
    "as_bool",
    "as_optional_float",
    "check_key",
    "check_mult",
    "accepted_params",
    "construct",
    "mult_to_json",
    "mult_from_json",
]


def _fail(owner: str, name: str, value: Any, expectation: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{owner}: {name} must be {expectation}, got {value!r}")


def as_float(
    owner: str,
    name: str,
    value: Any,
    *,
    ge: float | None = None,
    gt: float | None = None,
    lt: float | None = None,
    le: float | None = None,
) -> float:
    """``value`` as a finite ``float`` within the given bounds.

    Args:
        owner: name of the optimizer / scheduler (for the message).
        name: parameter name.
        value: the value to check (int or float; bool is rejected).
        ge: inclusive lower bound.
        gt: exclusive lower bound.
        lt: exclusive upper bound.
        le: inclusive upper bound.

    Raises:
        InvalidArgumentError: not a real number, not finite, or out of bounds.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise _fail(owner, name, value, "a real number")
    v = float(value)
    if not math.isfinite(v):
        raise _fail(owner, name, value, "finite")
    if ge is not None and not v >= ge:
        raise _fail(owner, name, value, f">= {ge}")
    if gt is not None and not v > gt:
        raise _fail(owner, name, value, f"> {gt}")
    if lt is not None and not v < lt:
        raise _fail(owner, name, value, f"< {lt}")
    if le is not None and not v <= le:
        raise _fail(owner, name, value, f"<= {le}")
    return v


def as_optional_float(owner: str, name: str, value: Any, *, gt: float | None = None) -> float | None:
    """``None`` or a finite float greater than ``gt``.

    Args:
        owner: name of the optimizer / scheduler.
        name: parameter name.
        value: ``None`` or a number.
        gt: exclusive lower bound.

    Raises:
        InvalidArgumentError: not None and not a valid number.
    """
    if value is None:
        return None
    return as_float(owner, name, value, gt=gt)


def as_int(owner: str, name: str, value: Any, *, ge: int | None = None) -> int:
    """``value`` as an ``int`` (bool and non-integral floats rejected).

    Args:
        owner: name of the optimizer / scheduler.
        name: parameter name.
        value: the value to check.
        ge: inclusive lower bound.

    Raises:
        InvalidArgumentError: not an integer or below ``ge``.
    """
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise _fail(owner, name, value, "an integer")
    v = int(value.__index__())
    if ge is not None and v < ge:
        raise _fail(owner, name, value, f">= {ge}")
    return v


def as_bool(owner: str, name: str, value: Any) -> bool:
    """``value`` if it is a ``bool``.

    Args:
        owner: name of the optimizer / scheduler.
        name: parameter name.
        value: the value to check.

    Raises:
        InvalidArgumentError: not a bool.
    """
    if not isinstance(value, bool):
        raise _fail(owner, name, value, "True or False")
    return value


def check_key(key: Any) -> int | str:
    """Return ``key`` as a store key: a ``str``, or a plain ``int`` (NumPy integers converted).

    Args:
        key: the key to check.

    Raises:
        KeyTypeError: any other type (``bool`` included).
    """
    if isinstance(key, str):
        return key
    if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
        return int(key)
    raise KeyTypeError(f"keys must be int or str, got {type(key).__name__} {key!r}")


def check_mult(owner: str, name: str, mult: Mapping[Any, Any]) -> dict[int | str, float]:
    """Validate a per-key multiplier dict (``lr_mult`` / ``wd_mult``).

    Args:
        owner: name of the optimizer.
        name: ``"lr_mult"`` or ``"wd_mult"``.
        mult: mapping from store key to a finite, non-negative multiplier.

    Raises:
        InvalidArgumentError: not a mapping, or a multiplier is invalid.
        KeyTypeError: a key is neither int nor str.
    """
    if not isinstance(mult, Mapping):
        raise _fail(owner, name, mult, "a dict from key to multiplier")
    out: dict[int | str, float] = {}
    for k, v in mult.items():
        out[check_key(k)] = as_float(owner, f"{name}[{k!r}]", v, ge=0.0)
    return out


def accepted_params(cls: type) -> list[str]:
    """Keyword parameters accepted by ``cls(...)``, following ``**kwargs`` up the MRO."""
    names: list[str] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        more = False
        for p in inspect.signature(init).parameters.values():
            if p.kind is p.VAR_KEYWORD:
                more = True
            elif p.name != "self" and p.kind is not p.VAR_POSITIONAL and p.name not in names:
                names.append(p.name)
        if not more:
            break
    return names


def construct(what: str, cls: type, params: Any, hidden: tuple[str, ...] = ()) -> Any:
    """``cls(**params)`` after checking ``params`` names against the constructor.

    Args:
        what: description for messages (e.g. ``"optimizer 'sgd'"``).
        cls: the class to build.
        params: the keyword arguments (a mapping with str keys).
        hidden: accepted parameter names not to list in messages (aliases).

    Raises:
        InvalidArgumentError: ``params`` is not a mapping, names an unknown parameter,
            misses a required one, or the constructor rejects a value.
    """
    if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
        raise InvalidArgumentError(f"{what}: params must be a dict with str keys, got {params!r}")
    allowed = accepted_params(cls)
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        shown = ", ".join(n for n in allowed if n not in hidden)
        raise InvalidArgumentError(f"{what}: unknown parameter(s) {', '.join(unknown)}; accepted: {shown}")
    try:
        return cls(**params)
    except TypeError as exc:  # a missing required argument
        if isinstance(exc, KeyTypeError):
            raise
        raise InvalidArgumentError(f"{what}: {exc}") from exc


def mult_to_json(mult: Mapping[int | str, float]) -> list[list[Any]]:
    """Per-key multipliers as ``[[key, multiplier], ...]``, so int and str keys survive JSON."""
    return [[k, v] for k, v in mult.items()]


def mult_from_json(name: str, value: Any) -> dict[int | str, float]:
    """What :func:`mult_to_json` wrote, checked as :func:`check_mult` checks.

    Raises:
        InvalidArgumentError: not a list of ``[key, multiplier]`` pairs, or a bad multiplier.
        KeyTypeError: a key is neither int nor str.
    """
    if not isinstance(value, list) or not all(isinstance(p, list) and len(p) == 2 for p in value):
        raise InvalidArgumentError(f"{name} in a config must be a list of [key, multiplier] pairs, got {value!r}")
    return check_mult("config", name, {p[0]: p[1] for p in value})
