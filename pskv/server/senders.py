"""Which worker each connection speaks for: a node id is bound to its connections by proof. No I/O.

A request names its sender in the header (``header.sender``); the server sums pushes and
numbers rounds by it. Without this check any connection could claim any worker's id.

The proof: the scheduler makes a random secret when the job starts; a server gets it
with its registration reply, each worker its *token*, HMAC-SHA256(secret, its node id)
(:func:`pskv.protocol.bodies.node_token`; a replacement of a worker gets the same token
for its rank). The rule, per connection (a ZeroMQ routing identity, or a local
connection's):

* a worker opens every connection with ``HELLO`` (its ZeroMQ session, or a local
  connection) or ``REJOIN`` (a replacement, ``--restart-workers``) carrying its token;
  the server recomputes the token of the id the message claims and compares
  (:func:`hmac.compare_digest`). Right: the connection is bound to that worker — and, for
  a ``HELLO``, the send-only socket it names. Missing or wrong: refused;
* any other message from a connection not bound is refused;
* a bound connection that names another worker is refused, and so is a ``HELLO`` naming
  a send-only socket bound to another worker.

A refusal is a ``ProtocolError`` reply and a log line naming the claimed id and the
connection (at most one per connection every 10 s, with the count of repeats). A
worker's connections are kept per worker; past :data:`CONNECTIONS_PER_WORKER` the least
recently used of those that said nothing since their opening message is forgotten (else the
least recently used of all): the record stays bounded, and a flood of new connections
cannot push out one in use. A replacement's new connections simply bind with the same token. ZeroMQ reconnects a reset connection under
the same routing identity, so a reconnect keeps its binding.

What this does *not* stop (``docs/security.md``): without CURVE, a peer that reads the
plaintext traffic learns the tokens (and a server's secret), and a peer that registers
with the scheduler while the job assembles gets a token of its own. With CURVE neither
reaches a socket.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from typing import NoReturn

from pskv.errors import ProtocolError
from pskv.protocol import TX_PREFIX, Command, Header, node_name
from pskv.protocol.bodies import Hello, Rejoin, node_token
from pskv.transport.security import RefusalLog

__all__ = ["SenderBindings", "CONNECTIONS_PER_WORKER"]

log = logging.getLogger("pskv.server")

CONNECTIONS_PER_WORKER = 64  # connections remembered per worker (a session uses 2 per server; replacements and reconnects add theirs)


class SenderBindings:
    """Connection -> the worker it speaks for, and each worker's connections (bounded).

    Args:
        name: this server's name for log lines (``'server 0'``).
        secret: the job's secret, hex (from the server's registration; ``""`` before it:
            then no connection can be bound).
    """

    def __init__(self, name: Callable[[], str], secret: Callable[[], str]) -> None:
        self._name = name
        self._secret = secret
        self._node_of: dict[bytes, int] = {}
        self.bound: Callable[[bytes], bool] = self._node_of.__contains__  # whether a connection is bound (no frame)
        # worker -> its connections, least recently used first; True once it spoke after its opening message
        self._connections: dict[int, dict[bytes, bool]] = {}
        self._refusals = RefusalLog(log, limit=4096)  # a line per connection and interval (a peer may flood)

    def check(self, connection: bytes, header: Header) -> None:
        """Bind ``connection`` to the worker ``header.sender`` names if it proves it, or refuse the message.

        Call for requests whose sender is a worker of this job (checked before).

        Raises:
            ProtocolError: a HELLO or REJOIN without the claimed worker's token, another
                message from a connection not bound, a bound connection speaking for
                another worker, or a HELLO naming a send-only socket bound to another.
        """
        claimed = header.sender
        bound = self._node_of.get(connection)
        if bound is not None and bound != claimed:
            self._refuse(connection, header, f"the connection is bound to {node_name(bound)}")
        if header.command is Command.HELLO:
            hello = Hello.parse(header)
            token, tx = hello.token, (TX_PREFIX + hello.tx.encode() if hello.tx else None)
        elif header.command is Command.REJOIN:
            token, tx = Rejoin.parse(header).token, None
        elif bound is None:
            self._refuse(connection, header, "the connection is not bound to a worker (a worker's connection opens "
                                             "with HELLO or REJOIN carrying its token from the scheduler)")
        else:  # a bound connection speaking for its worker: the common case
            used = self._connections[bound]
            del used[connection]  # now the most recently used, and one in use: a flood forgets others first
            used[connection] = True
            return
        if not self._proves(claimed, token):
            self._refuse(connection, header, "its token is " + ("wrong" if token else "missing") +
                         ("" if self._secret() else " (this server has not registered yet)"))
        if tx is not None and self._node_of.get(tx, claimed) != claimed:
            self._refuse(connection, header, f"its send-only socket {tx!r} is bound to {node_name(self._node_of[tx])}")
        if bound is None:
            self._bind(connection, claimed)
        if tx is not None and tx not in self._node_of:
            self._bind(tx, claimed)

    def node_of(self, connection: bytes) -> int | None:
        """The worker ``connection`` is bound to, if any."""
        return self._node_of.get(connection)

    def _proves(self, node: int, token: str) -> bool:
        """Whether ``token`` is worker ``node``'s (constant-time comparison)."""
        secret = self._secret()
        return bool(secret and token) and hmac.compare_digest(node_token(secret, node), token)

    def _bind(self, connection: bytes, node: int) -> None:
        connections = self._connections.setdefault(node, {})
        connections[connection] = False
        self._node_of[connection] = node
        while len(connections) > CONNECTIONS_PER_WORKER:
            # the least recently used of those that said nothing after opening, else of all
            forgotten = next((c for c, spoke in connections.items() if not spoke), next(iter(connections)))
            del connections[forgotten]
            self._node_of.pop(forgotten, None)
            self._refusals.forget(forgotten)

    def _refuse(self, connection: bytes, header: Header, why: str) -> NoReturn:
        message = (f"{header.command.name} from connection {connection!r} claims {node_name(header.sender)} "
                   f"(node id {header.sender}): refused, {why}")
        self._refusals.error(connection, f"{self._name()}: {message}")
        raise ProtocolError(message)
