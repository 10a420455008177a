"""Where a key lives on the servers, and how the parts of a call are grouped into messages.

A :class:`KeyLayout` is a worker's record of one key: its server key, the meta of the
value given to ``init``, its parts ``(server, offset, length)`` (from
:func:`pskv.partition.split`), the pushes this worker sent per part (a pull names the
last one), the shared-memory parts mapped for it and the CPU buffers reused by its
operations. It is pure state: the store (:mod:`pskv.kvstore.dist`) fills the buffers,
the :class:`~pskv.worker.kv_worker.KVWorker` reads them and counts the pushes. A row-sparse
key's parts are its servers' row ranges (``row_width`` elements a row).

The per-operation buffers (``send``, ``outgoing``, ``recv``) live on the long-lived
record for speed. They are safe because the store's engine runs the operations of one
key in issue order, and a push reuses them only after the key's previous push was
acknowledged (``acks``).

:func:`by_server` groups the parts of a call into messages per (server, through
shared memory?) — ps-lite's slicer, computed once per key for single-key calls. Values
that travel through a socket are cut into messages of at most ``PSKV_PART_BYTES`` (at
least one part each), taken from the servers in turn, so the first pieces are summed and
answered while later ones are still on the wire; shared-memory messages only name their
parts and are never cut.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import TYPE_CHECKING, Any

import numpy as np

from pskv.arrays import ArrayMeta, empty, from_wire, itemsize, wire_view
from pskv.config import ClusterConfig
from pskv.partition import row_ranges, server_key, split
from pskv.protocol import ArraySpec

if TYPE_CHECKING:
    from pskv.compression import Compressor
    from pskv.worker.shared import SharedPart

__all__ = ["KeyLayout", "Message", "Part", "by_server", "new_layout", "part_spec", "part_view", "place"]

Part = tuple["KeyLayout", int]  # a key's layout and the index of one of its parts
Message = tuple[int, bool, list[Part]]  # (server, through shared memory?, the parts it carries)


@dataclass
class KeyLayout:
    """What a worker knows about one key: its layout on the servers and its pushes so far."""

    key: int | str  # the store's key
    skey: int
    meta: ArrayMeta  # of the value given to init (shape, dtype, kind, device)
    parts: list[tuple[int, int, int]]  # (server, offset, length)
    pushes: list[int]  # per part: pushes (and pushpulls) this worker sent; a pull names the last
    acks: list[Any] = field(default_factory=list)  # replies of the key's last push (maybe outstanding)
    shm: list[SharedPart | None] = field(default_factory=list)  # per part, when shared with its server
    send: Any = None  # CPU buffer of the meta's kind: the locally reduced value
    outgoing: Any = None  # what the current operation sends: the caller's value or `send`
    recv: Any = None  # CPU buffer assembling a split value
    groups: dict[tuple[bool, int, int], list[Message]] = field(default_factory=dict)  # by_server of this key alone
    nbytes: int = 0  # of one value; set with the layout
    itemsize: int = 0  # bytes of one element on the wire; set with the layout
    summed: bool = False  # init(summed=True): rounds store the plain sum (never compressed)
    compress: bool = False  # pushes of it are compressed (KVWorker.set_compression before init, float32)
    own: Compressor | None = None  # init(compression=): its own compression (pskv.worker.compressing)
    row_width: int = 0  # > 0: a row-sparse key, split by row ranges (partition.row_ranges); elements of a row

    @property
    def sparse(self) -> bool:
        """True for a row-sparse key (its pushes and row pulls move rows: :mod:`pskv.worker.rows`)."""
        return self.row_width > 0

    @property
    def shared(self) -> bool:
        """True if some part of the key goes through shared memory."""
        return any(p is not None for p in self.shm)


def by_server(layouts: Sequence[KeyLayout], shared_ok: bool, max_bytes: int = 0, first: int = 0) -> list[Message]:
    """The messages of a call: its parts grouped by (server, through shared memory?) (do not modify).

    ``shared_ok`` False sends every part over the socket (pulls may use shared memory,
    pushes too; ``INIT`` never does). A socket group whose values exceed ``max_bytes``
    (> 0) is cut into messages of at most that many bytes (a bigger part alone); the
    messages of several servers alternate, so every server gets its first piece early.
    The servers are taken in turn from server ``first`` on (a worker's rank): the workers
    of a job send to different servers at once, not all to server 0 first.
    """
    if len(layouts) == 1:  # a key's own grouping never changes: computed once
        cached = layouts[0].groups.get((shared_ok, max_bytes, first))
        if cached is None:
            cached = layouts[0].groups[(shared_ok, max_bytes, first)] = _group(layouts, shared_ok, max_bytes, first)
        return cached
    return _group(layouts, shared_ok, max_bytes, first)


def _group(layouts: Sequence[KeyLayout], shared_ok: bool, max_bytes: int, first: int) -> list[Message]:
    groups: dict[tuple[int, bool], list[Part]] = defaultdict(list)
    for rec in layouts:
        for i, (server, _, _) in enumerate(rec.parts):
            shared = shared_ok and bool(rec.shm) and rec.shm[i] is not None
            groups[(server, shared)].append((rec, i))
    order = sorted(groups)
    turn = next((n for n, (server, _) in enumerate(order) if server >= first), 0)
    queues = [[(server, shared, chunk) for chunk in ([groups[server, shared]] if shared
                                                     else _cut(groups[server, shared], max_bytes))]
              for server, shared in order[turn:] + order[:turn]]
    return [m for turn in zip_longest(*queues) for m in turn if m is not None]


def new_layout(key: int | str, meta: ArrayMeta, num_servers: int, cluster: ClusterConfig, sync: bool,
               sparse: bool = False) -> KeyLayout:
    """The layout of a new key whose values are described by ``meta`` (:func:`pskv.partition.split`);
    ``sparse``: a row-sparse key (its rows split by server ranges, :func:`pskv.partition.row_ranges`)."""
    skey = server_key(key)
    size = itemsize(meta.dtype)
    if sparse:
        width = meta.size // meta.shape[0] if meta.shape[0] else 0
        ranges = row_ranges(meta.shape[0], num_servers)
        return KeyLayout(key, skey, meta, [(s, first * width, count * width) for s, first, count in ranges],
                         [0] * len(ranges), nbytes=meta.size * size, itemsize=size, row_width=width)
    # async servers apply each push of a part through the updater alone: no pieces there
    max_part = max(cluster.part_size // size, 1) if cluster.part_size and sync else 0
    parts = split(skey, meta.size, num_servers, cluster.bigarray_bound, max_part, size, cluster.part_pieces)
    return KeyLayout(key, skey, meta, parts, [0] * len(parts), nbytes=meta.size * size, itemsize=size)


def _cut(items: list[Part], max_bytes: int) -> list[list[Part]]:
    """``items`` in runs of at most ``max_bytes`` of values (each run at least one part; 0: one run)."""
    if max_bytes <= 0:
        return [items]
    runs: list[list[Part]] = [[]]
    size = 0
    for rec, i in items:
        nbytes = rec.parts[i][2] * rec.itemsize
        if runs[-1] and size + nbytes > max_bytes:
            runs.append([])
            size = 0
        runs[-1].append((rec, i))
        size += nbytes
    return runs


def part_spec(rec: KeyLayout, i: int, number: int = 0) -> ArraySpec:
    """The array spec of part ``i`` of ``rec`` in a request (``number``: a push's number, in ``round``)."""
    _, offset, length = rec.parts[i]
    return ArraySpec(rec.skey, rec.meta.dtype, (length,), offset, number)


def part_view(rec: KeyLayout, buffer: Any, i: int) -> np.ndarray[Any, Any]:
    """Part ``i`` of ``buffer`` (a value of ``rec``'s kind), as a flat wire view."""
    _, offset, length = rec.parts[i]
    return wire_view(buffer)[offset: offset + length]


def place(rec: KeyLayout, i: int, frame: np.ndarray[Any, Any], values: dict[int, Any],
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
