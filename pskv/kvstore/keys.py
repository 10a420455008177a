"""Argument normalisation: MXNet's key / value / out forms to one list of pairs.

Accepted forms (as in MXNet):

* one key and one array: ``push(3, a)``;
* one key and a list of arrays, one per device: ``push(3, [a0, a1])``;
* a list of keys and a list with one entry per key, each an array or a list of
  arrays: ``push([3, 5], [a, [b0, b1]])``.

Keys are ``int`` or ``str``; one store uses one kind (fixed by its first call).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np

from pskv.arrays import Array, is_array
from pskv.arrays.rowsparse import is_row_sparse
from pskv.errors import InvalidArgumentError, KeyTypeError, NotSupportedError, UnsupportedValueError
from pskv.partition import Key

__all__ = ["Array", "Key", "KeyKind", "Keys", "Outs", "Values", "as_key", "as_key_list", "merge_repeats", "pair_up",
           "PUSHPULL_DENSE", "SERVERS_DENSE"]

#: Why a store without row-sparse support refuses a row-sparse value (``byteps``: an all-reduce of dense values).
SERVERS_DENSE = ("this store takes dense values only (the local, device and dist_* stores take row-sparse "
                 "values)")
#: Why pushpull refuses a row-sparse value or out on the stores that take them elsewhere.
PUSHPULL_DENSE = "pushpull takes dense values and outs; push it, then pull or row_sparse_pull"

#: One key or a list of keys (MXNet's forms).
Keys: TypeAlias = Key | Sequence[Key]
#: Per key one array, or a list of arrays (one per device); for a key list, a list of those.
Values: TypeAlias = Array | Sequence[Array] | Sequence[Sequence[Array]]
#: Where pulled values go: the same forms as :data:`Values`.
Outs: TypeAlias = Values


def as_key(key: object) -> Key:
    """Return ``key`` as a plain ``int`` or ``str``.

    Raises:
        KeyTypeError: ``key`` is neither an integer nor a string (bool is rejected).
    """
    if isinstance(key, str):
        return key
    if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
        return int(key)
    raise KeyTypeError(f"keys must be int or str, got {type(key).__qualname__} {key!r}")


def as_key_list(key: object) -> tuple[list[Key], bool]:
    """Normalise ``key`` to a list; the flag says whether a single key was given.

    Raises:
        KeyTypeError: an element is not a valid key, or int and str keys are mixed.
        InvalidArgumentError: an empty key list.
    """
    kind = type(key)
    if kind is int or kind is str:  # the common case first: every keyed call comes here
        return [key], True  # type: ignore[list-item]
    if isinstance(key, (list, tuple)):
        keys = [as_key(k) for k in key]
        if not keys:
            raise InvalidArgumentError("empty key list")
        kinds = {type(k) for k in keys}
        if len(kinds) > 1:
            raise KeyTypeError(f"int and str keys mixed in one call: {keys!r}")
        return keys, False
    return [as_key(key)], True


def _refuse_sparse(key: Key, value: object, what: str, refusal: str | None) -> None:
    if refusal is not None and is_row_sparse(value):
        raise NotSupportedError(f"{what} for key {key!r} is row-sparse: {refusal}")


def _array_list(key: Key, value: object, what: str, refusal: str | None) -> list[Any]:
    kind = type(value)
    if kind is np.ndarray:  # the common cases first: every call of every store comes here
        return [value]
    if kind is list or kind is tuple:
        return _checked_list(key, value, what, refusal)  # type: ignore[arg-type]
    if is_array(value) or is_row_sparse(value):
        _refuse_sparse(key, value, what, refusal)
        return [value]
    if isinstance(value, (list, tuple)):
        return _checked_list(key, value, what, refusal)
    raise UnsupportedValueError(
        f"{what} for key {key!r} must be an array or a list of arrays, "
        f"got {type(value).__module__}.{type(value).__qualname__}"
    )


def _checked_list(key: Key, value: list[Any] | tuple[Any, ...], what: str, refusal: str | None) -> list[Any]:
    """``value``'s arrays (one per device) as a new list, each checked."""
    if not value:
        raise InvalidArgumentError(f"empty {what} list for key {key!r}")
    for v in value:
        if type(v) is np.ndarray:
            continue
        _refuse_sparse(key, v, what, refusal)
        if not is_array(v) and not is_row_sparse(v):
            raise UnsupportedValueError(
                f"{what} for key {key!r} must be numpy.ndarray or torch.Tensor, "
                f"got {type(v).__module__}.{type(v).__qualname__}"
            )
    return list(value)


def pair_up(keys: Sequence[Key], single: bool, values: object, what: str,
            refuse_sparse: str | None = SERVERS_DENSE) -> list[tuple[Key, list[Any]]]:
    """Pair every key with its list of arrays.

    Args:
        keys: normalised keys (from :func:`as_key_list`).
        single: True when the caller passed one key, not a list.
        values: the caller's value / out argument.
        what: argument name for error messages ("value", "out", ...).
        refuse_sparse: why row-sparse values (a RowSparse, a torch sparse COO tensor) are
            refused here; None accepts them.

    Raises:
        InvalidArgumentError: list lengths differ, or a list is empty.
        UnsupportedValueError: an element is not an array.
        NotSupportedError: a row-sparse value where ``refuse_sparse`` says why not.
    """
    if single:
        return [(keys[0], _array_list(keys[0], values, what, refuse_sparse))]
    if is_array(values) or is_row_sparse(values) or not isinstance(values, (list, tuple)):
        raise InvalidArgumentError(
            f"{len(keys)} keys need a list of {len(keys)} {what}s (one per key), "
            f"got {type(values).__module__}.{type(values).__qualname__}"
        )
    if len(values) != len(keys):
        raise InvalidArgumentError(f"{len(keys)} keys but {len(values)} {what}s: the lengths must match")
    return [(k, _array_list(k, v, what, refuse_sparse)) for k, v in zip(keys, values)]


def merge_repeats(pairs: Sequence[tuple[Key, list[Any]]]) -> list[tuple[Key, list[Any]]]:
    """``pairs`` with each key once, holding the arrays of every pair of it (first-seen order).

    A key listed twice in a push or pushpull contributes all its values (summed), and a
    result goes to every out given for it.
    """
    if len(pairs) == 1:  # one key: nothing to merge (and no copy of its list)
        return list(pairs)
    merged: dict[Key, list[Any]] = {}
    for k, arrays in pairs:
        merged.setdefault(k, []).extend(arrays)
    return list(merged.items())


class KeyKind:
    """Remembers whether a store uses int or str keys (fixed by the first call)."""

    def __init__(self) -> None:
        self._kind: type | None = None
        self._lock = threading.Lock()

    @property
    def kind(self) -> type | None:
        """``int``, ``str`` or None before the first keyed call."""
        return self._kind

    def check(self, keys: Sequence[Key], fix: bool = False) -> None:
        """Reject keys of the other kind than the store's; ``fix`` sets the kind on first use.

        Only calls that create keys (init, broadcast) fix the kind, so a failed call
        on an empty store does not decide it.

        Raises:
            KeyTypeError: the keys are of the other kind than the store's.
        """
        kind = type(keys[0])
        if self._kind is kind:
            return
        with self._lock:
            if self._kind is None:
                if fix:
                    self._kind = kind
                return
        raise KeyTypeError(
            f"this store uses {self._kind.__name__} keys; got {kind.__name__} key {keys[0]!r} "
            "(int and str keys cannot be mixed in one store)"
        )
