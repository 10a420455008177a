"""The server's data commands: requests that move values in and out of the shard.

``INIT``, ``PUSH``, ``PULL``, ``PUSHPULL``, ``JOIN``, ``SYNC``, ``HELLO`` and ``REJOIN``.
Each validates its request and drives the :class:`~pskv.server.shard.ServerShard`
(the rules live there); a pull's values are sent by a :class:`~pskv.server.gather.Gather`
once every part it names has completed the round it waits for. The INIT of row-sparse keys
is :class:`~pskv.server.row_init.RowInit`'s.

Two kinds of reply: ``reply`` sends at once (acknowledgements; kept for a repeat of the
request), ``answer`` sends values after the reply to the message being handled, so a
worker sees its push acknowledged before any pull that includes it returns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any, TypeAlias

import numpy as np

from pskv.compression import Compressor
from pskv.compression import create as create_compressor
from pskv.errors import InvalidArgumentError, KVStoreError, ProtocolError
from pskv.protocol import TX_PREFIX, ArraySpec, Command, Flag, Header, frame_array, node_name, split_rows
from pskv.protocol.bodies import CompressionParams, Hello, HelloReply, Meeting, Rejoined
from pskv.protocol.replies import reply_frames
from pskv.server.dedup import ReplyCache
from pskv.server.gather import Gather, Parking, Refused
from pskv.server.liveness import DeadWorkers
from pskv.server.routes import Routes
from pskv.server.row_init import MAX_TABLE_BYTES, RowInit
from pskv.server.rows import RowBatch, RowsWhat, SharedRows, checked_ids
from pskv.server.shard import MAX_PUSHES_AHEAD, Part, ServerShard, to_storage
from pskv.server.squeeze import ReplyCompression
from pskv.server.steps import StepOrder

__all__ = ["DataHandlers", "Handler", "Reply"]

log = logging.getLogger("pskv.server")

_COMPRESSORS_KEPT = 8  # compressions of COMPRESSED pushes kept built (one per job, in practice)

Handler: TypeAlias = Callable[[bytes, Header, list[memoryview]], None]  # (identity, header, buffers)
Reply: TypeAlias = Callable[[bytes, list[Any]], None]  # (identity, frames)
Frames: TypeAlias = list[tuple[Part, Any]]  # (part, its pushed values: an array, or a RowBatch)



def _must_wait(part: Part, min_round: int | None) -> bool:
    """True if a pull for ``min_round`` (None: its push has not arrived) cannot be answered now."""
    return min_round is None or part.round < min_round


class DataHandlers:
    """The data commands' handlers, on one shard.

    Args:
        shard: the shard.
        reply: sends a short reply at once (``reply(identity, frames)``).
        answer: sends a reply with values, after the reply to the message being handled.
        node_id: this server's node id (the replies' sender).
        replies: the record of answered requests (what a repeat of a pull gets).
        dead: the workers given up on (their rounds cannot complete).
        routes: a worker's send-only socket -> where its replies go; HELLO fills it.

    Pulls that wait (for a round, or for a push that has not arrived) are bounded per
    worker (:class:`~pskv.server.gather.Parking`): past the bound a pull is refused.
        name: the server's name, for the log.
        max_table_bytes, defer: for the INIT of row-sparse keys (:class:`~pskv.server.row_init.RowInit`).
        fail: the server's one ERROR reply to a request that failed (``ServerCore.fail``).
    """

    def __init__(self, shard: ServerShard, reply: Reply, answer: Reply, node_id: Callable[[], int],
                 replies: ReplyCache, dead: DeadWorkers, routes: Routes, name: Callable[[], str],
                 max_table_bytes: int = MAX_TABLE_BYTES,
                 defer: Callable[[Callable[[], None]], None] | None = None, *,
                 fail: Callable[[bytes, Header, Exception], None]) -> None:
        self._shard = shard
        self._reply = reply
        self._answer = answer
        self._node_id = node_id
        self._replies = replies
        self._dead = dead
        self._routes = routes
        self.parking = Parking(shard, name)
        self._refused: dict[tuple[int, int], tuple[int, Refused]] = {}  # part -> (round, why): refuse_round
        self._name = name
        self.stream_port = 0  # the TCP port of this server's data connections, if it takes them (HELLO says it)
        self._compressors: dict[str, Compressor] = {}  # COMPRESSED pushes' bodies -> their compressors (a few)
        self.squeezed = ReplyCompression()  # COMPRESS_REPLY: the parts' compressed values and residuals
        self._row_init = RowInit(shard, self._ack, fail, name, max_table_bytes, defer)  # INIT of row-sparse keys
        self.steps = StepOrder(shard, self.refuse_round, name)  # mismatched step counts (meeting marks, SYNC)

    @property
    def shared_rows(self) -> SharedRows | None:
        """The rows buffers of workers on this host (ServerCore sets them; the first row-sparse INIT makes them)."""
        return self._row_init.shared

    @shared_rows.setter
    def shared_rows(self, shared: SharedRows | None) -> None:
        self._row_init.shared = shared

    def handlers(self) -> dict[Command, Handler]:
        """The handler of each data command."""
        return {
            Command.INIT: self.init,
            Command.PUSH: self.push,
            Command.PULL: self.pull,
            Command.PUSHPULL: self.pushpull,
            Command.HELLO: self.hello,
            Command.SYNC: self.sync,
            Command.JOIN: self.join,
            Command.REJOIN: self.rejoin,
        }

    def _ack(self, identity: bytes, header: Header) -> None:
        self._reply(identity, reply_frames(header, self._node_id()))

    @staticmethod
    def _frames(header: Header, buffers: list[memoryview]) -> list[tuple[ArraySpec, np.ndarray[Any, Any]]]:
        return [(spec, frame_array(spec, buf)) for spec, buf in zip(header.arrays, buffers)]

    # -- init / push ----------------------------------------------------------------------
    def init(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """Create keys (a restored key keeps its value), or overwrite existing ones (``OVERWRITE``: a broadcast)."""
        if header.flags & Flag.ROWS:
            self._row_init(identity, header, buffers)
            return
        items = self._frames(header, buffers)
        if header.flags & Flag.OVERWRITE:  # broadcast to existing keys
            parts = [(self._dense(self._shard.check(spec.key, spec.offset, spec.dtype, data.size, "broadcast"),
                                  header, "broadcast"), data) for spec, data in items]
            for part, data in parts:  # in place: everyone finished reading at the barrier before (through the
                self._shard.observer.applied(part, self._shard.overwrite, part, data)  # observer: elastic copy first)
                self.squeezed.forget(part)
            self._ack(identity, header)
            return
        for spec, _ in items:
            existing = self._shard.parts.get((spec.key, spec.offset))
            if existing is not None and not existing.restored:
                raise KVStoreError(f"duplicate init of key {self._shard.named(spec.key)}")
        summed = bool(header.flags & Flag.SUMMED)
        for spec, data in items:
            if not self._shard.accept_init(spec.key, spec.offset, spec.dtype, data.size):  # restored: kept
                self._shard.init(spec.key, spec.offset, spec.dtype, data, summed=summed)
        self._ack(identity, header)

    def _dense(self, part: Part, header: Header, op: str) -> Part:
        """``part``, which a message with dense values names: refused if it is row-sparse.

        Raises:
            InvalidArgumentError: a row-sparse part.
        """
        if part.row_width:
            raise InvalidArgumentError(f"{op} of key {self._shard.named(part.key)} from {node_name(header.sender)}: "
                                       "a row-sparse key takes rows (the ROWS encoding), not a dense value")
        return part

    def _rows_part(self, spec: ArraySpec, header: Header, op: str) -> tuple[Part, RowsWhat]:
        """The row-sparse part a ROWS spec names, and how to name it in errors.

        Raises:
            UnknownKeyError: no such part.
            InvalidArgumentError: a dense part, another dtype or row width.
        """
        part = self._shard.part(spec.key, spec.offset, op)
        # every rows message makes ``what``: its text, with a str key's name (a lookup), is made for an error only
        what = RowsWhat(op, spec.key, header.sender, self._shard.named)
        if not part.row_width:
            raise InvalidArgumentError(f"{what}: the key is dense here (rows were sent for it)")
        if spec.dtype != part.dtype or spec.shape[1] != part.row_width:
            raise InvalidArgumentError(f"{what}: rows of {spec.shape[1]} {spec.dtype} do not fit its rows of "
                                       f"{part.row_width} {part.dtype}")
        return part, what

    def _rows_pushed(self, header: Header, buffers: list[memoryview], op: str) -> Frames:
        """Each part of a ROWS push, checked (part, dtype, width, ids sorted, unique, in its range), with its rows.

        With ``SHM`` the ids and rows are in the sender's rows buffer: copied out here, before the push is
        acknowledged (the worker reuses the region once it is).
        """
        if header.flags & Flag.SHM:
            return [(part, RowBatch(checked_ids(ids.copy(), part.first_row, part.num_rows, what), rows.copy()))
                    for part, what, ids, rows in self._shared_rows(header, op)]
        out: Frames = []
        for spec, buf in zip(header.arrays, buffers):
            part, what = self._rows_part(spec, header, op)
            ids, rows = split_rows(spec, buf)
            out.append((part, RowBatch(checked_ids(ids, part.first_row, part.num_rows, what),
                                       to_storage(part.dtype, rows))))
        return out

    def _shared_rows(self, header: Header, op: str
                     ) -> list[tuple[Part, RowsWhat, np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
        """Each part a ``ROWS`` ``SHM`` message names, checked, with views of its ids and rows in the sender's
        rows buffer (the region checked to lie inside it).

        Raises:
            InvalidArgumentError: no rows buffers here, a region outside the sender's buffer, a bad part.
        """
        shared = self.shared_rows
        out = []
        for spec in header.arrays:
            part, what = self._rows_part(spec, header, op)
            if shared is None:
                raise InvalidArgumentError(f"{what}: rows in shared memory, but this server keeps none")
            out.append((part, what, *shared.region(header.sender, spec, what)))
        return out

    def _pushed(self, header: Header, buffers: list[memoryview], op: str) -> Frames:
        """Each part a PUSH / PUSHPULL names, checked (key, dtype, size), with its pushed data.

        The data is the message's frame or, with ``SHM``, the sender's shared slot of the
        part; both paths pass the same check, so a worker that disagrees on a key's dtype
        or size is refused either way.
        """
        if header.flags & Flag.ROWS:
            return self._rows_pushed(header, buffers, op)
        if header.flags & Flag.COMPRESSED:
            return self._decompressed(header, buffers, op)
        if not header.flags & Flag.SHM:
            return [(self._dense(self._shard.check(spec.key, spec.offset, spec.dtype, data.size, op), header, op), data)
                    for spec, data in self._frames(header, buffers)]
        out = []
        for spec in header.arrays:
            part = self._shard.check(spec.key, spec.offset, spec.dtype, spec.size, op)
            slot = part.slots.get(header.sender)
            if slot is None:
                raise InvalidArgumentError(f"{op} of key {self._shard.named(spec.key)}: the part has no shared slot "
                                           "for this worker")
            out.append((part, slot))
        return out

    def _compressor(self, header: Header) -> Compressor:
        """The compression a message's body names (the last few kept built: a worker names the same one each time).

        Raises:
            ProtocolError: a bad body.
            InvalidArgumentError: bad parameters.
        """
        compressor = self._compressors.get(header.body)
        if compressor is None:
            compressor = create_compressor(CompressionParams.parse(header).params)
            if len(self._compressors) >= _COMPRESSORS_KEPT:
                self._compressors.pop(next(iter(self._compressors)))
            self._compressors[header.body] = compressor
        return compressor

    def _decompressed(self, header: Header, buffers: list[memoryview], op: str) -> Frames:
        """Each part of a COMPRESSED push, checked, with the float32 values its payload decodes to.

        The body names the compression (:class:`CompressionParams`); the last few are kept
        built (a worker sends the same one with every push).

        Raises:
            ProtocolError: a bad body, or a part that is not float32.
            InvalidArgumentError: bad parameters, or a payload of the wrong length.
        """
        compressor = self._compressor(header)
        out = []
        for spec, buf in zip(header.arrays, buffers):
            if spec.dtype != "float32":
                raise ProtocolError(f"{op} of key {self._shard.named(spec.key)}: a compressed part must be float32, "
                                    f"not {spec.dtype}")
            part = self._dense(self._shard.check(spec.key, spec.offset, spec.dtype, spec.size, op), header, op)
            out.append((part, compressor.decompress(buf, spec.size)))
        return out

    def _apply_pushes(self, header: Header, buffers: list[memoryview], op: str) -> list[tuple[Part, int]]:
        """Validate and apply every push of a PUSH / PUSHPULL message: ``[(part, round joined)]``.

        Each spec's ``round`` is the push's number (the sender's ``n``-th push of that part;
        0: its next). A number that arrived already — a replayed message, or a replacement
        process pushing again what its predecessor's push had delivered — is not applied
        again: its part gets the round that push joined (:meth:`ServerShard.landed`). Each
        part the message names counts as pushed even when the message is refused
        (:meth:`_refuse_pushes`): the worker counted it when sending, and its pulls
        name pushes by number.
        """
        sender, arrays = header.sender, header.arrays
        try:
            checked = self._pushed(header, buffers, op)
            if len(checked) == 1:  # the usual message: one push (no lists of one)
                number = arrays[0].round
                repeated = self._shard.landed(checked[0][0], sender, number)
            else:
                numbers = [a.round for a in arrays]
                repeats = [self._shard.landed(part, sender, n) for (part, _), n in zip(checked, numbers)]
        except Exception as exc:
            self._refuse_pushes(header, exc)
            raise
        if len(checked) != 1:
            joined = self._push_each(header, checked, numbers, repeats)
        elif not repeated:
            part, data = checked[0]
            joined = [(part, self._shard.push(part, sender, data, number))]
        else:
            joined = self._push_each(header, checked, [number], [True])
        if self.steps.watch:  # a worker is at a meeting that another's pushes may come from before: checked
            self.steps.pushed([part for part, _ in joined], sender)
        return joined

    def _push_each(self, header: Header, checked: Frames, numbers: list[int],
                   repeats: list[bool]) -> list[tuple[Part, int]]:
        """:meth:`_apply_pushes` of several parts, or of repeated pushes (not applied again, logged)."""
        sender = header.sender
        joined = []
        for n, ((part, data), number) in enumerate(zip(checked, numbers)):
            if repeats[n]:
                joined.append((part, self._shard.joined_round(part, sender, number)))
                continue
            try:
                joined.append((part, self._shard.push(part, sender, data, number)))
            except Exception:  # that push counted itself; the rest of the message never runs
                for (later, _), m in zip(checked[n + 1:], numbers[n + 1:]):
                    self._shard.skip_push(later, sender, m)
                raise
        if any(repeats):
            first = repeats.index(True)
            log.warning("%s: %s: %d push(es) of %s had arrived already (key %d push %d, ...): not applied again",
                        self._name(), header.command.name, sum(repeats), node_name(sender), header.arrays[first].key,
                        numbers[first])
        return joined

    def _counted_parts(self, header: Header) -> list[Part]:
        """The existing parts a refused push message names whose push numbers :meth:`_refuse_pushes`
        counts: new ones (not a repeat of a push that arrived, not a number no worker sends)."""
        counted = []
        for spec in header.arrays:
            part = self._shard.parts.get((spec.key, spec.offset))
            if part is None:
                continue
            log = part.pushes.get(header.sender)
            count = 0 if log is None else log.count
            if spec.round > count + MAX_PUSHES_AHEAD or (log is not None and log.landed(spec.round)):
                continue
            counted.append(part)
        return counted

    def _refuse_pushes(self, header: Header, exc: Exception) -> None:
        """A push message refused (its shape or dtype, forged rows, a bad payload, ...): every part it
        names counts the push without its value. In sync mode each such push (:meth:`_counted_parts`)
        holds its worker's place in the round it would have joined, which completes changing nothing
        (:meth:`ServerShard.void_push`): the other workers' pulls of that round fail now, and later
        ones at once, with the same error (its class, naming the sender and what was wrong) — not
        after the request timeout — and every worker's next round is the same.
        """
        if not self._shard.sync:
            self._skip_pushes(header)
            return
        sender, numbers = header.sender, {(a.key, a.offset): a.round for a in header.arrays}
        for part in {(p.key, p.offset): p for p in self._counted_parts(header)}.values():
            ahead = 1 + len(part.queued.get(sender, ())) if sender in part.pushed else 0  # the round it joins
            reason = Refused(f"{node_name(sender)}'s {exc}: sync round {part.round + 1 + ahead} of key "
                             f"{self._shard.named(part.key)} cannot complete", type(exc).__name__)
            self._shard.void_push(part, sender, numbers[(part.key, part.offset)], reason)

    def refuse_round(self, part: Part, reason: Refused, sender: int = -1) -> None:
        """``part``'s open sync round cannot complete: its waiting pulls fail now with ``reason``, and so
        do later ones that need it (:meth:`_refusal`), on every worker; pulls of ``sender`` that wait for
        a push of its own to arrive keep waiting (it counted that push)."""
        self._refused[(part.key, part.offset)] = (part.round + 1, reason)
        waiting, part.waiting = part.waiting, []
        early = [e for e in part.early if e[0] != sender]
        part.early = [e for e in part.early if e[0] == sender]
        for fail in [w[2] for w in waiting] + [e[3] for e in early]:
            if fail is not None:
                fail(reason)

    def _refusal(self, parts: list[tuple[Part, int]], sender: int, by_push: bool) -> Refused | None:
        """The refusal (:meth:`refuse_round`) a pull of ``parts`` would wait on forever, if any."""
        for part, r in parts:
            refused = self._refused.get((part.key, part.offset))
            if refused is None:
                continue
            if part.round >= refused[0]:  # completed after all (the worker pushed again)
                del self._refused[(part.key, part.offset)]
                continue
            needed = self._shard.round_of_push(part, sender, r) if by_push else r
            if needed is None or needed >= refused[0]:
                return refused[1]
        return None

    def _skip_pushes(self, header: Header) -> None:
        """Count every existing part a refused push message names (see :meth:`_apply_pushes`)."""
        numbers = {(a.key, a.offset): a.round for a in header.arrays}
        for pid, number in numbers.items():
            part = self._shard.parts.get(pid)
            if part is not None:
                self._shard.skip_push(part, header.sender, number)

    def push(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """Apply the pushes; acknowledged unless ``QUIET`` (then only a failure is answered)."""
        self._apply_pushes(header, buffers, "push")
        if not header.flags & Flag.QUIET:
            self._ack(identity, header)  # a bare acknowledgement
        # else the worker learns it succeeded from its next reply (a failure is answered)

    # -- pull -----------------------------------------------------------------------------
    def pull(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """The parts the specs name (``round``: the sender's push number), once those pushes' rounds completed.

        Each named part is checked like a push (key, dtype, size); with ``SHM`` the reply
        names shared buffers instead of carrying the values. With ``ROWS`` each frame names
        rows of a row-sparse part (checked as a push's): the reply carries those rows only;
        with ``PRESENT`` too, the part's present rows.
        """
        if header.flags & Flag.ROWS:
            wanted: list[tuple[Part, int]] = []
            rows: list[np.ndarray[Any, Any] | None] = []
            present = bool(header.flags & Flag.PRESENT)  # each part's present rows, as of the round it waits for
            if header.flags & Flag.SHM:  # ids in the sender's rows buffer; the rows go after them (Gather)
                into = []
                for (part, what, ids, out), spec in zip(self._shared_rows(header, "row_sparse_pull"), header.arrays):
                    rows.append(checked_ids(ids.copy(), part.first_row, part.num_rows, what))
                    wanted.append((part, spec.round))
                    into.append(out)
                self.gather(identity, header, wanted, by_push=True, rows=rows, rows_into=into)
                return
            for spec, buf in zip(header.arrays, buffers):
                part, what = self._rows_part(spec, header, "pull" if present else "row_sparse_pull")
                ids, _ = split_rows(spec, buf, ids_only=True)
                rows.append(None if present else checked_ids(ids, part.first_row, part.num_rows, what))
                wanted.append((part, spec.round))
            self.gather(identity, header, wanted, by_push=True, rows=rows)
            return
        parts = [(self._shard.check(a.key, a.offset, a.dtype, a.size, "pull"), a.round) for a in header.arrays]
        self.gather(identity, header, parts, shared=bool(header.flags & Flag.SHM), by_push=True)

    def pushpull(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """Apply the pushes, then reply with the values of the rounds they joined."""
        joined = self._apply_pushes(header, buffers, "pushpull")
        self.gather(identity, header, joined, shared=bool(header.flags & Flag.SHM))

    def gather(self, identity: bytes, header: Header, parts: list[tuple[Part, int]], shared: bool = False,
               by_push: bool = False, rows: list[np.ndarray[Any, Any] | None] | None = None,
               rows_into: list[np.ndarray[Any, Any]] | None = None) -> None:
        """Reply with every part's value once each has completed its round.

        Each part comes with the round it must include or, with ``by_push``, the number
        of the sender's push of that part whose round it must include (a push that has
        not arrived yet is waited for). Also answers a repeated pushpull (ReplyCache).

        If a worker has died, a round that still needs pushes can never complete: the
        request fails at once with NodeFailedError naming the dead worker(s).
        ``rows_into``: per part, where in the sender's rows buffer its rows go (rows in shared memory).
        """
        if not parts:
            self._ack(identity, header)
            return
        if shared:
            for part, _ in parts:
                if part.buffers is None:
                    raise InvalidArgumentError("a shared-memory pull names a part that is not in shared memory")
        on_answered = self._replies.later(parts if header.command is Command.PUSHPULL else None, shared)
        on_answered = self.parking.park(header.sender, identity, len(parts), on_answered)
        squeeze = None
        if header.flags & Flag.COMPRESS_REPLY and self._shard.updater is None and not shared and all(
                part.dtype == "float32" for part, _ in parts):  # sums of gradients: compressed (else values as they are)
            squeeze = partial(self.squeezed.payload, compressor=self._compressor(header))
        gather = Gather(self._answer, self._node_id, self._dead.names, identity, header, len(parts),
                        snapshot=self._shard.updater is not None, shared=shared, on_answered=on_answered,
                        squeeze=squeeze, rows=rows, rows_into=rows_into)
        sender = header.sender
        refused = self._refusal(parts, sender, by_push) if self._refused else None
        if refused is not None:
            gather.fail(refused)
            return
        if self._dead.dead and self._shard.sync and any(
            _must_wait(part, self._shard.round_of_push(part, sender, r) if by_push else r) for part, r in parts
        ):
            gather.fail(self._dead.reason())
            return
        if self._dead.left:  # a worker that left never pushes the rounds this may wait for
            left = self._dead.left_reason([(p, self._shard.round_of_push(p, sender, r) if by_push else r)
                                           for p, r in parts])
            if left is not None:
                gather.fail(left)
                return
        for i, (part, r) in enumerate(parts):
            ready = partial(gather.ready, i)
            if by_push:
                self._shard.pull_after_push(part, sender, r, ready, gather.fail)
            else:
                self._shard.pull(part, r, ready, gather.fail)

    # -- session --------------------------------------------------------------------------
    def hello(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """A worker's send-only socket gets its replies on this (the HELLO's) socket.

        Only messages arriving from that socket are rerouted: a peer can redirect the
        answers to its own requests, no one else's.
        """
        tx = Hello.parse(header).tx  # none from a local connection: it carries its own replies
        if tx:
            self._routes.add(TX_PREFIX + tx.encode(), identity, header.sender)
        body = HelloReply(self.stream_port).encode() if tx else ""  # a ZeroMQ session: its data port
        self._reply(identity, reply_frames(header, self._node_id(), body))

    def sync(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """Answered at once: confirms the worker's earlier (quiet) messages were handled. With a
        :class:`Meeting` body, the worker arrives at a meeting (:class:`~pskv.server.steps.StepOrder`)."""
        if header.body:
            self.steps.marked(header.sender, Meeting.parse(header))
        self._ack(identity, header)

    def join(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """The sender ran out of data: rounds that only waited for it complete (ServerShard.join)."""
        completed = self._shard.join(header.sender)
        if completed:
            log.info("%s: %s joined; %d round(s) completed without it", self._name(), node_name(header.sender),
                     len(completed))
        self._ack(identity, header)

    def rejoin(self, identity: bytes, header: Header, buffers: list[memoryview]) -> None:
        """A replacement process of a dead worker: answered with its rank's push counts (:class:`Rejoined`).

        The replacement numbers its pushes on from them, so a push its predecessor made
        is never applied twice (DeadWorkers.rejoined, ServerShard.replaced).
        """
        counts = self._dead.rejoined(header.sender)
        self.steps.forget(header.sender)  # a replacement's meetings are not counted: it marks none
        self._reply(identity, reply_frames(header, self._node_id(), Rejoined(tuple(counts)).encode()))
