"""``KVWorker``: the key-value API of a worker process (ps-lite's ``KVWorker``).

The MXNet-API store (:mod:`pskv.kvstore.dist`) decides *what* to send — which keys,
which locally reduced values, in which order, under which engine — and calls this
layer, which decides *how*:

* the layout of a key on the servers (:meth:`KVWorker.layout`, :mod:`pskv.worker.layout`);
* one message per server (and per socket / shared-memory path) per call, holding
  every part of every key of the call (its specs; ``SHM`` / ``QUIET`` / init options as
  header flags: no body on the data path, :mod:`pskv.protocol.messages`) — through a
  socket, messages of at most ``PSKV_PART_BYTES`` of values, so big values are pipelined;
* per part, the number of pushes sent (a pull names "the round of my ``n``-th push");
* the shared-memory parts (:mod:`pskv.worker.shared`), the quiet pushes
  (:mod:`pskv.worker.quiet`, through the client) and the push log replayed to a
  replacement server (:mod:`pskv.worker.replay`);
* the replies: checked against the layout (a mismatch raises
  :class:`~pskv.errors.ProtocolError`), split values assembled;
* the control commands sent to every server, and the membership calls (barrier,
  dead nodes, shutdown).

Sending returns an :class:`Exchange` (the messages of one call and their pending
replies) at once; :meth:`KVWorker.values` and :meth:`KVWorker.wait_acks` wait for it.
Nothing here knows the engine, MXNet's collectives or key normalisation.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from pskv.arrays import ArrayMeta, empty, from_wire, itemsize
from pskv.cluster import NodeInfo
from pskv.compression import Compressor, Residuals, create
from pskv.config import ClusterConfig
from pskv.errors import CollectiveFailedError, KVStoreError, ProtocolError
from pskv.partition import row_ranges, server_key, split
from pskv.protocol import ArraySpec, Command, Flag, Header, Role, frame_array, node_name
from pskv.protocol.bodies import (
    CheckpointRequest,
    CheckpointSaved,
    CompressionParams,
    ControllerCall,
    Failure,
    InitBody,
    OptimizerConfig,
    SetMode,
    StatesRequest,
)
from pskv.timeline import Timeline, open_timeline
from pskv.worker import spans
from pskv.worker.client import WorkerClient, WorkerRequest
from pskv.worker.layout import KeyLayout, Part, by_server, part_spec, part_view
from pskv.worker.replay import ReplayLog
from pskv.worker.residuals import SavedResiduals, read_residuals, write_residuals
from pskv.worker.rows import RowPiece, assemble, grouped, messages, pieces, socket_message
from pskv.worker.shared import RowsBuffer, SharedParts, read_rows, write_rows, write_slots

__all__ = ["BIG_CALL_BYTES", "Exchange", "KVWorker"]

log = logging.getLogger("pskv.worker")

_COMPRESSING: ThreadPoolExecutor | None = None
_COMPRESSING_LOCK = threading.Lock()


def _compressing() -> ThreadPoolExecutor:
    """Two threads that compress push payloads (NumPy and Numba's loops let go of the GIL), made once."""
    global _COMPRESSING
    with _COMPRESSING_LOCK:
        if _COMPRESSING is None:
            _COMPRESSING = ThreadPoolExecutor(2, thread_name_prefix="pskv-compress")
        return _COMPRESSING

#: A push or pull of at least this many bytes of values is "big": a big push is always
#: acknowledged (one small reply per message of megabytes), so the pull behind it may
#: overtake it on the reply connection (:meth:`WorkerClient.request`, ``overtake``) and its
#: results flow back while the pushed pieces are still on the wire.
BIG_CALL_BYTES = 1 << 20

class Exchange:
    """The messages of one call: per message the parts it carries and its pending reply.

    ``replies`` are what an engine ``Deferred`` waits for (one per message).
    """

    __slots__ = ("messages", "replies", "rows", "__weakref__")

    def __init__(self) -> None:
        self.messages: list[tuple[list[Part], WorkerRequest]] = []
        self.replies: list[WorkerRequest] = []
        # a row pull's messages (pull_rows): pieces, reply, whether it asked for the present rows, and
        # (rows in shared memory) the rows buffer, the region and the specs naming it
        self.rows: list[tuple[list[RowPiece], WorkerRequest, bool, Any]] = []


class KVWorker:
    """A worker's key-value requests to the servers; owns the :class:`WorkerClient`.

    Args:
        cluster: the cluster contract.
        context: ZeroMQ context (a new one by default).
        sync: the store is synchronous (shared memory serves sync stores only).
        client: the connection to use (default: a new :class:`WorkerClient`; tests pass
            one connected in process, :mod:`pskv.testing.loopback`).
    """

    def __init__(self, cluster: ClusterConfig, context: Any = None, *, sync: bool = True,
                 client: WorkerClient | None = None) -> None:
        self._cluster = cluster
        self._sync = sync
        self._rank = -1
        self._num_servers = 0
        self._shared = SharedParts((), False)
        # With PSKV_SERVER_RECOVERY every push since the newest checkpoint is kept (copied).
        self._replay = ReplayLog() if cluster.server_recovery else None
        # A weak reference: a bound method would make worker and client a reference cycle
        # (the push log's copies would then live until the garbage collector runs).
        recover = weakref.WeakMethod(self._recover_server)

        def on_server_replaced(server: int) -> None:
            method = recover()
            if method is not None:
                method(server)
        self.client = client if client is not None else WorkerClient(
            cluster, context, on_server_replaced=on_server_replaced if cluster.server_recovery else None)
        self.compressor: Compressor | None = None  # set_compressor
        self._both_ways = False  # replies of compressed keys' sums come compressed too
        self._min_size = 0  # keys of fewer elements are not compressed
        self._compression_body = ""  # the compression, as every compressed push names it
        self._residuals = Residuals()  # per (server key, part): what compression left out
        self._compression_params: dict[str, Any] = {}  # as set_gradient_compression's (saved with residuals)
        # residuals read from a checkpoint, by server key then offset: taken when the keys are created (adopt)
        self._restored: dict[int, dict[int, np.ndarray[Any, Any]]] = {}
        self._restored_from = ""
        self.timeline: Timeline | None = None  # PSKV_TIMELINE: this worker's spans (opened at connect)

    # -- life cycle ---------------------------------------------------------------------
    def connect(self) -> NodeInfo:
        """Register with the scheduler and connect to every server (see :meth:`WorkerClient.connect`).

        Raises:
            OperationTimeoutError: the cluster did not assemble within the startup timeout.
        """
        info = self.client.connect()
        self._rank = info.rank
        self._num_servers = info.num_servers
        self._shared = SharedParts(info.server_shm, self._cluster.uses_shm and self._sync, self._cluster.shm_rows_bytes)
        self.timeline = open_timeline(self._cluster.timeline, "worker", info.rank, self._cluster.restart_count,
                                      info.recovery)
        return info

    def close(self, layouts: Iterable[KeyLayout] = ()) -> None:
        """Fail what still waits, release the connection, and drop ``layouts``' buffers (idempotent).

        A layout's shared-memory maps and reduce buffers are released here, when nothing
        uses them any more, rather than whenever the store object is collected (a store
        kept alive by a reference cycle would otherwise hold its maps: 10,000 keys of them
        exhausted the process's mmap limit once).
        """
        self.client.close()
        if self.timeline is not None:
            self.timeline.close()
        self._shared.rows.clear()  # the rows buffers' maps
        for rec in layouts:
            rec.shm = []
            rec.send = rec.recv = rec.outgoing = None
            rec.acks = []

    def _limit(self, timeout: float | None) -> float:
        return self._cluster.request_timeout if timeout is None else timeout

    def set_compressor(self, compressor: Compressor, both_ways: bool = False, min_size: int = 0) -> None:
        """Compress the pushes of float32 keys initialised from now on (not ``summed`` ones).

        Each part is compressed with this worker's residual of it; through a socket the
        message carries the payloads (:data:`Flag.COMPRESSED`, the compression named in
        its body), through shared memory the slot gets the values they decode to.
        ``both_ways``: pulls and pushpulls of those keys through a socket ask the servers
        to compress the values they send back (:data:`Flag.COMPRESS_REPLY`; the servers
        do when the values are sums: no optimizer on them).
        """
        self.compressor = compressor
        self._both_ways = both_ways
        self._min_size = min_size
        self._compression_body = CompressionParams(compressor.params).encode()
        self._compression_params = {**compressor.params, **({"both_ways": True} if both_ways else {}),
                                    **({"min_size": min_size} if min_size else {})}

    # -- layouts ------------------------------------------------------------------------
    def layout(self, key: int | str, meta: ArrayMeta, sparse: bool = False) -> KeyLayout:
        """The layout of a new key whose values are described by ``meta``; ``sparse``: a row-sparse key
        (its rows split by server ranges, :func:`pskv.partition.row_ranges`)."""
        skey = server_key(key)
        size = itemsize(meta.dtype)
        if sparse:
            width = meta.size // meta.shape[0] if meta.shape[0] else 0
            ranges = row_ranges(meta.shape[0], self._num_servers)
            return KeyLayout(key, skey, meta, [(s, first * width, count * width) for s, first, count in ranges],
                             [0] * len(ranges), nbytes=meta.size * size, itemsize=size, row_width=width)
        # async servers apply each push of a part through the updater alone: no pieces there
        max_part = max(self._cluster.part_bytes // size, 1) if self._cluster.part_bytes and self._sync else 0
        parts = split(skey, meta.size, self._num_servers, self._cluster.bigarray_bound, max_part)
        return KeyLayout(key, skey, meta, parts, [0] * len(parts), nbytes=meta.size * size, itemsize=size)

    def adopt(self, layouts: Sequence[KeyLayout], summed: bool) -> None:
        """New keys of this worker (every worker's, whoever sends the init): ``summed`` ones store
        plain sums; the others' float32 pushes are compressed if a compressor is set."""
        for rec in layouts:
            rec.summed = summed
            rec.compress = (self.compressor is not None and rec.meta.dtype == "float32" and not summed
                            and rec.meta.size >= self._min_size)
        if self._restored:
            self._take_restored(layouts)

    def attach(self, layouts: Sequence[KeyLayout]) -> None:
        """Map the shared-memory parts of ``layouts`` (once the servers created them: after init)."""
        self._shared.attach(layouts, self.client.node_id, self._rank)

    def resume(self, layouts: Sequence[KeyLayout]) -> None:
        """A replacement process (REJOIN): number each key's pushes on from those of this rank that arrived.

        A key whose parts got different numbers of pushes (the old process died between
        the messages of one push) starts at the fewest: pushing that step again is applied
        only where it had not arrived (the servers ignore a push number they have).
        """
        landed = self.client.landed
        for rec in layouts:
            count = min(landed.get((rec.skey, offset), 0) for _, offset, _ in rec.parts)
            rec.pushes = [count] * len(rec.parts)

    # -- key-value requests -------------------------------------------------------------
    def init(self, layouts: Sequence[KeyLayout], *, summed: bool = False, overwrite: bool = False,
             priority: int = 0, timeout: float | None = None) -> None:
        """Set the keys' values on the servers from their ``outgoing`` buffers; waits for every answer.

        ``summed``: rounds store the plain sum (no optimizer); ``overwrite``: replace an
        existing value (broadcast).

        Raises:
            RemoteError, NodeFailedError, OperationTimeoutError, ProtocolError.
        """
        flags = Flag.OVERWRITE if overwrite else Flag.SUMMED if summed else 0
        self.values(self._send(Command.INIT, layouts, priority, flags), timeout)

    # -- row-sparse keys (pskv.worker.rows) ------------------------------------------------
    def init_rows(self, items: Sequence[tuple[KeyLayout, np.ndarray[Any, Any], np.ndarray[Any, Any],
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
            pendings.append(self.client.request(server, Command.INIT, specs, frames, body, timeout=limit,
                                                flags=Flag.ROWS | (Flag.SUMMED if summed else 0)))
        for pending in pendings:
            pending.wait(limit)

    def push_rows(self, items: Sequence[tuple[KeyLayout, np.ndarray[Any, Any], np.ndarray[Any, Any]]],
                  priority: int = 0, timeout: float | None = None, quiet: bool = False) -> Exchange:
        """Push rows of row-sparse keys: per key ``(layout, sorted unique ids, rows (n, width))``.

        Every part of each key gets this push (no rows where it has none: its server's sync
        round needs every worker's push); counted per part like a dense push.
        """
        sent = Exchange()
        limit = self._limit(timeout)
        start = time.monotonic() if self.timeline is not None else 0.0
        traced: list[spans.Sent] | None = [] if self.timeline is not None else None
        cut = [piece for rec, ids, rows in items for piece in pieces(rec, ids, rows, True)]
        nbytes = sum(rows.nbytes for _, _, _, rows in cut if rows is not None)
        big = nbytes >= BIG_CALL_BYTES
        self._count(nbytes, 0, push=True)
        for server, group in grouped(cut, self._cluster.max_message_bytes, "push").items():
            buffer = self._shared.rows.get(server)
            placed = write_rows(buffer, group, True, pull=False) if buffer is not None else None
            if placed is not None:  # answered (never quiet): the region is free again once the server read it
                region, specs = placed
                pending = self.client.request(server, Command.PUSH, specs, priority=priority, timeout=limit,
                                              flags=Flag.ROWS | Flag.SHM)
                region.pending = pending
            else:
                specs, frames = socket_message(group, True)
                pending = self.client.request(server, Command.PUSH, specs, frames, priority=priority, timeout=limit,
                                              quiet=quiet and not big, flags=Flag.ROWS)
                if self._replay is not None:  # kept until the next checkpoint
                    self._replay.record(server, Command.PUSH, pending, specs, frames, Flag.ROWS, "")
            for rec, i, _, _ in group:
                rec.pushes[i] += 1
            sent.messages.append(([(rec, i) for rec, i, _, _ in group], pending))
            sent.replies.append(pending)
            if traced is not None:
                traced.append((spans.rows(group), pending))
        for rec, _, _ in items:
            rec.acks = sent.replies
        if traced is not None:
            spans.watch(self.timeline, "push", start, traced)  # type: ignore[arg-type]
        return sent

    def pull_rows(self, items: Sequence[tuple[KeyLayout, np.ndarray[Any, Any]]], priority: int = 0,
                  timeout: float | None = None, present: bool = False) -> Exchange:
        """Ask the servers for rows of row-sparse keys (per key: sorted unique ids), as of this worker's
        last push of each part; only the servers holding some of them are asked (:meth:`rows_values`).
        ``present``: every part's present rows instead (the ids given are ignored)."""
        sent = Exchange()
        limit = self._limit(timeout)
        start = time.monotonic() if self.timeline is not None else 0.0
        cut = [piece for rec, ids in items for piece in (
            pieces(rec, np.zeros(0, np.int64), None, True) if present else pieces(rec, ids, None, False))]
        self._count(0, 0, push=False)
        for server, group in grouped(cut, self._cluster.max_message_bytes, "row_sparse_pull").items():
            buffer = None if present else self._shared.rows.get(server)
            placed = write_rows(buffer, group, False, pull=True) if buffer is not None else None
            if placed is not None:  # the server writes the rows after the ids; the region is held until read
                region, specs = placed
                pending = self.client.request(server, Command.PULL, specs, priority=priority, timeout=limit,
                                              flags=Flag.ROWS | Flag.SHM)
                region.pending = pending
                sent.rows.append((group, pending, present, (buffer, region, specs)))
                weakref.finalize(sent, RowsBuffer.release, region)  # also if nobody reads the rows
            else:
                specs, frames = socket_message(group, False)
                pending = self.client.request(server, Command.PULL, specs, frames, priority=priority, timeout=limit,
                                              flags=Flag.ROWS | (Flag.PRESENT if present else 0))
                sent.rows.append((group, pending, present, None))
            sent.replies.append(pending)
        if self.timeline is not None:
            spans.watch(self.timeline, "pull", start, [(spans.rows(g), p) for g, p, _, _ in sent.rows])
        return sent

    def rows_values(self, sent: Exchange, timeout: float | None = None
                    ) -> dict[int, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
        """Wait for a row pull's replies: per key (``id`` of its layout) the ids asked and their rows ``(n, width)``.

        Raises:
            ProtocolError: a reply's rows are not those asked for.
            RemoteError, NodeFailedError, OperationTimeoutError: from the requests.
        """
        limit = self._limit(timeout)
        start = time.monotonic() if self.timeline is not None else 0.0
        got: dict[int, list[tuple[int, np.ndarray[Any, Any], np.ndarray[Any, Any]]]] = {}
        try:
            for group, pending, present, shared in sent.rows:
                header = self._wait(pending, limit)
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
        if self.timeline is not None:
            spans.waited(self.timeline, start, [(spans.rows(g), p) for g, p, _, _ in sent.rows])
        return out

    def push(self, layouts: Sequence[KeyLayout], priority: int = 0, timeout: float | None = None,
             quiet: bool = False) -> Exchange:
        """Send the ``outgoing`` buffers of ``layouts`` (one message per server); counts the pushes.

        A ``quiet`` push is answered only if it fails (see :meth:`confirm`); a big one
        (:data:`BIG_CALL_BYTES`) is acknowledged anyway. Its replies become the keys' ``acks``: their buffers are reused only once those are done
        (:meth:`await_acks`).
        """
        nbytes = sum(rec.nbytes for rec in layouts)
        big = nbytes >= BIG_CALL_BYTES
        self._count(nbytes, 0, push=True)
        start = time.monotonic() if self.timeline is not None else 0.0
        sent = self._sends(Command.PUSH, layouts, priority, timeout=timeout, quiet=quiet and not big)
        for rec in layouts:
            rec.acks = sent.replies
        if self.timeline is not None:
            spans.watch(self.timeline, "push", start, [(spans.dense(items), p) for items, p in sent.messages])
        return sent

    def pushpull(self, layouts: Sequence[KeyLayout], priority: int = 0, timeout: float | None = None) -> Exchange:
        """Push the ``outgoing`` buffers; each reply carries the round's result (:meth:`values`)."""
        nbytes = sum(rec.nbytes for rec in layouts)
        self._count(nbytes, nbytes, push=True)
        start = time.monotonic() if self.timeline is not None else 0.0
        sent = self._sends(Command.PUSHPULL, layouts, priority, timeout=timeout)
        if self.timeline is not None:
            spans.watch(self.timeline, "pushpull", start, [(spans.dense(items), p) for items, p in sent.messages])
        return sent

    def pull(self, layouts: Sequence[KeyLayout], priority: int = 0, timeout: float | None = None) -> Exchange:
        """Ask for the values of the round of this worker's last push of each part (:meth:`values`)."""
        sent = Exchange()
        limit = self._limit(timeout)
        nbytes = sum(rec.nbytes for rec in layouts)
        big = nbytes >= BIG_CALL_BYTES
        self._count(0, nbytes, push=False)
        start = time.monotonic() if self.timeline is not None else 0.0
        squeezed = [rec for rec in layouts if rec.compress] if self._both_ways else []
        groups = [(squeezed, True), ([rec for rec in layouts if not rec.compress], False)] if squeezed \
            else [(layouts, False)]
        for group, compressed in groups:
            # both ways, every worker must decode the same values: no shared-memory shortcut for them
            for server, shared, items in by_server(group, not compressed, self._cluster.part_bytes):
                # each part named with the number of this worker's last push of it (round = n)
                specs = tuple(ArraySpec(rec.skey, rec.meta.dtype, (rec.parts[i][2],), rec.parts[i][1], rec.pushes[i])
                              for rec, i in items)
                squeeze = compressed and not shared
                pending = self.client.request(server, Command.PULL, specs, body=self._compression_body if squeeze
                                              else "", priority=priority, timeout=limit,
                                              flags=Flag.SHM if shared else Flag.COMPRESS_REPLY if squeeze else 0,
                                              overtake=big and not shared)
                if squeeze and self._replay is not None:  # a replacement server compresses the same rounds
                    self._replay.record(server, Command.PULL, pending, specs, [], Flag.COMPRESS_REPLY,
                                        self._compression_body)
                sent.messages.append((items, pending))
                sent.replies.append(pending)
        if self.timeline is not None:
            spans.watch(self.timeline, "pull", start, [(spans.dense(items), p) for items, p in sent.messages])
        return sent

    def _sends(self, command: Command, layouts: Sequence[KeyLayout], priority: int, timeout: float | None = None,
               quiet: bool = False) -> Exchange:
        """:meth:`_send` of the compressed keys' parts, then of the others (a message is one or the other)."""
        squeezed = [rec for rec in layouts if rec.compress]
        if not squeezed:
            return self._send(command, layouts, priority, timeout=timeout, quiet=quiet)
        plain = [rec for rec in layouts if not rec.compress]
        sent = self._send(command, squeezed, priority, timeout=timeout, quiet=quiet, compressed=True)
        if plain:
            rest = self._send(command, plain, priority, timeout=timeout, quiet=quiet)
            sent.messages += rest.messages
            sent.replies += rest.replies
        return sent

    def _compressed(self, items: Sequence[Part]) -> list[np.ndarray[Any, Any]]:  # on a _compressing() thread
        """Each part's payload, compressed with this worker's residual of the part (which it updates)."""
        assert self.compressor is not None
        start = time.monotonic() if self.timeline is not None else 0.0
        payloads = [self.compressor.compress(part_view(rec, rec.outgoing, i),
                                             self._residuals.get((rec.skey, rec.parts[i][1]), 0, rec.parts[i][2]))
                    for rec, i in items]
        if self.timeline is not None:
            spans.compressed(self.timeline, start, spans.dense(items))
        return payloads

    def _send(self, command: Command, layouts: Sequence[KeyLayout], priority: int, flags: int = 0,
              timeout: float | None = None, quiet: bool = False, compressed: bool = False) -> Exchange:
        """One ``command`` message per server with every part of ``layouts`` (from their outgoing buffers).

        Parts a co-located server holds in shared memory (pushes only) are copied into
        this worker's slot; the message then only names them. Pushes and pushpulls are
        counted per part as they are queued (pulls name them by number).
        """
        sent = Exchange()
        pushes = command in (Command.PUSH, Command.PUSHPULL)
        limit = self._limit(timeout)
        # a compressed pushpull both ways is answered with payloads: through a socket, also on this host
        shared_ok = pushes and not (compressed and self._both_ways and command is Command.PUSHPULL)
        messages = by_server(layouts, shared_ok, self._cluster.part_bytes)
        # compressed: every message's payloads are made ahead on two threads, while the first go out
        ahead = [_compressing().submit(self._compressed, items) if compressed else None for _, _, items in messages]
        for (server, shared, items), payloads in zip(messages, ahead):
            # a push carries its number: the servers apply each (worker, part, number) at most once
            specs = tuple(part_spec(rec, i, rec.pushes[i] + 1 if pushes else 0) for rec, i in items)
            if shared:  # the data goes through this worker's slots; the message names the parts
                if compressed:  # what the server would decode: no network to save on
                    assert self.compressor is not None
                    assert payloads is not None
                    for (rec, i), payload in zip(items, payloads.result()):
                        np.copyto(rec.shm[i].slot, self.compressor.decompress(payload, rec.parts[i][2]))  # type: ignore[union-attr]
                else:
                    write_slots(items)
                pending = self.client.request(server, command, specs, priority=priority, timeout=limit,
                                              quiet=quiet, flags=flags | Flag.SHM)
            else:
                data = payloads.result() if payloads is not None else [part_view(rec, rec.outgoing, i)
                                                                        for rec, i in items]
                body = _key_names(items) if command is Command.INIT else self._compression_body if compressed else ""
                sent_flags = flags | Flag.COMPRESSED if compressed else flags
                if compressed and self._both_ways and command is Command.PUSHPULL:
                    sent_flags |= Flag.COMPRESS_REPLY
                pending = self.client.request(server, command, specs, data, body, priority=priority, timeout=limit,
                                              quiet=quiet, flags=sent_flags)
                if pushes and self._replay is not None:  # kept until the next checkpoint
                    self._replay.record(server, command, pending, specs, data, sent_flags, body)
            if pushes:
                for rec, i in items:
                    rec.pushes[i] += 1
            sent.messages.append((items, pending))
            sent.replies.append(pending)
        return sent

    def refuse(self, rec: KeyLayout, meta: ArrayMeta, timeout: float | None = None) -> None:
        """Push ``rec`` a value described by ``meta`` that does not fit it, for the servers to refuse.

        Only a value of another dtype or size (the servers check those): each part's server
        refuses it, counts it as this worker's next push of the part (as this worker does
        here) and fails the sync round it would have joined on every worker
        (:meth:`pskv.server.handlers.DataHandlers._refuse_rounds`). Waits for the refusals.
        """
        if (meta.dtype, meta.size) == (rec.meta.dtype, rec.meta.size):
            return
        pendings = []
        for i, (server, _, length) in enumerate(rec.parts):
            size = meta.size if meta.dtype == rec.meta.dtype else length
            spec = part_spec(rec, i, rec.pushes[i] + 1)._replace(dtype=meta.dtype, shape=(size,))
            data = np.zeros(size * itemsize(meta.dtype), np.uint8)
            pendings.append(self.client.request(server, Command.PUSH, (spec,), [data], timeout=self._limit(timeout)))
            rec.pushes[i] += 1
        for pending in pendings:
            try:
                pending.wait(self._limit(timeout))
            except KVStoreError:  # the refusal expected (or the server is gone: nothing to tell)
                pass

    def _count(self, bytes_out: int, bytes_in: int, push: bool) -> None:
        """One data call in this worker's metrics (:mod:`pskv.metrics`): its value bytes each way."""
        counters = self.client.counters
        counters.ops += 1
        counters.rounds += push
        counters.bytes_out += bytes_out
        counters.bytes_in += bytes_in

    def _wait(self, pending: WorkerRequest, limit: float) -> Header:
        """``pending.wait(limit)``, the time blocked counted in this worker's metrics."""
        if pending.done():
            return pending.wait(limit)
        start = time.perf_counter()
        try:
            return pending.wait(limit)
        finally:
            self.client.counters.wait += time.perf_counter() - start

    # -- replies ------------------------------------------------------------------------
    def values(self, sent: Exchange, timeout: float | None = None,
               into: Mapping[int, tuple[Any, np.ndarray[Any, Any]]] | None = None) -> dict[int, Any]:
        """Wait for the replies; the received value of each key (a CPU array of its kind) by ``id(layout)``.

        ``into``: ``id(layout) -> (array, flat view of it)`` where a key's parts are written
        as their replies arrive; its value is then that array.

        Raises:
            ProtocolError: a reply does not match the layout it answers.
            RemoteError, NodeFailedError, OperationTimeoutError: from the requests.
        """
        limit = self._limit(timeout)
        start = time.monotonic() if self.timeline is not None else 0.0
        values: dict[int, Any] = {}
        for items, pending in sent.messages:
            header = self._wait(pending, limit)
            if not header.arrays:  # an acknowledgement without data (init)
                continue
            if header.flags & Flag.SHM:  # the values are in shared memory
                for (rec, i), frame in zip(items, self._shared.read(items, header, pending.node)):
                    _place(rec, i, frame, values, into)
                continue
            if len(header.arrays) != len(items):
                raise ProtocolError(
                    f"{node_name(pending.node)} answered {len(header.arrays)} arrays for {len(items)} requested parts"
                )
            compressed = self._reply_compressor(header, pending.node)
            for (rec, i), spec, buf in zip(items, header.arrays, pending.buffers):
                frame = frame_array(spec, buf) if compressed is None else compressed.decompress(buf, spec.size)
                if spec.offset != rec.parts[i][1] or frame.size != rec.parts[i][2]:
                    raise ProtocolError(f"{node_name(pending.node)}'s reply for key {rec.key!r} does not match its layout")
                _place(rec, i, frame, values, into)
        if self.timeline is not None:
            spans.waited(self.timeline, start, [(spans.dense(items), p) for items, p in sent.messages])
        return values

    def _reply_compressor(self, header: Header, node: int) -> Compressor | None:
        """The compressor a reply's values are decoded with (None: not compressed).

        Raises:
            ProtocolError: a compressed reply this worker did not ask for, or under another compression.
        """
        if not header.flags & Flag.COMPRESSED:
            return None
        if self.compressor is None or header.body != self._compression_body:
            raise ProtocolError(f"{node_name(node)} answered with values compressed as {header.body[:200]!r}, which "
                                "this worker did not ask for")
        return self.compressor

    def wait_acks(self, sent: Exchange, timeout: float | None = None) -> None:
        """Wait for the servers to acknowledge a push (raises the first error)."""
        limit = self._limit(timeout)
        start = time.monotonic() if self.timeline is not None else 0.0
        for pending in sent.replies:
            self._wait(pending, limit)
        if self.timeline is not None:
            spans.waited(self.timeline, start, [(spans.dense(items), p) for items, p in sent.messages])

    @staticmethod
    def acked(layouts: Sequence[KeyLayout]) -> bool:
        """True if the last push of every key of ``layouts`` has been answered."""
        return all(p.done() for rec in layouts for p in rec.acks)

    def await_acks(self, layouts: Sequence[KeyLayout], timeout: float | None) -> None:
        """Wait until the last push of each key was answered, so its buffers may be reused.

        That push's own error (if any) belongs to its handle, not to the caller here.

        Raises:
            OperationTimeoutError: no answer within the timeout.
        """
        limit = self._limit(timeout)
        acks = list({id(p): p for rec in layouts for p in rec.acks}.values())
        if acks and not all(p.done() for p in acks):
            self.confirm(acks, limit)  # quiet pushes are answered only when asked
        for p in acks:
            if not p.done():
                try:
                    p.wait(limit)
                except Exception:
                    if not p.done():
                        raise
        for rec in layouts:
            rec.acks = []

    def confirm(self, pendings: Iterable[WorkerRequest], timeout: float | None = None) -> None:
        """Get the quiet pushes among ``pendings`` answered (a ``SYNC`` to their servers; does not wait)."""
        self.client.quiet.confirm(pendings, timeout)

    # -- commands to every server ---------------------------------------------------------
    def _all_servers(self, command: Command, body: str, what: str, timeout: float | None = None) -> list[Header]:
        """Send ``command`` (``body``: an encoded :mod:`~pskv.protocol.bodies` value) to every server and
        wait for every answer (their headers)."""
        limit = self._limit(timeout)
        pendings = [self.client.request(s, command, body=body, what=what, timeout=timeout)
                    for s in range(self._num_servers)]
        return [p.wait(limit) for p in pendings]

    def set_mode(self, sync: bool) -> None:
        """Tell every server whether rounds are synchronous (rank 0, when the job starts)."""
        self._all_servers(Command.SET_MODE, SetMode(sync).encode(), "set mode")

    def set_optimizer(self, config: dict[str, Any]) -> None:
        """Install the optimizer described by ``config`` on every server.

        The servers know keys only as server keys: str keys of ``lr_mult`` / ``wd_mult``
        are sent as theirs (:func:`~pskv.partition.server_key`), or their multipliers
        would never apply.
        """
        self._all_servers(Command.SET_OPTIMIZER, OptimizerConfig(_server_keyed(config)).encode(), "set_optimizer")

    def save_states(self, path: str, dump_optimizer: bool) -> None:
        """Every server writes its optimizer state to ``<path>.server<rank>`` (``path`` made absolute
        here: the servers accept only paths inside their directories, :mod:`pskv.server.paths`)."""
        self._all_servers(Command.SAVE_STATES, StatesRequest(os.path.abspath(path), dump_optimizer).encode(),
                          "save_optimizer_states")

    def load_states(self, path: str) -> None:
        """Every server loads ``<path>.server<rank>`` (``path`` made absolute here)."""
        self._all_servers(Command.LOAD_STATES, StatesRequest(os.path.abspath(path)).encode(), "load_optimizer_states")

    def controller(self, head: int, body: str) -> None:
        """Run the controller registered for ``head`` on every server."""
        self._all_servers(Command.CONTROLLER, ControllerCall(head, body).encode(), f"command {head}")

    def save_checkpoint(self, directory: str) -> list[dict[str, Any]]:
        """Every server writes its shard into ``directory``; their answers (:class:`CheckpointSaved` fields).

        Raises:
            ProtocolError: a server's answer is malformed.
        """
        replies = self._all_servers(Command.SAVE_CHECKPOINT, CheckpointRequest(directory).encode(), "save_checkpoint")
        return [CheckpointSaved.parse(h)._asdict() for h in replies]

    # -- compression residuals in checkpoints ----------------------------------------------
    @property
    def compression_params(self) -> dict[str, Any]:
        """The compression as ``set_gradient_compression`` got it (complete), or ``{}``."""
        return dict(self._compression_params)

    def save_residuals(self, directory: str, num_workers: int) -> str | None:
        """Write this worker's compression residuals into the checkpoint ``directory``
        (:mod:`pskv.worker.residuals`); the file's name, or None without compression.

        Call it between operations (the residuals change while pushes are compressed).

        Raises:
            CheckpointError: the file could not be written.
        """
        if self.compressor is None:
            return None
        parts = {where: residual.copy() for (where, _), residual in self._residuals.items()}
        return write_residuals(directory, SavedResiduals(self._rank, num_workers, self._num_servers,
                                                         self._compression_params, parts)).name

    def restore_residuals(self, directory: str, manifest: Mapping[str, Any], num_workers: int) -> None:
        """Take this worker's residuals from the checkpoint ``directory`` (whose manifest is ``manifest``);
        each key's are installed when it is created again (:meth:`adopt`) if its parts match.

        Residuals that cannot be restored start at zero, with a WARNING naming them and why:
        a checkpoint without worker residuals (written before they were saved), another
        number of workers, or another compression.

        Raises:
            CheckpointError: this worker's file there is unreadable or damaged.
        """
        assert self.compressor is not None
        self._restored, self._restored_from = {}, directory
        why = ""
        record = manifest.get("residuals")
        if not isinstance(record, dict):
            why = "it holds no worker residuals (written before they were saved, or without compression)"
        elif manifest.get("num_workers") != num_workers:
            why = f"it was written by {manifest.get('num_workers')} workers; this job has {num_workers}"
        saved = None if why else read_residuals(directory, self._rank)
        if not why and saved is None:
            why = f"it has no file of worker {self._rank}"
        elif saved is not None and _compressor_params(saved.compression) != self.compressor.params:
            why = f"its residuals were made by compression {saved.compression}, this job's is {self._compression_params}"
        if why:
            log.warning("worker %d: compression residuals start at zero, not restored from checkpoint %s: %s",
                        self._rank, directory, why)
            return
        assert saved is not None
        for (key, offset), residual in saved.parts.items():
            self._restored.setdefault(key, {})[offset] = residual
        log.info("worker %d: compression residuals of %d part(s) read from %s", self._rank, len(saved.parts), directory)

    def _take_restored(self, layouts: Sequence[KeyLayout]) -> None:
        """Install the restored residuals of ``layouts``' keys whose parts they fit; drop (warned) the others."""
        for rec in layouts:
            saved = self._restored.pop(rec.skey, None)
            if saved is None:
                continue
            have = {offset: length for _, offset, length in rec.parts}
            claims = {offset: r.size for offset, r in saved.items()}
            if not rec.compress or claims != have:
                why = ("this job does not compress it" if not rec.compress else
                       f"they are of parts (offset: size) {claims}, this job's layout has {have}")
                log.warning("worker %d: key %r: its compression residuals from checkpoint %s dropped (they start "
                            "at zero): %s", self._rank, rec.key, self._restored_from, why)
                continue
            for offset, residual in saved.items():
                np.copyto(self._residuals.get((rec.skey, offset), 0, residual.size), residual)

    def checkpoint_saved(self) -> None:
        """Every server wrote a checkpoint: the pushes before it need no replay any more."""
        if self._replay is not None:
            self._replay.clear()

    def join(self, timeout: float) -> None:
        """Tell every server this worker has no more data; waits for every answer."""
        self._all_servers(Command.JOIN, "", "join", timeout)

    # -- membership ---------------------------------------------------------------------
    def barrier(self, timeout: float, name: str = "barrier", failure: BaseException | None = None,
                result: str = "", agree: Sequence[tuple[str, str]] = (), mode: str = "") -> str:
        """Meet every worker in the collective ``name``; returns rank 0's ``result``.

        ``failure``: this worker's error in the collective, told to every worker (this
        one's caller raises it; every other worker raises :class:`CollectiveFailedError`
        naming it). ``agree``: ``(item, description)`` pairs every worker must have alike.
        ``mode`` ``"post"`` (rank 0) / ``"read"``: the outcome of a call rank 0 may make
        alone (:meth:`pskv.cluster.Membership.barrier`).

        Raises:
            CollectiveFailedError: the collective failed on another worker.
            CollectiveMismatchError, InitMismatchError: the workers' calls differ.
            NodeFailedError: a worker died (named). OperationTimeoutError: names who did not arrive.
        """
        met = self.client.membership.barrier(Role.WORKER, timeout, name, result=result, agree=agree, mode=mode,
                                             failure=None if failure is None else Failure.of(failure))
        if met.failed and failure is None:
            rank, first = met.failed[0]
            raise CollectiveFailedError(f"worker {rank}", name, first.type, first.message)
        return met.result

    def num_dead_node(self, group: int, timeout: float) -> int:
        """Nodes of ``group`` (1 scheduler, 2 servers, 4 workers, sums) silent for > ``timeout`` s."""
        return self.client.membership.num_dead_node(group, timeout)

    def shutdown(self, timeout: float, wait: bool = False) -> None:
        """Tell the scheduler this worker leaves the job; with ``wait``, block until every worker has left."""
        self.client.membership.shutdown(wait, timeout)

    def _recover_server(self, server: int) -> None:
        """A replacement of ``server`` joined (``PSKV_SERVER_RECOVERY``; its own thread)."""
        assert self._replay is not None
        self._replay.recover(server, self.client, self._rank, self._cluster.request_timeout)


def _place(rec: KeyLayout, i: int, frame: np.ndarray[Any, Any], values: dict[int, Any],
           into: Mapping[int, tuple[Any, np.ndarray[Any, Any]]] | None) -> None:
    """Record part ``i`` of ``rec``'s received value (assembling split keys, maybe in place)."""
    target = into.get(id(rec)) if into else None
    if target is not None:
        _, offset, length = rec.parts[i]
        np.copyto(target[1][offset: offset + length], frame)
        values[id(rec)] = target[0]
        return
    if len(rec.parts) == 1:
        values[id(rec)] = from_wire(frame, rec.meta).reshape(rec.meta.shape)
        return
    if rec.recv is None:
        rec.recv = empty(rec.meta, device="cpu")
    part_view(rec, rec.recv, i)[...] = frame
    values[id(rec)] = rec.recv


def _server_keyed(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` (an optimizer's ``to_config``) with the str keys of its multipliers as server keys."""
    params = config.get("params")
    if not isinstance(params, dict):
        return config
    mults = {}
    for name in ("lr_mult", "wd_mult"):
        pairs = params.get(name)
        if isinstance(pairs, list):
            mults[name] = [[server_key(p[0]), *p[1:]] if isinstance(p, list) and p and isinstance(p[0], str) else p
                           for p in pairs]
    return {**config, "params": {**params, **mults}} if mults else config


def _compressor_params(params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The compressor parameters of saved compression ``params`` (without both_ways / min_size), or None if bad."""
    try:
        return create({k: v for k, v in params.items() if k not in ("both_ways", "min_size")}).params
    except KVStoreError:
        return None


def _key_names(items: list[Part]) -> str:
    """INIT's body: the names of the str keys among ``items``, so the server's reports name them."""
    return InitBody.of(rec.key for rec, _ in items if isinstance(rec.key, str)).encode()
