"""One pull or pushpull reply, assembled as its parts complete their rounds.

A request names several parts; each completes its round on its own time (the shard
calls :meth:`Gather.ready` for each). The reply goes out once, when the last part is
ready — or an error, the first time the shard fails one of them (:meth:`Gather.fail`).
:class:`Parking` bounds how many pulled parts each worker may have waiting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pskv.errors import InvalidArgumentError
from pskv.protocol import ArraySpec, Flag, Header, node_name, rows_frame
from pskv.protocol.replies import error_frames, reply_frames
from pskv.server.shard import Part, f32_to_bf16_bits

__all__ = ["Gather", "Parking", "PARKED_CONNECTIONS", "PARKED_PER_PART", "PARKED_SLACK"]

Answer = Callable[[bytes, list[Any]], None]  # (identity, frames): send a reply with values


class Refused(str):
    """Why a round cannot complete when nobody died: a push refused (its shape or dtype, forged rows, ...).

    A ``str`` (what a pull's ``fail`` callback takes) that carries the error's class name.
    """

    kind: str

    def __new__(cls, text: str, kind: str) -> Refused:
        self = super().__new__(cls, text)
        self.kind = kind
        return self


class Gather:
    """Collects the parts of one pull / pushpull and sends one reply (or one error).

    Args:
        answer: sends the reply (after the reply to the message being handled).
        node_id: this server's node id (the replies' sender).
        dead_names: the dead workers' names, for a failure.
        identity: where the reply goes.
        header: the request.
        n: the number of parts.
        snapshot: reply with snapshots of the values (an updater changes them in place).
        shared: reply with shared-buffer indices instead of data.
        on_answered: called just before the reply (or error) is sent (see ReplyCache.later).
        squeeze: each part's compressed value (:mod:`pskv.server.squeeze`): the reply then
            carries payloads (``COMPRESSED``, the request's body naming the compression).
        rows: per part of row-sparse keys, the local ids of the rows asked for (None: its
            present rows when it is ready): the reply then carries those rows only (``ROWS``,
            :func:`pskv.protocol.rows_frame`).
        rows_into: per part of ``rows``, the ``(n, w)`` region of the sender's shared rows buffer the
            rows go to (checked to lie in it): the reply then only names the regions (``ROWS`` with ``SHM``).
    """

    __slots__ = ("_answer", "_node_id", "_dead_names", "_identity", "_results", "_remaining", "_header",
                 "_snapshot", "_shared", "_done", "_on_answered", "_squeeze", "_rows", "_rows_into")

    def __init__(self, answer: Answer, node_id: Callable[[], int], dead_names: Callable[[], str], identity: bytes,
                 header: Header, n: int, snapshot: bool, shared: bool = False,
                 on_answered: Callable[[], None] | None = None,
                 squeeze: Callable[[Part], Any] | None = None,
                 rows: list[np.ndarray[Any, Any] | None] | None = None,
                 rows_into: list[np.ndarray[Any, Any]] | None = None) -> None:
        self._squeeze = squeeze
        self._rows = rows
        self._rows_into = rows_into
        self._answer = answer
        self._node_id = node_id
        self._dead_names = dead_names
        self._identity = identity
        self._shared = shared
        self._results: list[Part | None] = [None] * n
        self._remaining = n
        self._header = header
        self._snapshot = snapshot
        self._done = False
        self._on_answered = on_answered

    def _send(self, frames: list[Any]) -> None:
        if self._on_answered is not None:
            self._on_answered()
        self._answer(self._identity, frames)

    def ready(self, i: int, part: Part) -> None:
        """Part ``i`` has completed the round the request waits for: reply if it was the last."""
        if self._done:
            return
        self._results[i] = part
        self._remaining -= 1
        if self._remaining:
            return
        self._done = True
        sender = self._node_id()
        if self._shared:  # the values are in shared memory: name each part's buffer
            named = tuple(ArraySpec(p.key, p.dtype, (p.value.size,), p.offset, p.round, p.buffer_index())
                          for p in self._results if p is not None)
            self._send(reply_frames(self._header, sender, arrays=named, flags=Flag.SHM))
            return
        if self._rows_into is not None:
            self._write_rows(sender)
            return
        if self._rows is not None:
            self._send_rows(sender)
            return
        specs, data = [], []
        squeeze = self._squeeze
        for p in self._results:
            assert p is not None
            data.append(p.wire_value(self._snapshot) if squeeze is None else squeeze(p))
            specs.append(ArraySpec(p.key, p.dtype, (p.value.size,), p.offset, p.round))
        if squeeze is None:
            self._send(reply_frames(self._header, sender, arrays=tuple(specs), data=data))
        else:
            self._send(reply_frames(self._header, sender, self._header.body, tuple(specs), data, Flag.COMPRESSED))

    def _send_rows(self, sender: int) -> None:
        """The rows asked for of each row-sparse part, as they are now (copies), in the rows encoding."""
        assert self._rows is not None
        specs, data = [], []
        for p, asked in zip(self._results, self._rows):
            assert p is not None
            local = asked if asked is not None else p.present
            assert local is not None
            picked = p.table()[local]
            if p.dtype == "bfloat16":
                picked = f32_to_bf16_bits(picked)
            data.append(rows_frame(local + p.first_row, picked))
            specs.append(ArraySpec(p.key, p.dtype, (int(local.size), p.row_width), p.offset, p.round))
        self._send(reply_frames(self._header, sender, arrays=tuple(specs), data=data, flags=Flag.ROWS))

    def _write_rows(self, sender: int) -> None:
        """The rows asked for of each row-sparse part, as they are now, written into the sender's rows buffer
        (after the ids it wrote there); the reply names the regions (``ROWS`` with ``SHM``)."""
        assert self._rows is not None and self._rows_into is not None
        specs = []
        for p, asked, into, spec in zip(self._results, self._rows, self._rows_into, self._header.arrays):
            assert p is not None and asked is not None
            np.take(p.table(), asked, axis=0, out=into, mode="clip")  # ids checked: no bounds check to buffer
            specs.append(spec._replace(round=p.round))
        self._send(reply_frames(self._header, sender, arrays=tuple(specs), flags=Flag.ROWS | Flag.SHM))

    def fail(self, reason: str) -> None:
        """Answer with NodeFailedError naming the dead worker(s) (the round cannot complete), or with
        the error class of a :class:`Refused` reason."""
        if self._done:
            return
        self._done = True
        if isinstance(reason, Refused):
            self._send(error_frames(self._header, self._node_id(), reason.kind, str(reason)))
            return
        self._send(error_frames(self._header, self._node_id(), "NodeFailedError", reason, node=self._dead_names()))


PARKED_PER_PART = 4  # pulled parts one connection may have waiting per part of the shard (a worker has ~1)
PARKED_SLACK = 1024  # and this many more
PARKED_CONNECTIONS = 8  # a worker's connections together: this many times one connection's bound


def _count(table: dict[Any, int], key: Any, delta: int) -> None:
    left = table.get(key, 0) + delta
    if left > 0:
        table[key] = left
    else:
        table.pop(key, None)


class Parking:
    """How many pulled parts each connection, and each worker, has waiting on this server; bounded.

    A pull waits (is parked) until the rounds it needs complete, or until the push it
    names arrives; a peer naming pushes far ahead would park pulls forever. Each
    connection (where the replies go) may have ``PARKED_PER_PART`` x (parts of the shard)
    + ``PARKED_SLACK`` parts waiting, and a worker's connections together
    ``PARKED_CONNECTIONS`` times that; past either a pull is refused (an
    ``InvalidArgumentError`` reply naming the worker). A connection that fills its own
    bound leaves the worker's other connections their room.

    Args:
        shard: the shard (its number of parts scales the bound).
        name: the server's name, for messages.
    """

    def __init__(self, shard: Any, name: Callable[[], str]) -> None:
        self._shard = shard
        self._name = name
        self.held: dict[int, int] = {}  # worker node id -> parts of its pulls not answered yet
        self.held_by: dict[bytes, int] = {}  # reply connection -> parts of its pulls not answered yet

    def limit(self) -> int:
        """The most pulled parts one connection may have waiting now."""
        return PARKED_PER_PART * len(self._shard.parts) + PARKED_SLACK

    def park(self, worker: int, connection: bytes, n: int, then: Callable[[], None] | None) -> Callable[[], None]:
        """Count a pull of ``n`` parts by ``worker`` answered on ``connection`` until it is answered: call the
        result then (it calls ``then``).

        Raises:
            InvalidArgumentError: the connection's or the worker's waiting pulls would pass the bound.
        """
        limit = self.limit()
        held, mine = self.held.get(worker, 0), self.held_by.get(connection, 0)
        if mine + n > limit or held + n > PARKED_CONNECTIONS * limit:
            raise InvalidArgumentError(f"{self._name()}: {node_name(worker)} has pulls of {mine} parts waiting on "
                                       f"this connection ({held} on all); {n} more would pass the bound of {limit} "
                                       f"({PARKED_CONNECTIONS * limit}): refused")
        _count(self.held, worker, n)
        _count(self.held_by, connection, n)

        def answered() -> None:
            _count(self.held, worker, -n)
            _count(self.held_by, connection, -n)
            if then is not None:
                then()
        return answered
