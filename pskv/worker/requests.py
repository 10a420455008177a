"""A worker's request to a server: the tracker's record, with what the worker's send queue and readers need."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pskv.cluster import Pending
from pskv.protocol import Header

if TYPE_CHECKING:
    from pskv.transport.polled import PolledConnection
    from pskv.worker.client import WorkerClient

__all__ = ["WorkerRequest"]


class WorkerRequest(Pending):
    """A request to a server, with what the worker's send queue records about it.

    Sent on a local connection, its waiter reads the replies itself
    (:meth:`WorkerClient._read_local`) instead of waiting for the reactor thread to.
    """

    __slots__ = ("quiet", "sent", "epoch", "local", "overtook", "reader")

    def __init__(self, request: int, node: int, what: str,
                 callback: Callable[[Pending], None] | None = None, timeout: float | None = None) -> None:
        super().__init__(request, node, what, callback, timeout)
        self.quiet = False  # answered only on failure: a later reply from the server confirms it
        self.sent: int | None = None  # the per-server sequence number of the message, once sent
        self.epoch: int | None = None  # which incarnation of the server it was sent to (None: not sent yet)
        self.local: WorkerClient | None = None  # sent on a local connection of this client
        self.overtook = False  # sent on the reply connection, ahead of the request connection's queue
        self.reader: PolledConnection | None = None  # where its reply comes, if not the server's usual

    def wait(self, timeout: float | None, stated: float | None = None) -> Header:
        """Wait for the reply (see :meth:`Pending.wait`); on a local connection, read it in this thread."""
        client = self.local
        if client is None or self._done:
            return super().wait(timeout, stated)
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        client._read_local(self, deadline)  # the error names the timeout given, not what is left of it
        return super().wait(None if timeout is None else max(0.0, deadline - time.monotonic()),
                            timeout if stated is None else stated)

    def background(self) -> None:
        """Nobody in this thread waits for the reply now: make sure it is read (by the reactor)."""
        client = self.local
        if client is not None and not self.quiet and not self._done:
            client._attend(self.node)
