"""How a shard's parts are made and found: rank 0's INIT, a row-sparse INIT, a checkpoint. No I/O.

:class:`PartInit` is the half of :class:`~pskv.server.shard.ServerShard` that holds the table of
parts (``parts``, and each key's :class:`~pskv.server.part.KeySlice`) and adds to it; the rounds'
rules are the shard's own (:mod:`pskv.server.shard`). A part is made

* from rank 0's value (:meth:`PartInit.init`), in shared memory when the server has an allocator,
  the job is sync and the part dense and not bfloat16 (co-located workers push into their slot),
  and the process has maps left for a new key (:func:`~pskv.transport.shm.maps_left`; a key is
  shared or not as its first part was);
* as a range of rows of a row-sparse key (:meth:`PartInit.init_rows`): zeros or drawn rows, then the
  rows the INIT carries; never shared;
* from a checkpoint (:meth:`PartInit.restore`): the value as stored and its round; the workers' first
  INIT of it then meets it and is a no-op (:meth:`PartInit.accept_init`).

The parts of one key on a server must not overlap (a checkpoint made with another cut is refused).

Errors name a str key by its name and server key (:func:`named_key`, from the names INIT carries):
the user never wrote the server key, a 64-bit hash of the name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pskv.errors import DTypeMismatchError, DuplicateKeyError, InvalidArgumentError, ShapeMismatchError, UnknownKeyError
from pskv.server import rows as sparse_rows
from pskv.server.part import Allocator, KeySlice, Part, PartId, storage_dtype, to_storage
from pskv.server.rows import RowBatch
from pskv.transport.shm import map_budget, maps_left

__all__ = ["PartInit", "named_key"]


def named_key(key: int, names: Mapping[int, str]) -> str:
    """How a server's message names ``key``: a str key as ``'fc1_weight' (server key N)``, an int key (or
    one whose name never came) as it is. For errors only: a lookup, kept off the hot path."""
    name = names.get(key)
    return str(key) if name is None else f"{name!r} (server key {key})"


class PartInit:
    """A shard's parts: made (:meth:`init`, :meth:`init_rows`, :meth:`restore`), found and checked (:meth:`check`).

    Args:
        sync: sync (True) or async (False) aggregation: only sync parts are made in shared memory.
        allocate: makes a part's shared-memory buffers (None: none), with a push slot for each of ``workers``.
        workers: the workers' node ids (their push slots).
    """

    def __init__(self, sync: bool, allocate: Allocator | None, workers: tuple[int, ...]) -> None:
        self.sync = sync
        self._allocate = allocate
        self._workers = workers
        self.parts: dict[PartId, Part] = {}
        self.key_names: Mapping[int, str] = {}  # str keys' names by server key (ServerCore.key_names), for errors
        self._pieces: dict[int, KeySlice] = {}  # key -> its parts here, by offset (one slice, maybe cut)

    def init(self, key: int, offset: int, dtype: str, frame: np.ndarray[Any, Any], summed: bool = False) -> None:
        """Create a part from rank 0's value (``summed``: rounds bypass the updater).

        Raises:
            DuplicateKeyError: the part exists.
        """
        pid = (key, offset)
        if pid in self.parts:
            raise DuplicateKeyError(key)
        self._create(key, offset, dtype, to_storage(dtype, frame).reshape(-1), summed)

    def init_rows(self, key: int, offset: int, dtype: str, count: int, width: int, batch: RowBatch | None,
                  drawn: np.ndarray[Any, Any] | None = None, summed: bool = False) -> None:
        """Create a row-sparse part of ``count`` rows of ``width`` elements (global rows from
        ``offset // width``): zeros, or ``drawn`` (every row present), then ``batch``'s rows.

        Raises:
            DuplicateKeyError: the part exists.
        """
        if (key, offset) in self.parts:
            raise DuplicateKeyError(key)
        value = np.zeros(count * width, storage_dtype(dtype)) if drawn is None else drawn.reshape(-1)
        part = self._create(key, offset, dtype, value, summed, row_width=width, own=True)
        table = part.table()
        present = sparse_rows.all_rows(count) if drawn is not None else np.zeros(0, np.int64)
        if batch is not None and batch.ids.size:
            table[batch.ids] = batch.rows
            present = sparse_rows.joined(present, batch.ids, count)
        part.present = present

    def restore(self, key: int, offset: int, dtype: str, stored: np.ndarray[Any, Any], rounds: int,
                summed: bool = False, row_width: int = 0, present: np.ndarray[Any, Any] | None = None) -> None:
        """Create a part from a checkpoint: ``stored`` is the value as stored (storage dtype);
        ``row_width`` > 0: a row-sparse part whose present rows are ``present`` (local ids).

        The workers' first ``init`` of it is accepted and ignored (:meth:`accept_init`).
        """
        if stored.dtype != storage_dtype(dtype):
            raise InvalidArgumentError(f"key {key}: a {dtype} part stored as {stored.dtype}")
        if row_width and stored.size % row_width:
            raise InvalidArgumentError(f"key {key}: a row-sparse part of {stored.size} elements is not made of "
                                       f"rows of {row_width}")
        part = self._create(key, offset, dtype, stored.reshape(-1), summed, row_width=row_width)
        if row_width:
            part.present = np.zeros(0, np.int64) if present is None else present
        part.round = rounds
        part.restored = True

    def accept_init(self, key: int, offset: int, dtype: str, size: int, width: int = 0) -> bool:
        """True if an init of ``(key, offset)`` meets a part restored from a checkpoint (then a no-op).

        Raises:
            DTypeMismatchError, ShapeMismatchError: the init does not fit the restored part.
        """
        part = self.parts.get((key, offset))
        if part is None or not part.restored:
            return False
        if width != part.row_width:
            kinds = [f"row-sparse (rows of {w})" if w else "dense" for w in (part.row_width, width)]
            raise InvalidArgumentError(f"init of key {self.named(key)}: the checkpoint holds it {kinds[0]}, "
                                       f"the init makes it {kinds[1]}")
        self.check(key, offset, dtype, size, "init (of a key restored from a checkpoint)")
        part.restored = False
        return True

    def _create(self, key: int, offset: int, dtype: str, data: np.ndarray[Any, Any], summed: bool,
                row_width: int = 0, own: bool = False) -> Part:
        pieces = self._pieces.setdefault(key, KeySlice(key))
        other = pieces.overlapping(offset, data.size)
        if other is not None:
            raise InvalidArgumentError(
                f"key {self.named(key)}: a part of elements [{offset}, {offset + data.size}) overlaps the part "
                f"[{other.offset}, {other.offset + other.value.size}) this server holds (a checkpoint made "
                "with another PSKV_PART_BYTES, MXNET_KVSTORE_BIGARRAY_BOUND or number of servers?)"
            )
        with map_budget:  # the check and the maps it allows, not split by another thread's
            if self._allocate is not None and self.sync and dtype != "bfloat16" and not row_width and (
                    pieces.shared or (not pieces.pieces and maps_left() >= 2 + len(self._workers))):
                # shared buffers: co-located workers push into their slot and read the value in place
                part = pieces.shared_part(self._allocate, offset, dtype, data)
                part.slots = {w: self._allocate(key, offset, f"w{w}", part.value.dtype, data.size) for w in self._workers}
                part.summed = summed
            else:  # ``own``: ``data`` is this server's (made for this part): kept, not copied (a drawn table's range)
                value = np.asarray(data, storage_dtype(dtype)) if own else np.array(data, storage_dtype(dtype), copy=True)
                part = Part(key, offset, dtype, value, summed=summed, row_width=row_width,
                            first_row=offset // row_width if row_width else 0)
                pieces.add(part)
        self.parts[(key, offset)] = part
        return part

    def pieces(self, key: int) -> list[Part]:
        """The parts of ``key`` this shard holds, by offset (none: an empty list)."""
        held = self._pieces.get(key)
        return held.pieces if held is not None else []

    def part(self, key: int, offset: int, op: str) -> Part:
        """The part ``(key, offset)``.

        Raises:
            UnknownKeyError: it was never initialised.
        """
        p = self.parts.get((key, offset))
        if p is None:
            raise UnknownKeyError(key, op, label=self.named(key))
        return p

    def check(self, key: int, offset: int, dtype: str, size: int, op: str) -> Part:
        """The part, after checking that an incoming frame fits it.

        Raises:
            UnknownKeyError, DTypeMismatchError, ShapeMismatchError.
        """
        p = self.part(key, offset, op)
        if dtype != p.dtype:
            raise DTypeMismatchError(key, op, p.dtype, dtype, label=self.named(key))
        if size != p.value.size:
            raise ShapeMismatchError(key, op, (p.value.size,), (size,), label=self.named(key))
        return p

    def named(self, key: int) -> str:
        """``key`` as this shard's errors name it (:func:`named_key`)."""
        return named_key(key, self.key_names)
