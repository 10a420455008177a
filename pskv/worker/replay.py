"""Server replacement (``PSKV_SERVER_RECOVERY``): the push log, and replaying it to a new server.

A replacement server loads the newest checkpoint and goes on from its push counts. So
every push made since that checkpoint must reach it again: :class:`ReplayLog` keeps
each socket push per server — command, pending, specs, a copy of the data and the
header flags — until the next checkpoint (:meth:`ReplayLog.clear`). Shared-memory pushes are
not kept: a server with shared memory is on this host, and sync shared-memory jobs
restart as a whole.

When the membership announces a replacement, :meth:`ReplayLog.recover` (on its own
thread) has the client reconnect; once the new process answered ``HELLO`` it is sent,
before anything new, every logged push sent to an older incarnation (a push whose
request still waits gets its reply; an answered one is sent again under a new request),
then every other request the old process never answered.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import numpy as np

from pskv.cluster import Pending
from pskv.protocol import ArraySpec, Command, Header, Role, encode, node_id

if TYPE_CHECKING:
    from pskv.worker.client import WorkerClient, WorkerRequest

__all__ = ["ReplayLog"]

log = logging.getLogger("pskv.worker")

# command, pending, specs, data (copied), header flags
_Entry = tuple[Command, "WorkerRequest", tuple[ArraySpec, ...], list[Any], int, str]  # ..., flags, body


class ReplayLog:
    """The pushes sent since the newest checkpoint, per server rank, to replay to a replacement."""

    def __init__(self) -> None:
        self._entries: dict[int, list[_Entry]] = defaultdict(list)
        self._lock = threading.Lock()

    def record(self, server: int, command: Command, pending: WorkerRequest, specs: tuple[ArraySpec, ...],
               data: list[Any], flags: int, body: str = "") -> None:
        """Keep a push to ``server`` (its ``data`` is copied) until the next checkpoint."""
        copies = [np.array(d, copy=True) for d in data]
        with self._lock:
            self._entries[server].append((command, pending, specs, copies, flags, body))

    def clear(self) -> None:
        """A checkpoint was written: a replacement server will load it, not need these."""
        with self._lock:
            self._entries.clear()

    def recover(self, server: int, client: WorkerClient, rank: int, timeout: float) -> None:
        """A replacement of ``server`` joined: reconnect and replay (its own thread; never raises).

        If the replacement cannot be reached, every request waiting on the server fails
        with :class:`~pskv.errors.NodeFailedError` rather than hanging.
        """
        node = node_id(Role.SERVER, server)
        try:
            client.replacement.reconnect(server, timeout, lambda epoch: self._messages(server, epoch, client, rank, timeout))
        except Exception as exc:  # noqa: BLE001 - fail what waits on it rather than hang
            log.error("worker %d: could not switch to server %d's replacement: %s", rank, server, exc)
            client.tracker.fail_node(node, f"its replacement could not be reached: {exc}")

    def _messages(self, server: int, epoch: int, client: WorkerClient, rank: int,
                  timeout: float) -> list[tuple[WorkerRequest, list[Any]]]:
        """What to send the replacement (incarnation ``epoch``) first, in order: ``(pending, frames)``."""
        node = node_id(Role.SERVER, server)
        tracker = client.tracker
        messages: list[tuple[WorkerRequest, list[Any]]] = []
        with self._lock:
            entries = list(self._entries.get(server, ()))
        replayed = set()
        for command, pending, specs, data, flags, body in entries:
            if pending.epoch is None or pending.epoch >= epoch:
                continue  # not sent yet, or sent to the new process already
            replayed.add(pending.request)
            target = pending
            if pending.done():  # answered by the old process: send it again under a new request
                target = tracker.new(node, "replayed push", timeout=timeout)
                target.add_done_callback(_replayed)
            messages.append((target, encode(Header(command, target.request, client.node_id, specs, 0, body, flags),
                                            data)))
        for p in tracker.outstanding_to(node):
            if p.request not in replayed and p.frames is not None and p.epoch is not None and p.epoch < epoch:
                messages.append((p, p.frames))
        log.warning("worker %d: server %d replaced: sending it %d push(es) since the checkpoint and %d other "
                    "request(s)", rank, server, len(replayed), len(messages) - len(replayed))
        return messages


def _replayed(pending: Pending) -> None:
    if pending.error is not None:
        log.error("a push sent again to a replacement server failed: %s", pending.error)
