"""Which worker each connection speaks for: a node id is bound to its connections. No I/O.

A request names its sender in the header (``header.sender``); the server sums pushes and
numbers rounds by it. Without this check any connection could claim any worker's id —
a worker (or, without CURVE, anyone reaching the port) could push in another's name.

The rule, per connection (a ZeroMQ routing identity, or a local connection's):

* its first accepted request binds it to the worker it names;
* a bound connection that names another worker is refused (``ProtocolError`` reply and
  a log line naming the claimed id and the connection);
* a new connection that names a worker already bound to others must start with
  ``HELLO`` (a worker's ZeroMQ session: it binds the send-only socket it names too) or
  ``REJOIN`` (a replacement process, ``--restart-workers``); anything else from it is
  refused. A replacement's connections join the worker's; the oldest are forgotten past
  :data:`CONNECTIONS_PER_WORKER`, so the record stays bounded.

ZeroMQ reconnects a reset connection under the same routing identity, so a reconnect
keeps its binding. What this does *not* stop: a peer that opens a new connection and
says HELLO or REJOIN naming a worker — that is how a replacement takes over, and the
server cannot tell it from an impostor. Keep strangers out with CURVE
(``docs/security.md``); this check stops a connection from speaking for two workers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pskv.errors import ProtocolError
from pskv.protocol import TX_PREFIX, Command, Header, node_name
from pskv.protocol.bodies import Hello
from pskv.transport.security import RefusalLog

__all__ = ["SenderBindings", "CONNECTIONS_PER_WORKER"]

log = logging.getLogger("pskv.server")

CONNECTIONS_PER_WORKER = 8  # connections remembered per worker (a session uses 1 or 2; replacements add theirs)
_OPENING = (Command.HELLO, Command.REJOIN)  # what a worker's new connection may start with


class SenderBindings:
    """Connection -> the worker it speaks for, and each worker's connections (bounded).

    Args:
        name: this server's name for log lines (``'server 0'``).
    """

    def __init__(self, name: Callable[[], str]) -> None:
        self._name = name
        self._node_of: dict[bytes, int] = {}
        self._connections: dict[int, list[bytes]] = {}  # worker -> its connections, oldest first
        self._refusals = RefusalLog(log, limit=4096)  # a line per connection and interval (a peer may flood)

    def check(self, connection: bytes, header: Header) -> None:
        """Bind ``connection`` to the worker ``header.sender`` names, or refuse the message.

        Call for requests whose sender is a worker of this job (checked before).

        Raises:
            ProtocolError: the connection speaks for another worker, a new connection
                names a worker bound elsewhere without HELLO/REJOIN, or a HELLO names a
                send-only socket bound to another worker.
        """
        claimed = header.sender
        bound = self._node_of.get(connection)
        if bound is None and claimed in self._connections and header.command not in _OPENING:
            self._refuse(connection, header, f"{node_name(claimed)} speaks on other connections; a new connection "
                                             "must start with HELLO or REJOIN")
        if bound is not None and bound != claimed:
            self._refuse(connection, header, f"the connection is bound to {node_name(bound)}")
        tx = TX_PREFIX + Hello.parse(header).tx.encode() if header.command is Command.HELLO else None
        if tx is not None and self._node_of.get(tx, claimed) != claimed:
            self._refuse(connection, header, f"its send-only socket {tx!r} is bound to {node_name(self._node_of[tx])}")
        if bound is None:
            self._bind(connection, claimed)
        if tx is not None and tx not in self._node_of:
            self._bind(tx, claimed)

    def node_of(self, connection: bytes) -> int | None:
        """The worker ``connection`` is bound to, if any."""
        return self._node_of.get(connection)

    def _bind(self, connection: bytes, node: int) -> None:
        connections = self._connections.setdefault(node, [])
        connections.append(connection)
        self._node_of[connection] = node
        while len(connections) > CONNECTIONS_PER_WORKER:
            forgotten = connections.pop(0)
            self._node_of.pop(forgotten, None)
            self._refusals.forget(forgotten)

    def _refuse(self, connection: bytes, header: Header, why: str) -> None:
        message = (f"{header.command.name} from connection {connection!r} claims {node_name(header.sender)} "
                   f"(node id {header.sender}): refused, {why}")
        self._refusals.error(connection, f"{self._name()}: {message}")
        raise ProtocolError(message)
