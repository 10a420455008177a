"""``TableInit``: a row-sparse table described by an initializer, drawn where it is stored.

A table of shape ``(rows, d1, ...)`` need not exist on any worker: ``kv.init(key,
TableInit(shape, dtype, init))`` on a distributed store sends only this description, and
each server draws the rows of its range itself. The draw is a function of the seed and
the row: rows come in blocks of :data:`BLOCK_ROWS`, block ``b`` drawn by NumPy's default
generator seeded with ``(seed, b)`` — so the same seed gives the same table whatever the
number of servers or where their ranges start (:func:`draw_rows`), and
:meth:`TableInit.todense` gives it on one process.

Initializers (``init``, a JSON-able dict, checked by :func:`check_init`):

* ``{'type': 'zeros'}``
* ``{'type': 'normal', 'mean': 0.0, 'std': 0.01, 'seed': 0}``
* ``{'type': 'uniform', 'low': -0.05, 'high': 0.05, 'seed': 0}``

Float dtypes only (``float16``, ``float32``, ``float64``); values are drawn in float64
and rounded to the dtype.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pskv.errors import InvalidArgumentError

__all__ = ["BLOCK_ROWS", "TABLE_DTYPES", "TableInit", "check_init", "draw_rows", "is_drawn"]

#: Rows drawn from one seeded generator: a table's values depend on (seed, row) only.
BLOCK_ROWS = 1024
#: The dtypes a table may have.
TABLE_DTYPES = ("float16", "float32", "float64")
_SEED_MAX = 2**63 - 1
_FIELDS: dict[str, dict[str, float]] = {  # type -> its float parameters and their defaults
    "zeros": {},
    "normal": {"mean": 0.0, "std": 0.01},
    "uniform": {"low": -0.05, "high": 0.05},
}


def _number(kind: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgumentError(f"table initializer {kind!r}: {name} must be a finite number, got {value!r}")
    return float(value)


def check_init(init: object) -> dict[str, Any]:
    """A complete, checked initializer (defaults filled in) from ``init``.

    Raises:
        InvalidArgumentError: not a dict, an unknown type or field, a value out of range.
    """
    if not isinstance(init, Mapping):
        raise InvalidArgumentError(f"a table initializer is a dict like {{'type': 'normal', 'seed': 0}}, got {init!r}")
    kind = init.get("type")
    if kind not in _FIELDS:
        raise InvalidArgumentError(f"table initializer type must be one of {sorted(_FIELDS)}, got {kind!r}")
    allowed = set(_FIELDS[kind]) | {"type"} | ({"seed"} if kind != "zeros" else set())
    unknown = sorted(str(k) for k in init if k not in allowed)
    if unknown:
        raise InvalidArgumentError(f"table initializer {kind!r} has no field(s) {unknown} (fields: {sorted(allowed)})")
    out: dict[str, Any] = {"type": kind}
    for name, default in _FIELDS[kind].items():
        out[name] = _number(kind, name, init.get(name, default))
    if kind != "zeros":
        seed = init.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _SEED_MAX:
            raise InvalidArgumentError(f"table initializer {kind!r}: seed must be an int in 0..2**63-1, got {seed!r}")
        out["seed"] = seed
    if kind == "normal" and out["std"] < 0:
        raise InvalidArgumentError(f"table initializer 'normal': std must be >= 0, got {out['std']}")
    if kind == "uniform" and not out["low"] < out["high"]:
        raise InvalidArgumentError(f"table initializer 'uniform': low must be < high, got {out['low']}, {out['high']}")
    return out


def is_drawn(init: Mapping[str, Any]) -> bool:
    """True if the initializer gives rows that may be non-zero (every row is then present)."""
    return init["type"] != "zeros"


def draw_rows(init: Mapping[str, Any], dtype: str, start: int, count: int, width: int) -> np.ndarray[Any, Any]:
    """Rows ``start .. start + count`` of the table ``init`` describes, ``(count, width)`` of ``dtype``.

    ``init`` is a checked initializer (:func:`check_init`). Each block of
    :data:`BLOCK_ROWS` rows is drawn whole from a generator seeded with ``(seed, block)``,
    so a row's values do not depend on ``start`` or ``count``.
    """
    out = np.zeros((count, width), dtype=np.dtype(dtype))
    if init["type"] == "zeros" or count == 0 or width == 0:
        return out
    first, last = start // BLOCK_ROWS, (start + count - 1) // BLOCK_ROWS
    for block in range(first, last + 1):
        gen = np.random.default_rng([init["seed"], block])
        if init["type"] == "normal":
            values = gen.normal(init["mean"], init["std"], size=(BLOCK_ROWS, width))
        else:
            values = gen.uniform(init["low"], init["high"], size=(BLOCK_ROWS, width))
        lo = max(start, block * BLOCK_ROWS)
        hi = min(start + count, (block + 1) * BLOCK_ROWS)
        out[lo - start: hi - start] = values[lo - block * BLOCK_ROWS: hi - block * BLOCK_ROWS]
    return out


class TableInit:
    """A table to be created where it is stored, from an initializer (see the module).

    Args:
        shape: the table's shape, ``(rows, d1, ...)`` (at least one dimension).
        dtype: ``'float16'``, ``'float32'`` or ``'float64'``.
        init: the initializer (default ``{'type': 'zeros'}``).

    Raises:
        InvalidArgumentError: a bad shape, dtype or initializer.
    """

    __slots__ = ("_shape", "_dtype", "_init")

    def __init__(self, shape: Sequence[int], dtype: str = "float32", init: Mapping[str, Any] | None = None) -> None:
        if not isinstance(shape, (tuple, list)) or not shape or any(
                isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
            raise InvalidArgumentError(f"a table's shape is a tuple of at least one non-negative int, got {shape!r}")
        if dtype not in TABLE_DTYPES:
            raise InvalidArgumentError(f"a table's dtype must be one of {TABLE_DTYPES}, got {dtype!r}")
        self._shape = tuple(int(d) for d in shape)
        self._dtype = dtype
        self._init = check_init({"type": "zeros"} if init is None else init)

    @property
    def shape(self) -> tuple[int, ...]:
        """The table's shape."""
        return self._shape

    @property
    def dtype(self) -> str:
        """The table's dtype name."""
        return self._dtype

    @property
    def init(self) -> dict[str, Any]:
        """The checked initializer (defaults filled in)."""
        return dict(self._init)

    @property
    def row_width(self) -> int:
        """Elements of one row."""
        return math.prod(self._shape[1:])

    def todense(self) -> np.ndarray[Any, Any]:
        """The whole table on this process (what the servers hold together)."""
        return draw_rows(self._init, self._dtype, 0, self._shape[0], self.row_width).reshape(self._shape)

    def __repr__(self) -> str:
        return f"TableInit(shape={self._shape}, dtype={self._dtype}, init={self._init})"
