"""The assertions the store contracts are made of (:mod:`pskv.testing.contracts`).

Each fails with an ``AssertionError`` that says what was checked and what was seen; a
sum "over workers" is the sum of every worker's :func:`mine`, worker ``r`` giving
``(r + 1) * x``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pskv.kvstore import KVStoreBase

__all__ = ["create_keys", "full", "mine", "over_workers", "raises", "same"]


def full(shape: tuple[int, ...], value: float, dtype: str = "float32") -> np.ndarray[Any, Any]:
    """A new array of ``shape`` filled with ``value``."""
    return np.full(shape, value, dtype=dtype)


def mine(kv: KVStoreBase, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """This worker's share of a sum over workers: ``(rank + 1) * x``."""
    return (kv.rank + 1) * x


def over_workers(kv: KVStoreBase, x: Any) -> Any:
    """The sum of every worker's :func:`mine`: ``x * n (n + 1) / 2``."""
    return x * (kv.num_workers * (kv.num_workers + 1) // 2)


def same(got: Any, want: Any, what: str) -> None:
    """``got`` equals ``want`` exactly (values, shape and, for arrays, dtype)."""
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    if want.dtype.kind == "f":
        assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    np.testing.assert_array_equal(got, want, err_msg=what)


def raises(error: type[BaseException], call: Callable[[], Any], what: str) -> BaseException:
    """``call()`` raises ``error`` (anything else, or nothing, fails the check)."""
    try:
        call()
    except error as exc:
        return exc
    except BaseException as exc:
        raise AssertionError(f"{what}: raised {type(exc).__name__}: {exc}; expected {error.__name__}") from exc
    raise AssertionError(f"{what}: no error; expected {error.__name__}")


def create_keys(kv: KVStoreBase, keys: list[Any], values: list[Any]) -> None:
    """``init`` where the store has it; a summation-only store declares keys on first use."""
    if not kv.store_type.summation_only:
        kv.init(keys, values)
