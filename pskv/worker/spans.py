"""A worker's spans on its timeline (``PSKV_TIMELINE``, :mod:`pskv.timeline`).

Per key, on its track (``key <k>``): ``push``, ``pull``, ``pushpull`` — from the call
that sends the key's messages until the last reply for the key arrived (a quiet push:
until a later reply confirmed it); ``args``: ``key``, ``round`` (the push's number, or
for a pull the push whose round it waits for), ``bytes`` (of values sent or asked for),
``failed`` when a reply was an error. On the waiting thread's track (``wait
(<thread>)``): ``wait``, the time a thread blocked for replies. On ``compress``: the
compression of a push's message.

The worker's observer calls these only when its timeline is set
(:class:`~pskv.worker.observe.TracedCalls`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

from pskv.cluster import Pending
from pskv.timeline import Timeline
from pskv.worker.layout import KeyLayout

__all__ = ["compressed", "dense", "rows", "waited", "watch"]

#: One message of a call: per key it carries, the bytes of that key in it; and its pending reply.
Sent = tuple[Sequence[tuple[KeyLayout, int]], Pending]


def dense(items: Iterable[tuple[KeyLayout, int]]) -> list[tuple[KeyLayout, int]]:
    """A message's ``(layout, part index)`` items as ``(layout, bytes)``."""
    return [(rec, rec.parts[i][2] * rec.itemsize) for rec, i in items]


def rows(group: Iterable[tuple[KeyLayout, int, Any, Any]]) -> list[tuple[KeyLayout, int]]:
    """A row message's pieces ``(layout, part, ids, rows or None)`` as ``(layout, bytes of ids and rows)``."""
    return [(rec, ids.nbytes + (0 if data is None else data.nbytes)) for rec, _, ids, data in group]


def watch(timeline: Timeline, name: str, start: float, messages: Iterable[Sent]) -> None:
    """Record span ``name`` of each key of ``messages`` once all of that key's replies arrived."""
    messages = list(messages)
    if len(messages) != 1:
        _Call(timeline, name, start, messages)
        return
    items, pending = messages[0]  # one message (one server): every key's span ends with its reply
    keys: dict[Any, list[int]] = {}
    for rec, nbytes in items:
        entry = keys.get(rec.key)
        if entry is None:
            keys[rec.key] = [max(rec.pushes), nbytes]
        else:
            entry[1] += nbytes
    pending.add_done_callback(partial(_answered, timeline, name, start, keys))


def _answered(timeline: Timeline, name: str, start: float, keys: dict[Any, list[int]], pending: Pending) -> None:
    end = time.monotonic()
    failed = pending.error is not None
    for key, (number, nbytes) in keys.items():
        args: dict[str, Any] = {"key": key, "round": number, "bytes": nbytes}
        if failed:
            args["failed"] = True
        timeline.span(name, f"key {key}", start, end, args)


class _Call:
    """The keys of one call still waiting for replies; each key's span is recorded when its last one came.

    Replies complete on the reactor thread or on threads reading local connections: a lock.
    """

    __slots__ = ("timeline", "name", "start", "lock", "left", "keys")

    def __init__(self, timeline: Timeline, name: str, start: float, messages: list[Sent]) -> None:
        self.timeline = timeline
        self.name = name
        self.start = start
        self.lock = threading.Lock()
        self.left: dict[int, int] = {}  # id(layout) -> its messages not answered yet
        self.keys: dict[int, list[Any]] = {}  # id(layout) -> [layout, round, bytes, failed]
        for items, _ in messages:
            for rec in {id(rec): rec for rec, _ in items}.values():
                self.left[id(rec)] = self.left.get(id(rec), 0) + 1
            for rec, nbytes in items:
                entry = self.keys.setdefault(id(rec), [rec, max(rec.pushes, default=0), 0, False])
                entry[2] += nbytes
        for items, pending in messages:
            recs = list({id(rec): rec for rec, _ in items})
            pending.add_done_callback(lambda p, recs=recs: self.done(recs, p))  # type: ignore[misc]

    def done(self, recs: list[int], pending: Pending) -> None:
        end = time.monotonic()
        finished = []
        with self.lock:
            for key in recs:
                entry = self.keys[key]
                entry[3] = entry[3] or pending.error is not None
                self.left[key] -= 1
                if not self.left[key]:
                    finished.append(entry)
        for rec, number, nbytes, failed in finished:
            args: dict[str, Any] = {"key": rec.key, "round": number, "bytes": nbytes}
            if failed:
                args["failed"] = True
            self.timeline.span(self.name, f"key {rec.key}", self.start, end, args)


def waited(timeline: Timeline, start: float, messages: Sequence[Sent]) -> None:
    """Record a ``wait`` span on this thread's track: from ``start`` until now, for the replies of ``messages``."""
    keys = {id(rec): rec.key for items, _ in messages for rec, _ in items}
    timeline.span("wait", f"wait ({threading.current_thread().name})", start, time.monotonic(),
                  {"keys": len(keys), "first_key": next(iter(keys.values()), None),
                   "bytes": sum(n for items, _ in messages for _, n in items)})


def compressed(timeline: Timeline, start: float, items: Sequence[tuple[KeyLayout, int]]) -> None:
    """Record a ``compress`` span, from ``start`` until now, of a message's parts ``items`` ``(layout, bytes)``."""
    timeline.span("compress", "compress", start, time.monotonic(),
                  {"keys": len(items), "first_key": items[0][0].key if items else None,
                   "bytes": sum(n for _, n in items)})
