"""Row-sparse parts on a server: checking pushed and pulled rows, merging a round, applying it. No I/O.

A row-sparse key's part on a server is the dense range of rows ``[first, first + count)``
of the key (:func:`pskv.partition.row_ranges`), stored as one flat array like any part
(``Part.row_width`` > 0 marks it), with the sorted *local* ids of its present rows
(``Part.present``: the rows a push without optimizer left, see the local store's
:mod:`pskv.kvstore.local_rows`). Rows travel as the rows encoding
(:data:`pskv.protocol.Flag.ROWS`): global row ids, then the rows.

What a round does with the rows pushed (:func:`apply`), each summed over workers by id
(union of the rows, :func:`merge`):

* no updater: the sum replaces the value, as in the local store — the rows present
  before are zeroed, the pushed rows written, and they are the present rows now;
* ``summed`` keys: a sync round as without updater (the plain sum of the round, the local
  store's rule and a dense key's); one push of ``dist_async``: the rows are added;
* an updater: ``updater.update_rows(key, ids, grad_rows, weight)``
  (:meth:`pskv.optimizer.Updater.update_rows`: the optimizer's lazy update of the pushed
  rows with ``lazy_update``, else its dense update of the scattered rows — what the local
  store runs); the pushed rows join the present ones. An updater without ``update_rows``
  gets the dense gradient of the scattered rows; the present rows are then the non-zero
  rows.

Rows in shared memory (``ROWS`` with ``SHM``, :class:`SharedRows`): each worker on this
host has one rows buffer here (``PSKV_SHM_ROWS_BYTES``), made with the first row-sparse
INIT; a message's specs name regions of it (``ArraySpec.buffer``: byte offset), each
checked to lie inside the buffer before it is read or written.

Errors name the part's key and sender by a :class:`RowsWhat`: its text, with a str key's name
(a lookup), is made only when an error is raised, never for a message that passes.

The INIT of row-sparse keys, which checks its parts with :func:`checked_ids` and
:func:`check_fits`, is :mod:`pskv.server.row_init`'s (it draws tables, a thread's I/O: not
in this pure module); the worker's side is :mod:`pskv.worker.rows`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from pskv.arrays import numpy_dtype
from pskv.errors import InvalidArgumentError
from pskv.protocol import ArraySpec, node_name
from pskv.transport.shm import rows_buffer

__all__ = ["RowBatch", "RowsWhat", "SharedRows", "all_rows", "apply", "check_fits", "checked_ids", "joined", "merge"]

_ID_BYTES = 8  # one int64 row id


class RowBatch(NamedTuple):
    """Some rows of a part: sorted unique *local* row ids and the rows ``(n, width)`` (storage dtype)."""

    ids: np.ndarray[Any, Any]
    rows: np.ndarray[Any, Any]


class RowsWhat(NamedTuple):
    """How errors about one part of a rows message name it: "push of row-sparse key 'emb' (server key N)
    from worker 1". Every such message makes one, so its text, whose key name is a lookup
    (``named``: :meth:`~pskv.server.part_init.PartInit.named`), is made only by ``str()``, when an error is raised.
    """

    op: str
    key: int
    sender: int
    named: Callable[[int], str]

    def __str__(self) -> str:
        return f"{self.op} of row-sparse key {self.named(self.key)} from {node_name(self.sender)}"


def all_rows(count: int) -> np.ndarray[Any, Any]:
    """Every local row id of a part of ``count`` rows."""
    return np.arange(count, dtype=np.int64)


def checked_ids(ids: np.ndarray[Any, Any], first: int, count: int, what: str | RowsWhat) -> np.ndarray[Any, Any]:
    """Global row ids from a peer as local ids of the range ``[first, first + count)``, after checking them.

    Every comparison is of the ids themselves or of Python ints, never of differences (which wrap
    at the int64 extremes: ``[0, 2**63 - 1, -2**63]`` would pass as increasing).

    Raises:
        InvalidArgumentError: more ids than the range has rows, ids not strictly increasing
            (unsorted or repeated), or outside the range; ``what`` names the key and sender.
    """
    n = ids.shape[0]
    end = first + count
    if n > count:
        raise InvalidArgumentError(f"{what}: {n} rows, more than the {count} rows of this server's range "
                                   f"[{first}, {end})")
    if n == 0:
        return np.zeros(0, np.int64)
    if n > 1:
        rising = ids[1:] > ids[:-1]
        if not bool(rising.all()):
            at = int(np.argmin(rising))
            raise InvalidArgumentError(f"{what}: row ids must be sorted and unique; {int(ids[at])} is followed by "
                                       f"{int(ids[at + 1])}")
    if int(ids[0]) < first or int(ids[-1]) >= end:  # sorted: the ends bound every id
        bad = ids[(ids < first) | (ids >= end)]
        raise InvalidArgumentError(f"{what}: row ids {bad[:8].tolist()} outside this server's range [{first}, {end})")
    return ids - first


def merge(batches: Sequence[RowBatch], width: int, dtype: np.dtype[Any]) -> RowBatch:
    """The rows of ``batches`` summed by id (the union of their ids, sorted)."""
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return RowBatch(np.zeros(0, np.int64), np.zeros((0, width), dtype))
    ids = np.concatenate([b.ids for b in batches])
    rows = np.concatenate([b.rows for b in batches])
    unique, inverse = np.unique(ids, return_inverse=True)
    if unique.size == ids.size:
        order = np.argsort(ids, kind="stable")
        return RowBatch(ids[order], rows[order])
    out = np.zeros((unique.size, width), dtype)
    np.add.at(out, inverse, rows)
    return RowBatch(unique, out)


def joined(present: np.ndarray[Any, Any], ids: np.ndarray[Any, Any], count: int) -> np.ndarray[Any, Any]:
    """The sorted union of the present rows and ``ids``: the present rows themselves when every id is
    among them (every row present, or rows pushed before); else the new ids inserted (a copy of
    ``present``, no sort)."""
    if present.size == count or not ids.size:
        return present
    at = np.searchsorted(present, ids)
    known = at < present.size
    known[known] = present[at[known]] == ids[known]
    if known.all():
        return present
    return np.insert(present, at[~known], ids[~known])


def apply(table: np.ndarray[Any, Any], present: np.ndarray[Any, Any], batch: RowBatch, key: int,
          updater: Callable[..., None] | None, summed: bool, sync: bool = False) -> np.ndarray[Any, Any]:
    """Apply a round's merged rows to ``table`` (the part's rows, ``(count, width)``, in place); the
    present rows after it. ``sync``: a sync round (else one push of ``dist_async``).

    Raises:
        Exception: the updater's own error (rows written before it are not undone).
    """
    if summed and not sync:
        table[batch.ids] += batch.rows
        return joined(present, batch.ids, table.shape[0])
    if updater is None or summed:  # a sync round of a summed key: its plain sum, as a dense key's
        table[present] = 0
        table[batch.ids] = batch.rows
        return batch.ids
    rows_update = getattr(updater, "update_rows", None)
    if callable(rows_update):  # the optimizer's lazy update: only the pushed rows (and their state)
        rows_update(key, batch.ids, batch.rows, table)
        return joined(present, batch.ids, table.shape[0])
    grad = np.zeros_like(table)  # the dense update of the scattered rows (the local store's)
    grad[batch.ids] = batch.rows
    updater(key, grad, table)
    return np.flatnonzero(table.any(axis=1)).astype(np.int64)


def check_fits(count: int, width: int, itemsize: int, held: int, limit: int, what: str | RowsWhat) -> None:
    """Refuse a part of ``count`` rows of ``width`` elements that would take this server's row-sparse
    tables (``held`` bytes so far) past ``limit``: a few bytes of INIT must not make it allocate without bound.

    Raises:
        InvalidArgumentError: ``held + count * width * itemsize > limit`` (``PSKV_MAX_TABLE_BYTES``).
    """
    need = count * width * itemsize
    if held + need > limit:
        raise InvalidArgumentError(f"{what}: {count} rows of {width} elements need {need} bytes on this server, which "
                                   f"holds {held} bytes of row-sparse keys: more than PSKV_MAX_TABLE_BYTES ({limit})")



class SharedRows:
    """The rows buffers of the workers on this server's host: one per worker node, made by :meth:`make`.

    Args:
        allocate: makes a shared 1-D array (the server's ``ShmDirectory.create``).
        workers: the workers' node ids.
        nbytes: bytes of each buffer (``PSKV_SHM_ROWS_BYTES``; 0: none are made).
    """

    def __init__(self, allocate: Callable[..., np.ndarray[Any, Any]], workers: Sequence[int], nbytes: int) -> None:
        self._allocate = allocate
        self._workers = tuple(workers)
        self._nbytes = nbytes
        self._buffers: dict[int, np.ndarray[Any, Any]] = {}
        self._made = False

    def make(self) -> None:
        """Make every worker's buffer (once; the first row-sparse INIT calls it).

        Raises:
            OSError: a buffer cannot be made (the INIT fails; workers use sockets for rows).
        """
        if self._made or not self._nbytes:
            return
        self._made = True
        for worker in self._workers:
            self._buffers[worker] = self._allocate(*rows_buffer(worker), np.dtype(np.uint8), self._nbytes)

    def region(self, worker: int, spec: ArraySpec, what: str | RowsWhat
               ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """Views of the region ``spec`` names in ``worker``'s buffer: its ``n`` ids (int64) and its ``(n, w)``
        rows of the spec's dtype (what a push wrote; where a pull's reply goes).

        Raises:
            InvalidArgumentError: no buffer for this worker, or the region is not inside it; ``what`` names
                the key and sender.
        """
        buf = self._buffers.get(worker)
        if buf is None:
            raise InvalidArgumentError(f"{what}: rows in shared memory, but this server has no rows buffer for the "
                                       "sender")
        n, width = spec.shape
        dtype = numpy_dtype(spec.dtype)
        start, need = spec.buffer, n * (_ID_BYTES + width * dtype.itemsize)
        if start < 0 or start % _ID_BYTES or start + need > buf.size:
            raise InvalidArgumentError(f"{what}: {n} rows of {width} {spec.dtype} at byte {start} of the sender's "
                                       f"rows buffer ({need} bytes) do not lie inside its {buf.size} bytes")
        ids = buf[start:start + n * _ID_BYTES].view(np.int64)
        rows = buf[start + n * _ID_BYTES:start + need].view(dtype).reshape(n, width)
        return ids, rows
