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
  :class:`~pskv.errors.ProtocolError`), split values assembled.

Its features have owners it holds and calls in one line: ``compression``
(:mod:`pskv.worker.compressing`), ``observe`` (counters and spans, :mod:`pskv.worker.observe`),
``rows`` (:mod:`pskv.worker.rows`) and ``control`` (commands to every server, membership:
:mod:`pskv.worker.control`).

Sending returns an :class:`Exchange` (the messages of one call and their pending
replies) at once; :meth:`KVWorker.values` and :meth:`KVWorker.wait_acks` wait for it.
Nothing here knows the engine, MXNet's collectives or key normalisation.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from pskv.arrays import ArrayMeta, itemsize
from pskv.cluster import NodeInfo
from pskv.config import ClusterConfig
from pskv.errors import KVStoreError, ProtocolError
from pskv.protocol import ArraySpec, Command, Flag, frame_array, node_name
from pskv.protocol.bodies import InitBody
from pskv.timeline import open_timeline
from pskv.worker.client import WorkerClient, WorkerRequest
from pskv.worker.compressing import KeyCompression, NoCompression, PushCompression, Settings
from pskv.worker.control import WorkerControl
from pskv.worker.fold import FOLD_BYTES
from pskv.worker.layout import KeyLayout, Part, by_server, new_layout, part_spec, part_view, place
from pskv.worker.observe import CallObserver, observer
from pskv.worker.replay import ReplayLog
from pskv.worker.rows import RowPiece, RowRequests
from pskv.worker.shared import SharedParts, write_slots

__all__ = ["BIG_CALL_BYTES", "Exchange", "KVWorker"]

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
        # a row pull's messages (RowRequests.pull): pieces, reply, whether it asked for the present rows, and
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
        self._message_bytes = cluster.message_bytes  # read once: a property that parses the scheduler's address
        self._sync = sync
        self._rank = -1
        self._num_servers = 0
        self._shared = SharedParts((), False)
        # With PSKV_SERVER_RECOVERY every push since the newest checkpoint is kept (copied).
        self._replay = ReplayLog() if cluster.server_recovery else None
        # weak: a bound method would make worker and client a cycle (the push log's copies kept until a gc run)
        recover = weakref.WeakMethod(self._recover_server)

        def on_server_replaced(server: int) -> None:
            method = recover()
            if method is not None:
                method(server)
        self.client = client if client is not None else WorkerClient(
            cluster, context, on_server_replaced=on_server_replaced if cluster.server_recovery else None)
        # quiet pushes up to this size are held for the pull behind them (pskv.worker.fold; -1: none, as in process
        # and in an elastic job, whose held pushes would leave without the view's epoch)
        self._fold_bytes = FOLD_BYTES if sync and client is None and not cluster.elastic else -1
        self.client.held.replay = self._replay
        self.rows = RowRequests(self.client, cluster, self._replay, Exchange, BIG_CALL_BYTES)  # row-sparse keys
        self.control = WorkerControl(self.client, cluster.request_timeout)  # commands to every server, membership
        self.compression: NoCompression = NoCompression()  # set_compression
        # counters of every data call; with PSKV_TIMELINE also their spans (opened at connect)
        self.observe = CallObserver(self.client.counters)

    # -- life cycle ---------------------------------------------------------------------
    def connect(self) -> NodeInfo:
        """Register with the scheduler and connect to every server (see :meth:`WorkerClient.connect`).

        Raises:
            OperationTimeoutError: the cluster did not assemble within the startup timeout.
        """
        info = self.client.connect()
        self._rank = info.rank
        self._num_servers = info.num_servers
        shm = self._cluster.uses_shm and self._sync and not self._cluster.elastic  # elastic: joiners have no slots
        self._shared = SharedParts(info.server_shm, shm, self._cluster.shm_rows_bytes, self._cluster.job_id)
        timeline = open_timeline(self._cluster.timeline, "worker", info.rank, self._cluster.restart_count, info.recovery)
        self.observe = observer(self.client.counters, timeline)
        self.rows.connected(self._shared, self.observe)
        return info

    def close(self, layouts: Iterable[KeyLayout] = ()) -> None:
        """Fail what still waits, release the connection, and drop ``layouts``' buffers (idempotent).

        A layout's shared-memory maps and reduce buffers are released here, when nothing
        uses them any more, rather than whenever the store object is collected (a store
        kept alive by a reference cycle would otherwise hold its maps: 10,000 keys of them
        exhausted the process's mmap limit once).
        """
        self.client.close()
        self.observe.close()
        self.compression.close()
        self._shared.rows.clear()  # the rows buffers' maps
        for rec in layouts:
            rec.shm = []
            rec.send = rec.recv = rec.outgoing = None
            rec.acks = []

    def _limit(self, timeout: float | None) -> float:
        return self._cluster.request_timeout if timeout is None else timeout

    def set_compression(self, settings: Settings) -> None:
        """Compress the pushes of the keys initialised from now on that ``settings`` (the store's
        :class:`~pskv.kvstore.compressing.GradientCompression`) covers (:mod:`pskv.worker.compressing`)."""
        self.compression.close()
        self.compression = PushCompression(settings, self._rank, self._num_servers, self.observe)

    # -- layouts ------------------------------------------------------------------------
    def layout(self, key: int | str, meta: ArrayMeta, sparse: bool = False) -> KeyLayout:
        """The layout of a new key whose values are described by ``meta`` (:func:`pskv.worker.layout.new_layout`)."""
        return new_layout(key, meta, self._num_servers, self._cluster, self._sync, sparse)

    def adopt(self, layouts: Sequence[KeyLayout], summed: bool) -> None:
        """New keys of this worker (every worker's, whoever sends the init): ``summed`` ones store
        plain sums; the others' float32 pushes are compressed if compression is set, and any key's
        whose layout has its own compression (``rec.own``, ``init(compression=)``)."""
        for rec in layouts:
            rec.summed = summed
        self.compression.adopt(layouts, summed, self.observe)

    def attach(self, layouts: Sequence[KeyLayout]) -> None:
        """Map the shared-memory parts of ``layouts`` (once the servers created them: after init)."""
        self._shared.attach(layouts, self.client.node_id, self._rank)

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

    def push(self, layouts: Sequence[KeyLayout], priority: int = 0, timeout: float | None = None,
             quiet: bool = False) -> Exchange:
        """Send the ``outgoing`` buffers of ``layouts`` (one message per server); counts the pushes.

        A ``quiet`` push is answered only if it fails (see :meth:`confirm`); a big one
        (:data:`BIG_CALL_BYTES`) is acknowledged anyway. Its replies become the keys' ``acks``: their buffers are reused only once those are done
        (:meth:`await_acks`).
        """
        nbytes = sum(rec.nbytes for rec in layouts)
        start = self.observe.calling(nbytes, 0, push=True)
        hold = quiet and nbytes <= self._fold_bytes
        alone = self.client.held.hold_alone(layouts, priority, self._message_bytes, self._rank) if hold else None
        if alone is not None:  # a training loop's push, held in fewer steps (pskv.worker.fold)
            sent = Exchange()
            sent.messages.append(alone)
            sent.replies.append(alone[1])
        else:
            sent = self._sends(Command.PUSH, layouts, priority, timeout=timeout,
                               quiet=quiet and nbytes < BIG_CALL_BYTES, hold=hold)
        for rec in layouts:
            rec.acks = sent.replies
        self.observe.sent("push", start, sent.messages)
        return sent

    def pushpull(self, layouts: Sequence[KeyLayout], priority: int = 0, timeout: float | None = None) -> Exchange:
        """Push the ``outgoing`` buffers; each reply carries the round's result (:meth:`values`)."""
        nbytes = sum(rec.nbytes for rec in layouts)
        start = self.observe.calling(nbytes, nbytes, push=True)
        sent = self._sends(Command.PUSHPULL, layouts, priority, timeout=timeout)
        self.observe.sent("pushpull", start, sent.messages)
        return sent

    def pull(self, layouts: Sequence[KeyLayout], priority: int = 0, timeout: float | None = None) -> Exchange:
        """Ask for the values of the round of this worker's last push of each part (:meth:`values`)."""
        sent = Exchange()
        limit = self._limit(timeout)
        nbytes = sum(rec.nbytes for rec in layouts)
        big = nbytes >= BIG_CALL_BYTES
        start = self.observe.calling(0, nbytes, push=False)
        body, held = self.compression.body, self.client.held
        for group, compressed in self.compression.pull_groups(layouts):
            # both ways, every worker must decode the same values: no shared-memory shortcut for them
            for server, shared, items in by_server(group, not compressed, self._message_bytes, self._rank):
                squeeze = compressed and not shared
                # behind a held push of these parts: one PUSHPULL carries both (pskv.worker.fold)
                pending = held.fold(server, items, priority, limit) if held.held else None
                # each part named with the number of this worker's last push of it (round = n)
                specs = () if pending is not None and not squeeze else tuple(
                    ArraySpec(rec.skey, rec.meta.dtype, (rec.parts[i][2],), rec.parts[i][1], rec.pushes[i])
                    for rec, i in items)
                if pending is None:
                    pending = self.client.request(server, Command.PULL, specs, body=body if squeeze else "",
                                                  priority=priority, timeout=limit, overtake=big and not shared,
                                                  flags=Flag.SHM if shared else Flag.COMPRESS_REPLY if squeeze else 0)
                if squeeze and self._replay is not None:  # a replacement server compresses the same rounds
                    self._replay.record(server, Command.PULL, pending, specs, [], Flag.COMPRESS_REPLY, body)
                sent.messages.append((items, pending))
                sent.replies.append(pending)
        self.observe.sent("pull", start, sent.messages)
        return sent

    def _sends(self, command: Command, layouts: Sequence[KeyLayout], priority: int, timeout: float | None = None,
               quiet: bool = False, hold: bool = False) -> Exchange:
        """:meth:`_send` of the compressed keys' parts (by compression), then of the others (a message is of one).

        ``hold``: quiet pushes of no compressed key are held for a pull (:mod:`pskv.worker.fold`)."""
        if not any(rec.compress for rec in layouts):
            return self._send(command, layouts, priority, timeout=timeout, quiet=quiet, hold=hold)
        sent = Exchange()
        for compression, group in self.compression.push_groups(layouts):
            part = self._send(command, group, priority, timeout=timeout, quiet=quiet, compression=compression)
            sent.messages += part.messages
            sent.replies += part.replies
        return sent

    def _send(self, command: Command, layouts: Sequence[KeyLayout], priority: int, flags: int = 0,
              timeout: float | None = None, quiet: bool = False,
              compression: KeyCompression | None = None, hold: bool = False) -> Exchange:
        """One ``command`` message per server with every part of ``layouts`` (from their outgoing buffers).

        Parts a co-located server holds in shared memory (pushes only) are copied into
        this worker's slot; the message then only names them. Pushes and pushpulls are
        counted per part as they are queued (pulls name them by number). With ``compression``, the
        parts' payloads travel instead (:mod:`pskv.worker.compressing`). With ``hold`` (quiet
        pushes), each message is held for the pull behind it instead (:mod:`pskv.worker.fold`).
        """
        sent = Exchange()
        held = self.client.held
        pushes = command in (Command.PUSH, Command.PUSHPULL)
        limit = self._limit(timeout)
        # a compressed pushpull both ways is answered with payloads: through a socket, also on this host
        squeezed_reply = compression is not None and compression.both_ways and command is Command.PUSHPULL
        messages = by_server(layouts, pushes and not squeezed_reply, self._message_bytes, self._rank)
        # compressed: every message's payloads are made ahead on the compressing threads, while the first go out
        ahead = [compression.payloads(items) if compression is not None else None for _, _, items in messages]
        sent_flags = flags | (Flag.COMPRESSED | (Flag.COMPRESS_REPLY if squeezed_reply else 0) if compression else 0)
        request = self.client.pacing.requester(layouts, messages, quiet or hold)  # of the socket messages
        for (server, shared, items), payloads in zip(messages, ahead):
            # a push carries its number: the servers apply each (worker, part, number) at most once
            specs = tuple(part_spec(rec, i, rec.pushes[i] + 1 if pushes else 0) for rec, i in items)
            if shared:  # the data goes through this worker's slots; the message names the parts
                if compression is not None and payloads is not None:
                    compression.write_slots(items, payloads)
                else:
                    write_slots(items)
                pending = held.hold(server, specs, [], flags | Flag.SHM, priority, items) if hold else \
                    self.client.request(server, command, specs, priority=priority, timeout=limit, quiet=quiet,
                                        flags=flags | Flag.SHM)
            else:
                data = payloads.result() if payloads is not None else [part_view(rec, rec.outgoing, i)
                                                                        for rec, i in items]
                body = _key_names(items) if command is Command.INIT else compression.body if compression else ""
                if hold:  # recorded for a replacement server as it leaves
                    pending = held.hold(server, specs, data, sent_flags, priority, items)
                else:
                    pending = request(server, command, specs, data, body, priority=priority, timeout=limit,
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
        here) and holds its place in the sync round it would have joined, which fails on every
        worker and changes nothing (:mod:`pskv.server.void`). Waits for the refusals.
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
        start = self.observe.now()
        values: dict[int, Any] = {}
        for items, pending in sent.messages:
            header = self.observe.wait(pending, limit)
            if not header.arrays:  # an acknowledgement without data (init)
                continue
            if header.flags & Flag.SHM:  # the values are in shared memory
                for (rec, i), frame in zip(items, self._shared.read(items, header, pending.node)):
                    place(rec, i, frame, values, into)
                continue
            if len(header.arrays) != len(items):
                raise ProtocolError(
                    f"{node_name(pending.node)} answered {len(header.arrays)} arrays for {len(items)} requested parts"
                )
            compressed = self.compression.decoder(header, pending.node)
            for (rec, i), spec, buf in zip(items, header.arrays, pending.buffers):
                _, offset, length = rec.parts[i]  # checked first: a decompression allocates the spec's size
                if spec.offset != offset or spec.shape != (length,) or spec.key != rec.skey:
                    raise ProtocolError(f"{node_name(pending.node)}'s reply for key {rec.key!r} does not match its layout")
                frame = frame_array(spec, buf) if compressed is None else compressed.decompress(buf, length)
                place(rec, i, frame, values, into)
        self.observe.waited(start, sent.messages)
        return values

    def wait_acks(self, sent: Exchange, timeout: float | None = None) -> None:
        """Wait for the servers to acknowledge a push (raises the first error)."""
        limit = self._limit(timeout)
        start = self.observe.now()
        for pending in sent.replies:
            self.observe.wait(pending, limit)
        self.observe.waited(start, sent.messages)

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

    def checkpoint_saved(self) -> None:
        """Every server wrote a checkpoint: the pushes before it need no replay any more."""
        if self._replay is not None:
            self._replay.clear()

    def _recover_server(self, server: int) -> None:
        """A replacement of ``server`` joined (``PSKV_SERVER_RECOVERY``; its own thread)."""
        assert self._replay is not None
        self._replay.recover(server, self.client, self._rank, self._cluster.request_timeout)


def _key_names(items: list[Part]) -> str:
    """INIT's body: the names of the str keys among ``items``, so the server's reports name them."""
    return InitBody.of(rec.key for rec, _ in items if isinstance(rec.key, str)).encode()
