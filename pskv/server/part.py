"""One part of a server's store: its value, its open round and its pushes' numbers. No rules here.

A part is a whole small key, or one contiguous slice of a big key (``(key, offset)``); what a
push, a pull and a round do to it is :class:`~pskv.server.shard.ServerShard`'s (the rules are
written at the top of :mod:`pskv.server.shard`). bfloat16 parts are stored as float32 (exact for
bfloat16 values) and rounded back when sent.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pskv.arrays.dtypes import bf16_bits_to_f32, f32_to_bf16_bits, numpy_dtype
from pskv.server.rows import RowBatch

__all__ = ["MAX_PUSHES_AHEAD", "Part", "PartId", "PushLog", "storage_dtype", "to_storage"]

PartId = tuple[int, int]  # (key, offset)

# How far past a worker's contiguous pushes of a part a push number may be (pushes of one
# part may overtake each other in the worker's priority queue, never by this many).
MAX_PUSHES_AHEAD = 1024


def storage_dtype(dtype: str) -> np.dtype[Any]:
    """The NumPy dtype a part of ``dtype`` is stored in."""
    return np.dtype(np.float32) if dtype == "bfloat16" else numpy_dtype(dtype)


def to_storage(dtype: str, frame: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """A received frame as numbers of the storage dtype (a view when no conversion is needed)."""
    return bf16_bits_to_f32(frame) if dtype == "bfloat16" else frame


@dataclass
class PushLog:
    """One worker rank's pushes of one part: which numbers arrived, and those whose round is open."""

    count: int = 0  # pushes 1..count all arrived (applied or failed)
    ahead: set[int] = field(default_factory=set)  # numbers past count + 1 that arrived (overtaking)
    open: list[tuple[int, int]] = field(default_factory=list)  # (push number, round), rounds not complete

    def landed(self, number: int) -> bool:
        """True if push ``number`` arrived already (a repeat of it must not be applied)."""
        return 0 < number <= self.count or number in self.ahead

    def next_number(self) -> int:
        """The number an unnumbered push takes: one past every push that arrived."""
        return max(self.ahead, default=self.count) + 1

    def mark(self, number: int) -> None:
        """Push ``number`` arrived."""
        if number == self.count + 1:
            self.count = number
            while self.count + 1 in self.ahead:
                self.count += 1
                self.ahead.discard(self.count)
        elif number > self.count:
            self.ahead.add(number)


@dataclass
class Part:
    """One stored part and its aggregation state."""

    key: int
    offset: int
    dtype: str
    value: np.ndarray[Any, Any]
    round: int = 0  # completed rounds (sync) / applied pushes (async)
    merge: np.ndarray[Any, Any] | None = None
    pushed: set[int] = field(default_factory=set)
    queued: dict[int, deque[Any]] = field(default_factory=dict)  # arrays, or RowBatch for a row-sparse part
    waiting: list[tuple[int, Callable[[Part], None], Callable[[str], None] | None]] = field(default_factory=list)
    summed: bool = False  # rounds store the plain sum even when an updater is set (counters)
    restored: bool = False  # loaded from a checkpoint; the workers' first init of it is a no-op
    round_started: float = 0.0  # monotonic time of the first push of the open round
    buffers: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None = None  # shared value/merge pair
    slots: dict[int, np.ndarray[Any, Any]] = field(default_factory=dict)  # shared push slot per worker
    pushes: dict[int, PushLog] = field(default_factory=dict)  # per worker
    # pulls that arrived before the push they must see: (worker, push number, ready, fail)
    early: list[tuple[int, int, Callable[[Part], None], Callable[[str], None] | None]] = field(default_factory=list)
    published: tuple[int, np.ndarray[Any, Any]] | None = None  # (round, the snapshot pulls of it got)
    row_width: int = 0  # > 0: a row-sparse part, rows of this many elements (pskv.server.rows)
    first_row: int = 0  # a row-sparse part: the global id of its first row
    present: np.ndarray[Any, Any] | None = None  # a row-sparse part: local ids of its present rows
    rows_merge: list[RowBatch] = field(default_factory=list)  # a row-sparse part: the open round's rows

    @property
    def num_rows(self) -> int:
        """Rows of a row-sparse part."""
        return self.value.size // self.row_width if self.row_width else 0

    def table(self) -> np.ndarray[Any, Any]:
        """A row-sparse part's value as ``(rows, width)`` (a view)."""
        return self.value.reshape(-1, self.row_width)

    def buffer_index(self) -> int:
        """Which shared buffer holds the value (0 or 1)."""
        assert self.buffers is not None
        return 0 if self.value is self.buffers[0] else 1

    def _fresh_merge(self) -> np.ndarray[Any, Any]:
        if self.buffers is not None:  # the shared buffer that is not the value
            return self.buffers[1] if self.value is self.buffers[0] else self.buffers[0]
        return np.empty_like(self.value)

    def wire_value(self, snapshot: bool) -> np.ndarray[Any, Any]:
        """The value as it travels (bfloat16 as bits); ``snapshot``: a copy, made once per round."""
        if self.dtype == "bfloat16":
            return f32_to_bf16_bits(self.value)
        if not snapshot and not self.row_width:
            return self.value
        if self.published is None or self.published[0] != self.round:
            self.published = (self.round, self.value.copy())
        return self.published[1]
