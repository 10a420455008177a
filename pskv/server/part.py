"""One part of a server's store: its value, its open round and its pushes' numbers. No rules here.

A part is a whole small key, or one contiguous slice of a big key (``(key, offset)``); what a
push, a pull and a round do to it is :class:`~pskv.server.shard.ServerShard`'s (the rules are
written at the top of :mod:`pskv.server.shard`). bfloat16 parts are stored as float32 (exact for
bfloat16 values) and rounded back when sent. The parts of one key on a server (a slice cut into
pieces) are a :class:`KeySlice`, whose values are views of one buffer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pskv.arrays.dtypes import bf16_bits_to_f32, f32_to_bf16_bits, numpy_dtype
from pskv.server.rows import RowBatch

__all__ = ["MAX_PUSHES_AHEAD", "Allocator", "KeySlice", "Part", "PartId", "PushLog", "storage_dtype", "to_storage"]

PartId = tuple[int, int]  # (key, offset)
Array = np.ndarray[Any, Any]
# allocate(key, offset, name, dtype, size) -> a shared 1-D array; one asked for again is grown to size, contents kept
Allocator = Callable[[int, int, str, np.dtype[Any], int], Array]

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
    top: int = 0  # the highest number that arrived (max(ahead) while ahead is not empty)
    open: list[tuple[int, int]] = field(default_factory=list)  # (push number, round), rounds not complete

    def landed(self, number: int) -> bool:
        """True if push ``number`` arrived already (a repeat of it must not be applied)."""
        return 0 < number <= self.count or number in self.ahead

    def next_number(self) -> int:
        """The number an unnumbered push takes: one past every push that arrived."""
        return max(self.top, self.count) + 1  # (top: no scan of ahead per push)

    def mark(self, number: int) -> None:
        """Push ``number`` arrived."""
        if number > self.top:
            self.top = number
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
    buffers: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None = None  # shared value/merge pair (KeySlice)
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


class KeySlice:
    """The parts of one key on a server, by offset: its slice, maybe cut into pieces (``PSKV_PART_BYTES``).

    A cut slice's pieces are views of one value buffer and one merge buffer, so the updater runs on
    the whole slice in place, as on an uncut one (:meth:`update_views`), with no copy per step. In
    shared memory the two buffers are the key's files ``v0`` and ``v1``, made with the first part:
    each part sits at its offset in the key (the elements before this server's slice are a hole in
    the file, no memory) and a later part grows them (workers map them after init, when every part
    exists); the first update points every piece at the newest maps (same memory, no copy). Private
    buffers are made by the first update, the pieces' values copied in once, and made again if a
    piece was added or moved off them since (a round without an updater replaces a value by its
    merge). Row-sparse parts never share a buffer.
    """

    def __init__(self, key: int) -> None:
        self.key = key
        self.pieces: list[Part] = []
        self._shared: tuple[Array, Array] | None = None  # the key's two shared buffers, [0, end of its parts)
        self._views: list[tuple[Array, Array]] = []  # per piece: its places in the two buffers
        self._whole: tuple[Array, Array] | None = None  # the two buffers over a cut slice without gaps

    @property
    def shared(self) -> bool:
        """The key's pieces live in shared buffers."""
        return self._shared is not None

    def overlapping(self, offset: int, size: int) -> Part | None:
        """A part here that shares an element with ``[offset, offset + size)``, if any."""
        return next((p for p in self.pieces if offset < p.offset + p.value.size and p.offset < offset + size), None)

    def shared_part(self, allocate: Allocator, offset: int, dtype: str, data: Array) -> Part:
        """A new part of the key in the shared buffers, holding ``data`` (added here)."""
        end = offset + data.size
        if self._shared is None or end > self._shared[0].size:
            dt = storage_dtype(dtype)
            self._shared = (allocate(self.key, 0, "v0", dt, end), allocate(self.key, 0, "v1", dt, end))
        views = (self._shared[0][offset:end], self._shared[1][offset:end])
        part = Part(self.key, offset, dtype, views[0], buffers=views)
        np.copyto(part.value, data)
        self.add(part)
        return part

    def add(self, part: Part) -> None:
        """Hold ``part`` (checked not to overlap one held); the first update joins the pieces (:meth:`update_views`)."""
        self.pieces.append(part)
        self.pieces.sort(key=lambda p: p.offset)
        self._whole = None

    def _point_shared(self) -> None:
        """Every piece's buffers as views of the newest maps of the shared buffers (same memory, no copy)."""
        assert self._shared is not None
        a, b = self._shared
        self._views = []
        for p in self.pieces:
            end = p.offset + p.value.size
            views = (a[p.offset:end], b[p.offset:end])
            index = p.buffer_index()
            p.value, p.merge = views[index], None if p.merge is None else views[1 - index]
            p.buffers = views
            self._views.append(views)
        if self._tiled():
            lo, hi = self.pieces[0].offset, self.pieces[-1].offset + self.pieces[-1].value.size
            self._whole = (a[lo:hi], b[lo:hi])

    def _gather(self) -> None:
        """Private buffers for the pieces, their values and merges copied in (pieces with gaps: none)."""
        if not self._tiled() or len({p.value.dtype for p in self.pieces}) > 1 or self.pieces[0].row_width:
            return
        lo, last = self.pieces[0].offset, self.pieces[-1]
        value = np.empty(last.offset + last.value.size - lo, last.value.dtype)
        merge = np.empty_like(value)
        self._views = []
        for p in self.pieces:  # the old arrays may be in flight: read, never written
            at = p.offset - lo
            views = (value[at: at + p.value.size], merge[at: at + p.value.size])
            np.copyto(views[0], p.value)
            if p.merge is not None:
                np.copyto(views[1], p.merge)
            p.value, p.merge = views
            self._views.append(views)
        self._whole = (value, merge)

    def _tiled(self) -> bool:
        return all(p.offset + p.value.size == q.offset for p, q in zip(self.pieces, self.pieces[1:]))

    def update_views(self) -> tuple[Array, Array] | None:
        """A cut slice's ``(merge, value)`` as two contiguous arrays made of its pieces' merges and values,
        for the updater to run on in place; None where the pieces are not views of one buffer (gaps; shared
        pieces whose values are in different buffers of their pairs): then the caller concatenates."""
        if self._whole is None and self._shared is not None:  # the first update since a piece was added
            self._point_shared()
        elif self._whole is None:
            self._gather()
        if self._whole is None:
            return None
        a, b = self._whole
        if all(p.value is va and p.merge is vb for p, (va, vb) in zip(self.pieces, self._views)):
            return b, a
        if self._shared is not None:
            swapped = all(p.value is vb and p.merge is va for p, (va, vb) in zip(self.pieces, self._views))
            return (a, b) if swapped else None
        self._gather()
        return self._whole[1], self._whole[0]
