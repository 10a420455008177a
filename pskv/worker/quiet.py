"""Quiet requests: non-blocking pushes that the server answers only when they fail.

A server handles one worker's messages in the order they were sent and answers a
failure at once, so any later reply from that server confirms every quiet request sent
to it before. :class:`QuietPushes` keeps, per server node, the quiet requests sent and
not yet confirmed (in send order, by the client's per-server sequence number
``Pending.sent``):

* :meth:`QuietPushes.settle` — a reply to message ``n`` came: every quiet request sent
  before ``n`` succeeded (called by the client before that reply's own completion);
* :meth:`QuietPushes.confirm` — somebody waits and nothing follows: a ``SYNC`` to each
  server goes after everything queued, and its reply confirms them (its failure fails
  them);
* :meth:`QuietPushes.forget` — the server was replaced: its quiet requests are sent
  again, answered, so their confirmation queue is gone.

This saves a message each way per push (per-message costs dominate small keys).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, cast

from pskv.cluster import Pending, RequestTracker
from pskv.protocol import Command, Header

if TYPE_CHECKING:
    from pskv.worker.client import WorkerRequest

__all__ = ["QuietPushes", "SendSync"]

# (server node, timeout, done-callback) -> the pending SYNC, queued after everything queued now
SendSync = Callable[[int, "float | None", Callable[[Pending], None]], "WorkerRequest"]


class QuietPushes:
    """The quiet requests of one worker not yet confirmed, per server node.

    Args:
        tracker: the client's request table (completes confirmed requests).
        send_sync: queues a ``SYNC`` to a server node (see :data:`SendSync`).
    """

    def __init__(self, tracker: RequestTracker[WorkerRequest], send_sync: SendSync) -> None:
        self._tracker = tracker
        self._send_sync = send_sync
        self._queues: dict[int, deque[WorkerRequest]] = {}  # per server node: quiet requests sent, in order
        self._lock = threading.Lock()

    def sent(self, pending: WorkerRequest) -> None:
        """``pending`` (quiet, its ``sent`` number set) left for its server: it waits for confirmation."""
        with self._lock:
            queue = self._queues.get(pending.node)
            if queue is None:
                queue = self._queues[pending.node] = deque()
            queue.append(pending)

    def waiting(self, node: int) -> bool:
        """True if a quiet request sent to ``node`` awaits confirmation."""
        with self._lock:
            return bool(self._queues.get(node))

    def settle(self, node: int, sent: int) -> None:
        """A reply to message ``sent`` came from ``node``: every quiet request sent there before succeeded."""
        with self._lock:
            queue = self._queues.get(node)
            if not queue or queue[0].sent >= sent:  # type: ignore[operator]
                return
            done = []
            while queue and queue[0].sent < sent:  # type: ignore[operator]
                done.append(queue.popleft())
        for p in done:
            self._tracker.resolve(p, _confirmed(p))

    def confirm(self, pendings: Iterable[WorkerRequest], timeout: float | None = None) -> None:
        """Get the quiet requests among ``pendings`` answered: a ``SYNC`` to each of their servers.

        Its reply (it is sent after everything queued now) confirms them; if it fails,
        they fail with its error.
        """
        nodes = {p.node for p in pendings if p.quiet and not p.done()}
        for node in nodes:
            self._send_sync(node, timeout, self._on_sync_done)

    def forget(self, node: int) -> None:
        """``node`` was replaced: its quiet requests are sent again as answered ones."""
        with self._lock:
            self._queues.pop(node, None)

    def _on_sync_done(self, done: Pending) -> None:
        if done.error is None:
            return  # its reply settled the quiet requests before it
        sync = cast("WorkerRequest", done)  # made by send_sync
        with self._lock:
            queue = self._queues.get(sync.node)
            victims = []
            while queue and (sync.sent is None or queue[0].sent < sync.sent):  # type: ignore[operator]
                victims.append(queue.popleft())
        for p in victims:
            self._tracker.resolve(p, _confirmed(p), sync.error)


def _confirmed(p: Pending) -> Header:
    """What stands for the reply of a quiet request that a later reply confirmed."""
    return Header(Command.REPLY, p.request, p.node)
