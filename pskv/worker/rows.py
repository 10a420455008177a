"""Row-sparse keys on the worker side of the wire: rows split by server range, messages, replies.

A row-sparse key (``KeyLayout.row_width`` > 0) has one part per server holding rows of
it (:func:`pskv.partition.row_ranges`). Here rows are NumPy arrays ``(n, width)`` of the
key's dtype with sorted unique int64 global ids; the store above (:mod:`pskv.kvstore.dist_rows`)
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

:class:`RowRequests` (``KVWorker.rows``) owns the requests themselves: ``init``, ``push``,
``pull`` and ``values`` of row-sparse keys, sent through the worker's client. The store's
side is :mod:`pskv.kvstore.dist_rows`, the servers' :mod:`pskv.server.rows` and :mod:`pskv.server.row_init`.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pskv.config import ClusterConfig
from pskv.errors import InvalidArgumentError, ProtocolError
from pskv.protocol import ArraySpec, Command, Flag, Header, node_name, rows_frame, split_rows
from pskv.protocol.bodies import InitBody
from pskv.worker.client import WorkerClient, WorkerRequest
from pskv.worker.layout import KeyLayout
from pskv.worker.observe import CallObserver
from pskv.worker.replay import ReplayLog
from pskv.worker.shared import RowsBuffer, SharedParts, read_rows, write_rows

if TYPE_CHECKING:
    from pskv.worker.kv_worker import Exchange

__all__ = ["RowPiece", "RowRequests", "by_part", "grouped", "messages", "socket_message", "assemble"]

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
            if got.size and (got[0] < first or got[-1] >= first + count or not bool((got[1:] > got[:-1]).all())):
                raise ProtocolError(f"{node} answered rows of key {rec.key!r} that are not sorted, unique ids of its "
                                    "range")
        elif not np.array_equal(got, ids):
            raise ProtocolError(f"{node} answered other rows of key {rec.key!r} than those asked for")
        out.append((rec, got, rows))
    return out


class RowRequests:
    """A worker's requests on row-sparse keys (``KVWorker.rows``): init, push, pull, and the pulled rows.

    Args:
        client: the worker's connection.
        cluster: the cluster contract (``PSKV_MAX_MESSAGE_BYTES``, ``PSKV_REQUEST_TIMEOUT``).
        replay: the worker's push log (``PSKV_SERVER_RECOVERY``), or None.
        exchange: the type of a call's messages and replies (``KVWorker``'s ``Exchange``).
        big_call_bytes: a push of at least this many bytes of rows is always acknowledged.

    :meth:`connected` hands it the worker's shared-memory rows buffers and its observer (counters and
    spans of every call, :mod:`pskv.worker.observe`) once it has them (at connect).
    """

    def __init__(self, client: WorkerClient, cluster: ClusterConfig, replay: ReplayLog | None,
                 exchange: type[Exchange], big_call_bytes: int) -> None:
        self._client = client
        self._cluster = cluster
        self._replay = replay
        self._exchange = exchange
        self._big = big_call_bytes
        self._shared = SharedParts((), False)
        self._observe = CallObserver(client.counters)

    def connected(self, shared: SharedParts, observe: CallObserver) -> None:
        """The worker's shared-memory parts (their rows buffers) and its observer, known once it connected."""
        self._shared = shared
        self._observe = observe

    def _limit(self, timeout: float | None) -> float:
        return self._cluster.request_timeout if timeout is None else timeout

    def init(self, items: Sequence[tuple[KeyLayout, np.ndarray[Any, Any], np.ndarray[Any, Any],
                                         dict[str, Any] | None]],
             summed: bool = False, timeout: float | None = None) -> None:
        """Create row-sparse keys on their servers: per key ``(layout, ids, rows, initializer)`` — each server
        draws its range from the initializer (None: zeros), then writes the rows given. Waits for every answer."""
        inits = {id(rec): init for rec, _, _, init in items}
        cut = [piece for rec, ids, rows, _ in items for piece in pieces(rec, ids, rows, True)]
        limit = self._limit(timeout)
        pendings = []
        for server, group, specs, frames in messages(cut, False, self._cluster.max_message_bytes, "init"):
            tables = [(rec.parts[i][2] // rec.row_width, inits[id(rec)]) for rec, i, _, _ in group]
            body = InitBody.of((rec.key for rec, _, _, _ in group if isinstance(rec.key, str)), tables).encode()
            pendings.append(self._client.request(server, Command.INIT, specs, frames, body, timeout=limit,
                                                 flags=Flag.ROWS | (Flag.SUMMED if summed else 0)))
        for pending in pendings:
            pending.wait(limit)

    def push(self, items: Sequence[tuple[KeyLayout, np.ndarray[Any, Any], np.ndarray[Any, Any]]],
             priority: int = 0, timeout: float | None = None, quiet: bool = False) -> Exchange:
        """Push rows of row-sparse keys: per key ``(layout, sorted unique ids, rows (n, width))``.

        Every part of each key gets this push (no rows where it has none: its server's sync
        round needs every worker's push); counted per part like a dense push.
        """
        sent = self._exchange()
        limit = self._limit(timeout)
        cut = [piece for rec, ids, rows in items for piece in pieces(rec, ids, rows, True)]
        nbytes = sum(rows.nbytes for _, _, _, rows in cut if rows is not None)
        big = nbytes >= self._big
        start = self._observe.calling(nbytes, 0, push=True)
        traced: list[tuple[list[RowPiece], WorkerRequest]] = []
        for server, group in grouped(cut, self._cluster.max_message_bytes, "push").items():
            buffer = self._shared.rows.get(server)
            placed = write_rows(buffer, group, True, pull=False) if buffer is not None else None
            if placed is not None:  # answered (never quiet): the region is free again once the server read it
                region, specs = placed
                pending = self._client.request(server, Command.PUSH, specs, priority=priority, timeout=limit,
                                               flags=Flag.ROWS | Flag.SHM)
                region.pending = pending
            else:
                specs, frames = socket_message(group, True)
                pending = self._client.request(server, Command.PUSH, specs, frames, priority=priority,
                                               timeout=limit, quiet=quiet and not big, flags=Flag.ROWS)
                if self._replay is not None:  # kept until the next checkpoint
                    self._replay.record(server, Command.PUSH, pending, specs, frames, Flag.ROWS, "")
            for rec, i, _, _ in group:
                rec.pushes[i] += 1
            sent.messages.append(([(rec, i) for rec, i, _, _ in group], pending))
            sent.replies.append(pending)
            traced.append((group, pending))
        for rec, _, _ in items:
            rec.acks = sent.replies
        self._observe.sent_rows("push", start, traced)
        return sent

    def pull(self, items: Sequence[tuple[KeyLayout, np.ndarray[Any, Any]]], priority: int = 0,
             timeout: float | None = None, present: bool = False) -> Exchange:
        """Ask the servers for rows of row-sparse keys (per key: sorted unique ids), as of this worker's
        last push of each part; only the servers holding some of them are asked (:meth:`values`).
        ``present``: every part's present rows instead (the ids given are ignored)."""
        sent = self._exchange()
        limit = self._limit(timeout)
        cut = [piece for rec, ids in items for piece in (
            pieces(rec, np.zeros(0, np.int64), None, True) if present else pieces(rec, ids, None, False))]
        start = self._observe.calling(0, 0, push=False)
        for server, group in grouped(cut, self._cluster.max_message_bytes, "row_sparse_pull").items():
            buffer = None if present else self._shared.rows.get(server)
            placed = write_rows(buffer, group, False, pull=True) if buffer is not None else None
            if placed is not None:  # the server writes the rows after the ids; the region is held until read
                region, specs = placed
                pending = self._client.request(server, Command.PULL, specs, priority=priority, timeout=limit,
                                               flags=Flag.ROWS | Flag.SHM)
                region.pending = pending
                sent.rows.append((group, pending, present, (buffer, region, specs)))
                weakref.finalize(sent, RowsBuffer.release, region)  # also if nobody reads the rows
            else:
                specs, frames = socket_message(group, False)
                pending = self._client.request(server, Command.PULL, specs, frames, priority=priority,
                                               timeout=limit, flags=Flag.ROWS | (Flag.PRESENT if present else 0))
                sent.rows.append((group, pending, present, None))
            sent.replies.append(pending)
        self._observe.sent_rows("pull", start, [(g, p) for g, p, _, _ in sent.rows])
        return sent

    def values(self, sent: Exchange, timeout: float | None = None
               ) -> dict[int, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
        """Wait for a row pull's replies: per key (``id`` of its layout) the ids asked and their rows ``(n, width)``.

        Raises:
            ProtocolError: a reply's rows are not those asked for.
            RemoteError, NodeFailedError, OperationTimeoutError: from the requests.
        """
        limit = self._limit(timeout)
        start = self._observe.now()
        got: dict[int, list[tuple[int, np.ndarray[Any, Any], np.ndarray[Any, Any]]]] = {}
        try:
            for group, pending, present, shared in sent.rows:
                header = self._observe.wait(pending, limit)
                buffers = pending.buffers if shared is None or not header.flags & Flag.SHM else read_rows(
                    shared[0], shared[2], header, pending.node)
                for (rec, ids, rows), (_, i, _, _) in zip(assemble(group, header, buffers, node_name(pending.node),
                                                                   present), group):
                    got.setdefault(id(rec), []).append((i, ids, rows))
            out = {}
            for key, found in got.items():
                found.sort(key=lambda t: t[0])  # parts in row order
                out[key] = (np.concatenate([ids for _, ids, _ in found]),
                            np.concatenate([rows for _, _, rows in found]))  # copies: out of the rows buffers
        finally:
            for _, _, _, shared in sent.rows:
                if shared is not None:
                    shared[0].release(shared[1])
        self._observe.waited_rows(start, [(g, p) for g, p, _, _ in sent.rows])
        return out
