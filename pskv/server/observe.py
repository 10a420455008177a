"""What a server's work looks like from outside: the counters ``pskv top`` shows, and timeline spans.

One object per server watches both what it receives and sends (:class:`~pskv.server.core.ServerCore`)
and what its shard's rounds do (the events of :class:`~pskv.server.shard.ShardObserver`):

* :class:`ServerObserver` keeps the :class:`~pskv.metrics.NodeCounters` (always on: plain integer adds
  on paths that handle a message anyway). The shard's push and apply events cost it a call that returns.
* :class:`TracingObserver` (``PSKV_TIMELINE``) also records each part's spans on the
  :class:`~pskv.timeline.Timeline`: ``merge`` (a sync round, from its first push until it is full,
  with when each worker's push joined it and who came last) and ``update`` (the updater, or a
  row-sparse part's rows applied).

Both read one clock, :func:`time.monotonic` — the one the shard's round ages and the timeline use —
and which one a server has is decided once (:func:`observer`), not tested on every event.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pskv.metrics import NodeCounters, value_bytes
from pskv.protocol import Command, Flag, Header, node_name
from pskv.server.part import Part, PartId
from pskv.server.shard import ShardObserver
from pskv.timeline import Timeline

__all__ = ["ServerObserver", "TracingObserver", "observer"]

T = TypeVar("T")
clock = time.monotonic  # the one clock of spans, round ages and the timeline's files
_node_name = functools.lru_cache(maxsize=1 << 16)(node_name)  # merge spans name workers often


class ServerObserver(ShardObserver):
    """A server's counters (:class:`~pskv.metrics.NodeCounters`): messages, array bytes, rounds.

    Args:
        counters: the totals to add to (new ones by default).
    """

    timeline: Timeline | None = None  # none: no spans

    def __init__(self, counters: NodeCounters | None = None) -> None:
        self.counters = counters if counters is not None else NodeCounters()

    def received(self, header: Header, buffers: list[memoryview]) -> None:
        """A message in: one op; its arrays' bytes in (and out, for a shared-memory pull: the reply only
        names what the worker reads)."""
        counters = self.counters
        counters.ops += 1
        if buffers:
            counters.bytes_in += sum(b.nbytes for b in buffers)
        elif header.flags & Flag.SHM and not header.flags & Flag.ROWS:
            nbytes, command = value_bytes(header.arrays), header.command
            if command is not Command.PULL:  # a push or pushpull's values are in its slots
                counters.bytes_in += nbytes
            if command is not Command.PUSH:
                counters.bytes_out += nbytes

    def sent(self, frames: list[Any]) -> None:
        """A reply with values out (its first frame is the header)."""
        self.counters.bytes_out += sum(memoryview(f).nbytes for f in frames[1:])

    def round_completed(self, part: Part) -> None:
        """Count the round (async: the push applied)."""
        self.counters.rounds += 1

    def close(self) -> None:
        """Nothing to release."""


class TracingObserver(ServerObserver):
    """The counters, and the rounds' spans on ``timeline``; str keys by their ``names`` (server key -> name)."""

    def __init__(self, counters: NodeCounters, timeline: Timeline, names: Mapping[int, str]) -> None:
        super().__init__(counters)
        self.timeline = timeline
        self._names = names
        self._arrived: dict[PartId, dict[int, float]] = {}  # the open rounds' pushes: worker -> when it joined

    def pushed(self, part: Part, worker: int) -> None:
        """When the push joined (a merge span's ``pushes``)."""
        self._arrived.setdefault((part.key, part.offset), {})[worker] = clock()

    def round_full(self, part: Part) -> None:
        """The ``merge`` span: from the round's first push until now."""
        arrived = sorted((t, w) for w, t in self._arrived.pop((part.key, part.offset), {}).items()
                         if w in part.pushed)
        self._span("merge", part, part.round_started, {
            "pushes": {_node_name(w): int((t - arrived[0][0]) * 1e6) for t, w in arrived},
            "last": _node_name(arrived[-1][1]) if arrived else None})

    def applied(self, part: Part, update: Callable[..., T], *args: Any) -> T:
        """The ``update`` span: the update's own time."""
        start = clock()
        result = update(*args)
        self._span("update", part, start)
        return result

    def close(self) -> None:
        """Close the timeline (its last spans are written)."""
        assert self.timeline is not None
        self.timeline.close()

    def _span(self, name: str, part: Part, start: float, more: dict[str, Any] | None = None) -> None:
        """Span ``name`` of ``part``'s open round from ``start`` until now, on the part's track."""
        assert self.timeline is not None
        key = self._names.get(part.key, part.key)
        self.timeline.span(name, f"key {key} @{part.offset}" if part.offset else f"key {key}", start, clock(),
                           {"key": key, "offset": part.offset, "round": part.round + 1, "bytes": part.value.nbytes,
                            "workers": len(part.pushed), **(more or {})})


def observer(counters: NodeCounters, timeline: Timeline | None, names: Mapping[int, str]) -> ServerObserver:
    """The observer of a server adding to ``counters``: a :class:`TracingObserver` with a ``timeline``."""
    return ServerObserver(counters) if timeline is None else TracingObserver(counters, timeline, names)
