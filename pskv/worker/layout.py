"""Where a key lives on the servers, and how the parts of a call are grouped into messages.

A :class:`KeyLayout` is a worker's record of one key: its server key, the meta of the
value given to ``init``, its parts ``(server, offset, length)`` (from
:func:`pskv.partition.split`), the pushes this worker sent per part (a pull names the
last one), the shared-memory parts mapped for it and the CPU buffers reused by its
operations. It is pure state: the store (:mod:`pskv.kvstore.dist`) fills the buffers,
the :class:`~pskv.worker.kv_worker.KVWorker` reads them and counts the pushes.

The per-operation buffers (``send``, ``outgoing``, ``recv``) live on the long-lived
record for speed. They are safe because the store's engine runs the operations of one
key in issue order, and a push reuses them only after the key's previous push was
acknowledged (``acks``).

:func:`by_server` groups the parts of a call into one message per (server, through
shared memory?) — ps-lite's slicer, computed once per key for single-key calls.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pskv.arrays import ArrayMeta, wire_view
from pskv.protocol import ArraySpec

if TYPE_CHECKING:
    from pskv.worker.shared import SharedPart

__all__ = ["Groups", "KeyLayout", "Part", "by_server", "part_spec", "part_view"]

Part = tuple["KeyLayout", int]  # a key's layout and the index of one of its parts
Groups = dict[tuple[int, bool], list[Part]]  # (server, shared?) -> the parts of one message


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
    groups: dict[bool, Groups] = field(default_factory=dict)  # by_server of this key alone, per shared_ok
    nbytes: int = 0  # of one value; set with the layout

    @property
    def shared(self) -> bool:
        """True if some part of the key goes through shared memory."""
        return any(p is not None for p in self.shm)


def by_server(layouts: Sequence[KeyLayout], shared_ok: bool) -> Groups:
    """Parts grouped by (server, through shared memory?): one message per group (do not modify).

    ``shared_ok`` False sends every part over the socket (pulls may use shared memory,
    pushes too; ``INIT`` never does).
    """
    if len(layouts) == 1:  # a key's own grouping never changes: computed once
        cached = layouts[0].groups.get(shared_ok)
        if cached is None:
            cached = layouts[0].groups[shared_ok] = _group(layouts, shared_ok)
        return cached
    return _group(layouts, shared_ok)


def _group(layouts: Sequence[KeyLayout], shared_ok: bool) -> Groups:
    groups: dict[tuple[int, bool], list[Part]] = defaultdict(list)
    for rec in layouts:
        for i, (server, _, _) in enumerate(rec.parts):
            shared = shared_ok and bool(rec.shm) and rec.shm[i] is not None
            groups[(server, shared)].append((rec, i))
    return dict(groups)


def part_spec(rec: KeyLayout, i: int, number: int = 0) -> ArraySpec:
    """The array spec of part ``i`` of ``rec`` in a request (``number``: a push's number, in ``round``)."""
    _, offset, length = rec.parts[i]
    return ArraySpec(rec.skey, rec.meta.dtype, (length,), offset, number)


def part_view(rec: KeyLayout, buffer: Any, i: int) -> np.ndarray[Any, Any]:
    """Part ``i`` of ``buffer`` (a value of ``rec``'s kind), as a flat wire view."""
    _, offset, length = rec.parts[i]
    return wire_view(buffer)[offset: offset + length]
