"""Where a worker's replies go: its send-only sockets -> the socket its HELLO came on. No I/O.

A worker sends requests on a send-only socket that nobody reads, so its ``HELLO`` names
that socket and arrives on the worker's polled one: replies to requests from the
send-only socket go there (see ``HELLO`` in :mod:`pskv.protocol.messages`). One entry per
send-only socket; every ``HELLO`` from a new socket would add one, so the table keeps
:data:`ROUTES_PER_WORKER` per worker at most and forgets the one of that worker used least
recently — a peer repeating ``HELLO`` under new names (it must prove to be a worker of the
job, :mod:`pskv.server.senders`) displaces only that worker's idle routes, never one its
requests keep using.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["Routes", "ROUTES_PER_WORKER"]

ROUTES_PER_WORKER = 8  # send-only sockets remembered per worker (a session has 1 per server; replacements add theirs)


class Routes:
    """Send-only socket -> reply socket, at most :data:`ROUTES_PER_WORKER` per worker (least recently used go)."""

    def __init__(self) -> None:
        self._to: dict[bytes, tuple[bytes, int]] = {}  # send-only socket -> (reply socket, worker)
        self._of: dict[int, OrderedDict[bytes, None]] = {}  # worker -> its send-only sockets, least recently used first

    def add(self, sender: bytes, reply_to: bytes, worker: int) -> None:
        """Replies to requests from ``sender`` (a socket of ``worker``) go to ``reply_to`` from now on."""
        old = self._to.get(sender)
        if old is not None and old[1] != worker:
            self._of[old[1]].pop(sender, None)
        mine = self._of.setdefault(worker, OrderedDict())
        mine[sender] = None
        mine.move_to_end(sender)
        self._to[sender] = (reply_to, worker)
        while len(mine) > ROUTES_PER_WORKER:
            forgotten, _ = mine.popitem(last=False)
            self._to.pop(forgotten, None)

    def get(self, origin: bytes) -> bytes:
        """Where replies to a request from the socket ``origin`` go (``origin`` itself unless routed)."""
        route = self._to.get(origin)
        if route is None:
            return origin
        self._of[route[1]].move_to_end(origin)
        return route[0]

    def __len__(self) -> int:
        return len(self._to)
