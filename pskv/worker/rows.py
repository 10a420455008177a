"""Row-sparse keys on the worker side of the wire: rows split by server range, messages, replies.

A row-sparse key (``KeyLayout.row_width`` > 0) has one part per server holding rows of
it (:func:`pskv.partition.row_ranges`). Here rows are NumPy arrays ``(n, width)`` of the
key's dtype with sorted unique int64 global ids; the store above (:mod:`pskv.kvstore.dist`)
sums a push's values into one such set and writes received rows into the caller's outs.

* :func:`by_part` cuts sorted ids at the parts' first rows;
* :func:`grouped` groups the pieces of a call per server, one message each, and
  :func:`messages` makes them, in the rows
  encoding (:data:`pskv.protocol.Flag.ROWS`, :func:`pskv.protocol.rows_frame`) — a push
  names every part of its keys, with no rows where it has none, so every server's sync
  round of the key gets this worker's push; a row pull names only the parts it wants
  rows of;
* :func:`assemble` checks a reply's rows against what was asked and puts them in order.

A message to a server on this host may carry its rows in shared memory instead
(:func:`pskv.worker.shared.write_rows`); its pieces are grouped the same way.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from pskv.errors import InvalidArgumentError, ProtocolError
from pskv.protocol import ArraySpec, Header, rows_frame, split_rows
from pskv.worker.layout import KeyLayout

__all__ = ["RowPiece", "by_part", "grouped", "messages", "socket_message", "assemble"]

#: One part's share of a call: (layout, part index, global ids, rows (n, width) or None for a pull).
RowPiece = tuple[KeyLayout, int, np.ndarray[Any, Any], "np.ndarray[Any, Any] | None"]


def by_part(rec: KeyLayout, ids: np.ndarray[Any, Any]) -> list[tuple[int, int, int]]:
    """``(part index, lo, hi)``: ``ids[lo:hi]`` are the (sorted) ids in part ``i``'s rows, for every part."""
    firsts = np.array([offset // rec.row_width for _, offset, _ in rec.parts], dtype=np.int64)
    cuts = np.searchsorted(ids, firsts, side="left").tolist() + [int(ids.size)]
    return [(i, cuts[i], cuts[i + 1]) for i in range(len(rec.parts))]


def pieces(rec: KeyLayout, ids: np.ndarray[Any, Any], rows: np.ndarray[Any, Any] | None,
           every_part: bool) -> list[RowPiece]:
    """``rec``'s ids (and rows) cut per part; parts without ids only if ``every_part`` (a push)."""
    return [(rec, i, ids[lo:hi], None if rows is None else rows[lo:hi])
            for i, lo, hi in by_part(rec, ids) if every_part or hi > lo]


def grouped(items: Sequence[RowPiece], max_bytes: int, op: str) -> dict[int, list[RowPiece]]:
    """The pieces of one message per server.

    Raises:
        InvalidArgumentError: a server's message, or the reply to a row pull, would hold more than
            ``max_bytes`` (``PSKV_MAX_MESSAGE_BYTES``: its receiver would drop it); nothing is sent.
    """
    out: dict[int, list[RowPiece]] = defaultdict(list)
    for piece in items:
        out[piece[0].parts[piece[1]][0]].append(piece)
    for server, group in out.items():
        size = sum(ids.size * (8 + rec.row_width * rec.itemsize) for rec, _, ids, _ in group)
        if size > max_bytes:
            keys = sorted({repr(rec.key) for rec, _, _, _ in group})
            raise InvalidArgumentError(f"{op} of row-sparse key(s) {', '.join(keys[:4])}: the rows of server {server} "
                                       f"make a {size}-byte message, more than PSKV_MAX_MESSAGE_BYTES ({max_bytes}); "
                                       "split the call")
    return out


def socket_message(group: Sequence[RowPiece], number: bool
                   ) -> tuple[tuple[ArraySpec, ...], list[np.ndarray[Any, Any]]]:
    """The specs and frames of one message of ``group``; ``number``: each spec's round is the part's next push
    number."""
    specs = tuple(ArraySpec(rec.skey, rec.meta.dtype, (int(ids.size), rec.row_width), rec.parts[i][1],
                            rec.pushes[i] + 1 if number else rec.pushes[i])
                  for rec, i, ids, _ in group)
    return specs, [rows_frame(ids, rows) for _, _, ids, rows in group]


def messages(items: Sequence[RowPiece], number: bool, max_bytes: int, op: str
             ) -> list[tuple[int, list[RowPiece], tuple[ArraySpec, ...], list[np.ndarray[Any, Any]]]]:
    """``(server, pieces, specs, frames)`` per server, through sockets (see :func:`grouped`, :func:`socket_message`).

    Raises:
        InvalidArgumentError: as :func:`grouped`.
    """
    return [(server, group, *socket_message(group, number)) for server, group in grouped(items, max_bytes, op).items()]


def assemble(asked: Sequence[RowPiece], header: Header, buffers: Sequence[memoryview], node: str,
             present: bool = False) -> list[tuple[KeyLayout, np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
    """The rows a reply to a row pull carries, per piece asked, checked: ``(layout, ids, rows (n, width))``.

    ``present``: the pull asked for each part's present rows (any ids, sorted, unique, in its range).

    Raises:
        ProtocolError: the reply's parts, widths or ids are not those asked for.
    """
    if len(header.arrays) != len(asked) or len(buffers) != len(asked):
        raise ProtocolError(f"{node} answered {len(header.arrays)} row-sparse parts for {len(asked)} asked")
    out = []
    for (rec, i, ids, _), spec, buf in zip(asked, header.arrays, buffers):
        n = spec.shape[0] if present else ids.size
        if spec.key != rec.skey or spec.offset != rec.parts[i][1] or spec.shape != (n, rec.row_width):
            raise ProtocolError(f"{node}'s rows for key {rec.key!r} do not match the request")
        got, rows = split_rows(spec, buf)
        if present:
            first, count = rec.parts[i][1] // rec.row_width, rec.parts[i][2] // rec.row_width
            if got.size and (got[0] < first or got[-1] >= first + count or not bool((np.diff(got) > 0).all())):
                raise ProtocolError(f"{node} answered rows of key {rec.key!r} that are not sorted, unique ids of its "
                                    "range")
        elif not np.array_equal(got, ids):
            raise ProtocolError(f"{node} answered other rows of key {rec.key!r} than those asked for")
        out.append((rec, got, rows))
    return out
