"""One observer of a worker's data calls: its metrics counters and its timeline spans, on one clock.

Every data call of :class:`~pskv.worker.kv_worker.KVWorker` (and of its row requests)
tells its observer what it sent and how long it waited, in one line each:

* :meth:`CallObserver.calling` — a call begins: counted in the worker's
  :class:`~pskv.metrics.NodeCounters` (what ``pskv top`` shows: calls, rounds, value
  bytes each way); returns the call's start for its spans;
* :meth:`CallObserver.sent` / :meth:`CallObserver.sent_rows` — its messages are out: each
  key's span runs until its replies arrive (:func:`pskv.worker.spans.watch`);
* :meth:`CallObserver.wait` — a blocking wait for one reply, its time counted;
  :meth:`CallObserver.waited` / :meth:`CallObserver.waited_rows` — a thread's ``wait`` span;
* :meth:`CallObserver.compressed` — a ``compress`` span (:mod:`pskv.worker.compressing`).

:class:`CallObserver` only counts (``PSKV_TIMELINE`` off: the span hooks do nothing and no
clock is read but around a wait that blocks); :class:`TracedCalls` also records spans
(:mod:`pskv.worker.spans`). Both time with :func:`time.monotonic`, the timeline's clock.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from pskv.metrics import NodeCounters
from pskv.protocol import Header
from pskv.timeline import Timeline
from pskv.worker import spans
from pskv.worker.client import WorkerRequest
from pskv.worker.layout import Part

__all__ = ["CallObserver", "TracedCalls", "observer"]

#: One message of a call as the worker keeps it: its parts (dense ``(layout, part index)``, or row pieces
#: ``(layout, part index, ids, rows)``) and its pending reply.
Message = tuple[Sequence[Any], WorkerRequest]


def observer(counters: NodeCounters, timeline: Timeline | None) -> CallObserver:
    """The observer of a worker with these ``counters`` and (``PSKV_TIMELINE`` set) ``timeline``."""
    return CallObserver(counters) if timeline is None else TracedCalls(counters, timeline)


class CallObserver:
    """Counts a worker's data calls and the time it blocks for replies; records no span."""

    __slots__ = ("counters",)

    def __init__(self, counters: NodeCounters) -> None:
        self.counters = counters

    def calling(self, bytes_out: int, bytes_in: int, push: bool) -> float:
        """One data call, with its value bytes each way (``push``: it joins a round); its start for spans."""
        counters = self.counters
        counters.ops += 1
        counters.rounds += push
        counters.bytes_out += bytes_out
        counters.bytes_in += bytes_in
        return 0.0

    def now(self) -> float:
        """The start of something timed for a span (0.0: none is recorded)."""
        return 0.0

    def wait(self, pending: WorkerRequest, limit: float) -> Header:
        """``pending.wait(limit)``, the time blocked counted."""
        if pending.done():
            return pending.wait(limit)
        start = time.monotonic()
        try:
            return pending.wait(limit)
        finally:
            self.counters.wait += time.monotonic() - start

    def sent(self, name: str, start: float, messages: Iterable[tuple[Sequence[Part], WorkerRequest]]) -> None:
        """A call ``name`` (``push``, ``pull``, ``pushpull``) that began at ``start`` sent these dense messages."""

    def sent_rows(self, name: str, start: float, messages: Iterable[Message]) -> None:
        """A row call ``name`` that began at ``start`` sent these messages of row pieces."""

    def waited(self, start: float, messages: Iterable[tuple[Sequence[Part], WorkerRequest]]) -> None:
        """This thread waited from ``start`` until now for the replies of these dense messages."""

    def waited_rows(self, start: float, messages: Iterable[Message]) -> None:
        """This thread waited from ``start`` until now for the replies of these row messages."""

    def compressed(self, start: float, items: Sequence[Part]) -> None:
        """A message's parts ``items`` were compressed from ``start`` until now."""

    def close(self) -> None:
        """Flush and close the timeline, if any (idempotent)."""


class TracedCalls(CallObserver):
    """Counts, and records each call's spans on the worker's timeline."""

    __slots__ = ("timeline",)

    def __init__(self, counters: NodeCounters, timeline: Timeline) -> None:
        super().__init__(counters)
        self.timeline = timeline

    def calling(self, bytes_out: int, bytes_in: int, push: bool) -> float:
        super().calling(bytes_out, bytes_in, push)
        return time.monotonic()

    def now(self) -> float:
        return time.monotonic()

    def sent(self, name: str, start: float, messages: Iterable[tuple[Sequence[Part], WorkerRequest]]) -> None:
        spans.watch(self.timeline, name, start, [(spans.dense(items), p) for items, p in messages])

    def sent_rows(self, name: str, start: float, messages: Iterable[Message]) -> None:
        spans.watch(self.timeline, name, start, [(spans.rows(group), p) for group, p in messages])

    def waited(self, start: float, messages: Iterable[tuple[Sequence[Part], WorkerRequest]]) -> None:
        spans.waited(self.timeline, start, [(spans.dense(items), p) for items, p in messages])

    def waited_rows(self, start: float, messages: Iterable[Message]) -> None:
        spans.waited(self.timeline, start, [(spans.rows(group), p) for group, p in messages])

    def compressed(self, start: float, items: Sequence[Part]) -> None:
        spans.compressed(self.timeline, start, spans.dense(items))

    def close(self) -> None:
        self.timeline.close()

