"""The ``INIT`` of row-sparse keys on a server (``ROWS``): checked, drawn, made, answered.

Each part of a row-sparse key is a range of rows (:mod:`pskv.server.rows`). Its INIT names
the range's rows and the initializer to draw them from (:class:`~pskv.protocol.bodies.InitBody`:
None for zeros), and carries the rows to write over them. Every part of the message is
checked before any is made: no broadcast, widths that divide the offsets, drawable dtypes,
no duplicate, ids in range, and the server's bytes of row-sparse keys within
``PSKV_MAX_TABLE_BYTES`` (:func:`~pskv.server.rows.check_fits`). A part restored from a
checkpoint is kept.

A big table (:data:`DRAW_IN_THREAD` elements or more to draw) is drawn on a thread of its
own, so the server's reactor goes on serving (heartbeats included); the parts are then made
and the INIT answered on the server's thread (``defer``), its failure through the server's
one ERROR reply (``ServerCore.fail``). :class:`RowInit` also owns this host's workers' rows
buffers (:class:`~pskv.server.rows.SharedRows`), made with the first such INIT.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, TypeAlias

import numpy as np

from pskv.arrays.tables import TABLE_DTYPES, draw_rows, is_drawn
from pskv.errors import InvalidArgumentError, KVStoreError
from pskv.protocol import ArraySpec, Flag, Header, node_name, split_rows
from pskv.protocol.bodies import InitBody
from pskv.server.rows import RowBatch, RowsWhat, SharedRows, check_fits, checked_ids
from pskv.server.shard import ServerShard, storage_dtype, to_storage

__all__ = ["DRAW_IN_THREAD", "MAX_TABLE_BYTES", "RowInit"]

log = logging.getLogger("pskv.server")

#: Bytes of row-sparse keys one server holds at most, unless the cluster config says (PSKV_MAX_TABLE_BYTES).
MAX_TABLE_BYTES = 16 << 30
#: An INIT drawing at least this many elements from initializers draws them on a thread of its own
#: (when the server can defer its answer): its reactor goes on serving, heartbeats included.
DRAW_IN_THREAD = 1 << 22

#: One checked part: its spec, rows, row width, initializer (None: zeros), local ids and rows given.
Planned: TypeAlias = tuple[ArraySpec, int, int, "dict[str, Any] | None", np.ndarray[Any, Any], np.ndarray[Any, Any]]


class RowInit:
    """The INIT of row-sparse keys on one shard.

    Args:
        shard: the shard.
        ack: acknowledges a request (``ack(identity, header)``).
        fail: the server's ERROR reply to a request (``fail(identity, header, exc)``), for an INIT
            answered later (drawn on a thread).
        name: the server's name, for the log.
        max_table_bytes: ``PSKV_MAX_TABLE_BYTES``.
        defer: runs a call on the server's handling thread later; None: every table is drawn inline.
    """

    def __init__(self, shard: ServerShard, ack: Callable[[bytes, Header], None],
                 fail: Callable[[bytes, Header, Exception], None], name: Callable[[], str],
                 max_table_bytes: int = MAX_TABLE_BYTES,
                 defer: Callable[[Callable[[], None]], None] | None = None) -> None:
        self._shard = shard
        self._ack = ack
        self._fail = fail
        self._name = name
        self._max_table_bytes = max_table_bytes
        self._defer = defer
        self._drawing: dict[tuple[int, int], int] = {}  # parts being drawn on a thread -> their bytes
        self.shared: SharedRows | None = None  # the rows buffers of workers on this host (ServerCore sets it)

    def __call__(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """INIT of row-sparse keys: each part a range of rows, from its initializer or zeros, then the rows its
        frame carries. Everything is checked before any part is made.

        Raises:
            InvalidArgumentError: a broadcast, a part past PSKV_MAX_TABLE_BYTES, bad row ids, an initializer
                for a dtype it cannot draw, a width that does not divide the offset.
            KVStoreError: a duplicate init.
        """
        if header.flags & Flag.OVERWRITE:
            raise InvalidArgumentError(f"broadcast from {node_name(header.sender)}: row-sparse keys cannot be "
                                       "overwritten by a broadcast")
        planned = self._plan(header, buffers)
        summed = bool(header.flags & Flag.SUMMED)
        if self.shared is not None:  # the job has row-sparse keys: rows may travel in shared memory now
            try:
                self.shared.make()
            except OSError as exc:
                log.warning("%s: no shared-memory rows buffers, row-sparse keys use sockets: %s", self._name(), exc)
                self.shared = None
        drawn = [init is not None and is_drawn(init) and self._shard.parts.get((spec.key, spec.offset)) is None
                 for spec, _, _, init, _, _ in planned]
        elements = sum(count * width for (_, count, width, _, _, _), d in zip(planned, drawn) if d)
        if self._defer is None or elements < DRAW_IN_THREAD:
            self._create(planned, [_draw(p) if d else None for p, d in zip(planned, drawn)], summed)
            self._ack(identity, header)
            return
        self._draw_in_thread(self._defer, identity, header, planned, drawn, summed)

    def _plan(self, header: Header, buffers: list[memoryview]) -> list[Planned]:
        """Every part of the INIT, checked (see :meth:`__call__`)."""
        tables = InitBody.parse(header).tables
        planned: list[Planned] = []
        held = sum(p.value.nbytes for p in self._shard.parts.values() if p.row_width) + sum(self._drawing.values())
        for spec, buf, (count, init) in zip(header.arrays, buffers, tables):
            n, width = spec.shape
            what = RowsWhat("init", spec.key, header.sender, self._shard.named)  # its text made for an error only
            if width < 1 or spec.offset % width:
                raise InvalidArgumentError(f"{what}: rows of {width} elements cannot start at element {spec.offset}")
            if init is not None and spec.dtype not in TABLE_DTYPES:
                raise InvalidArgumentError(f"{what}: a table drawn from an initializer must be one of {TABLE_DTYPES}, "
                                           f"not {spec.dtype}")
            existing = self._shard.parts.get((spec.key, spec.offset))
            if (existing is not None and not existing.restored) or (spec.key, spec.offset) in self._drawing or any(
                    p[0].key == spec.key and p[0].offset == spec.offset for p in planned):
                raise KVStoreError(f"duplicate init of key {self._shard.named(spec.key)}")
            if existing is None:  # a restored part is counted in what this server holds already
                check_fits(count, width, storage_dtype(spec.dtype).itemsize, held, self._max_table_bytes, what)
                held += count * width * storage_dtype(spec.dtype).itemsize
            ids, rows = split_rows(spec, buf)
            planned.append((spec, count, width, init, checked_ids(ids, spec.offset // width, count, what), rows))
        return planned

    def _draw_in_thread(self, defer: Callable[[Callable[[], None]], None], identity: bytes, header: Header,
                        planned: list[Planned], drawn: list[bool], summed: bool) -> None:
        """A big table: drawn on a thread while this server goes on serving (and sending heartbeats); the
        parts are made and the INIT answered back on the server's thread (:meth:`_drawn`)."""
        for spec, count, width, _, _, _ in planned:
            self._drawing[(spec.key, spec.offset)] = count * width * storage_dtype(spec.dtype).itemsize

        def draw() -> None:
            try:
                tables = [_draw(p) if d else None for p, d in zip(planned, drawn)]
            except Exception as exc:  # noqa: BLE001 - e.g. MemoryError: answered as the INIT's error
                defer(partial(self._drawn, identity, header, planned, None, summed, exc))
                return
            defer(partial(self._drawn, identity, header, planned, tables, summed, None))
        threading.Thread(target=draw, name="pskv-draw-table", daemon=True).start()

    def _create(self, planned: list[Planned], drawn: list[np.ndarray[Any, Any] | None], summed: bool) -> None:
        """Make the parts of a checked INIT of row-sparse keys (a restored one is kept)."""
        for (spec, count, width, _, local, rows), table in zip(planned, drawn):
            if self._shard.accept_init(spec.key, spec.offset, spec.dtype, count * width, width):
                continue  # restored from a checkpoint: kept
            self._shard.init_rows(spec.key, spec.offset, spec.dtype, count, width,
                                  RowBatch(local, to_storage(spec.dtype, rows)), table, summed)

    def _drawn(self, identity: bytes, header: Header, planned: list[Planned],
               drawn: list[np.ndarray[Any, Any] | None] | None, summed: bool, failure: Exception | None) -> None:
        """On the server's thread: the tables an INIT's thread drew are ready (or failed): make the parts, answer."""
        for spec, _, _, _, _, _ in planned:
            self._drawing.pop((spec.key, spec.offset), None)
        try:
            if failure is not None:
                raise failure
            assert drawn is not None
            self._create(planned, drawn, summed)
        except Exception as exc:  # noqa: BLE001 - the INIT's answer: the server's one ERROR reply
            self._fail(identity, header, exc)
            return
        self._ack(identity, header)


def _draw(planned: Planned) -> np.ndarray[Any, Any]:
    """A part's rows drawn from its initializer (the same rows on any layout: seeded per block of rows)."""
    spec, count, width, init, _, _ = planned
    assert init is not None
    return draw_rows(init, spec.dtype, spec.offset // width, count, width)
