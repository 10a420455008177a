"""Where a worker's replies go: its send-only sockets -> the socket its HELLO came on. No I/O.

A worker sends requests on a send-only socket that nobody reads, so its ``HELLO`` names
that socket and arrives on the worker's polled one: replies to requests from the
send-only socket go there (see ``HELLO`` in :mod:`pskv.protocol.messages`). One entry per
send-only socket; every ``HELLO`` from a new socket would add one, so the table keeps
:data:`ROUTES_PER_WORKER` per worker at most and forgets a worker's oldest first — a
hostile peer repeating ``HELLO`` under new names (it must name a worker of the job, which
:mod:`pskv.server.senders` holds it to) displaces only that worker's routes.
"""

from __future__ import annotations

from collections import deque

__all__ = ["Routes", "ROUTES_PER_WORKER"]

ROUTES_PER_WORKER = 8  # send-only sockets remembered per worker (a session has 1 per server; replacements add theirs)


class Routes:
    """Send-only socket -> reply socket, at most :data:`ROUTES_PER_WORKER` per worker."""

    def __init__(self) -> None:
        self._to: dict[bytes, bytes] = {}
        self._of: dict[int, deque[bytes]] = {}  # worker -> its send-only sockets, oldest first

    def add(self, sender: bytes, reply_to: bytes, worker: int) -> None:
        """Replies to requests from ``sender`` (a socket of ``worker``) go to ``reply_to`` from now on."""
        if sender not in self._to:
            mine = self._of.setdefault(worker, deque())
            mine.append(sender)
            if len(mine) > ROUTES_PER_WORKER:
                self._to.pop(mine.popleft(), None)
        self._to[sender] = reply_to

    def get(self, origin: bytes) -> bytes:
        """Where replies to a request from the socket ``origin`` go (``origin`` itself unless routed)."""
        return self._to.get(origin, origin)

    def __len__(self) -> int:
        return len(self._to)
