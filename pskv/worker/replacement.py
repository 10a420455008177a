"""Processes that start over, seen from a worker: a server's connection (reset, or to a replaced server), and
this worker's own process replacing a dead one (REJOIN).

* A reset connection (:meth:`ServerReplacement.watch`): ZeroMQ reconnects a reset TCP
  connection by itself (same routing identities, so the server's routes stay valid),
  but the messages in flight in the dead connection are gone. Once the reply socket and
  the request socket are both connected again, every request still waiting for its
  answer (unconfirmed quiet pushes included) is sent again under its request id; the
  server answers a repeat without applying it twice.
* A replaced server (``PSKV_SERVER_RECOVERY``): the membership announces it
  (:meth:`ServerReplacement.replaced`), the owner's callback runs on a thread of its own
  and calls :meth:`ServerReplacement.reconnect`, which switches the connection to the new
  process and sends it first what the owner's :class:`~pskv.worker.replay.ReplayLog`
  gives (:meth:`~pskv.worker.replay.ReplayLog.recover`).

Meanwhile the client's requests to that server wait in its queue.

* A replaced worker (``is_recovery``, ``--restart-workers``): the new process takes the dead one's rank and
  asks every server, by ``REJOIN``, how many pushes of that rank reached each part
  (:class:`WorkerRejoin`); its keys number their pushes on from there (:meth:`WorkerRejoin.resume`), so a
  push the old process made is not applied twice. When it may push again is :mod:`pskv.kvstore.resume`'s.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from pskv.errors import OperationTimeoutError
from pskv.protocol import Command, Role, node_id
from pskv.protocol.bodies import Rejoin, Rejoined
from pskv.transport.frames import Sender
from pskv.transport.stream import StreamConnection
from pskv.transport.unix import LocalConnection

if TYPE_CHECKING:
    from pskv.worker.client import WorkerClient, WorkerRequest
    from pskv.worker.layout import KeyLayout

__all__ = ["Replay", "ServerReplacement", "WorkerRejoin"]

log = logging.getLogger("pskv.worker")

# A replacement's incarnation number -> what to send it first, in order: (pending, frames) each.
Replay = Callable[[int], "list[tuple[WorkerRequest, list[Any]]]"]


class ServerReplacement:
    """Reconnecting one :class:`~pskv.worker.client.WorkerClient` to a server: after a reset, or to its replacement.

    Args:
        client: the client whose connections these are.
        on_replaced: called with a replaced server's rank, on a thread of its own (the
            owner reconnects and replays); None: replacements are not followed.
    """

    __slots__ = ("_client", "_on_replaced")

    def __init__(self, client: WorkerClient, on_replaced: Callable[[int], None] | None) -> None:
        self._client = client
        self._on_replaced = on_replaced

    # -- reset connections -------------------------------------------------------------------
    def watch(self, server: int, sid: int, sender: Sender) -> None:
        """Resend what a reset connection to ``server`` may have lost, once both sockets are back.

        ``sid``: the polled DEALER its replies arrive on; ``sender``: where its requests leave.
        """
        down: set[str] = set()
        state = {"was_down": False}

        def on_change(which: str, up: bool) -> None:
            if not up:
                if not down:
                    log.warning("worker: connection to server %d lost; waiting for ZeroMQ to reconnect", server)
                down.add(which)
                state["was_down"] = True
                return
            down.discard(which)
            if not down and state["was_down"]:
                state["was_down"] = False
                self.resend(server)

        reactor = self._client._reactor
        reactor.watch_connection(sid, lambda up: on_change("rx", up))
        reactor.watch_connection(sender, lambda up: on_change("tx", up))

    def resend(self, server: int) -> None:
        """Send every request to ``server`` that was sent and is unanswered again, first: its connection is new
        (a reset ZeroMQ connection back, a data connection opened again)."""
        client = self._client
        node = node_id(Role.SERVER, server)
        waiting = [(p, p.frames) for p in client.tracker.outstanding_to(node) if p.frames is not None and p.sent is not None]
        log.warning("worker: reconnected to server %d; sending %d unanswered request(s) again", server, len(waiting))
        client._queue_first(server, waiting)
        client._flush()

    # -- replaced servers (PSKV_SERVER_RECOVERY) -------------------------------------------
    def replaced(self, ranks: list[int]) -> None:
        """Membership callback (reactor thread): the owner reconnects and replays, off this thread."""
        if self._on_replaced is None:
            return
        info = self._client.membership.info
        for rank in ranks:
            log.warning("worker: server %d was replaced; reconnecting to %s", rank, info.servers[rank] if info else "?")
            threading.Thread(target=self._on_replaced, args=(rank,), daemon=True,
                             name=f"pskv-worker-recover-{rank}").start()

    def reconnect(self, server: int, timeout: float, replay: Replay) -> None:
        """Switch to the replacement of server ``server`` (its address from the membership).

        Requests to it wait meanwhile. After the new process answered HELLO, ``replay(epoch)``
        gives the messages to send it first, in order — each ``(pending, frames)``, the
        pending completed by the reply — typically every push since the checkpoint it
        loaded (those sent to an older incarnation: ``pending.epoch < epoch``), then the
        outstanding pulls; then the waiting requests go out.

        Raises:
            OperationTimeoutError: no connection or no HELLO answer within ``timeout``.
        """
        client = self._client
        info = client.membership.info
        assert info is not None and client.info is not None
        swapped = threading.Event()
        client._hold(server)
        try:
            client._reactor.call_soon(partial(self._swap, server, info.servers[server], swapped))
            if not swapped.wait(timeout):
                raise OperationTimeoutError(f"could not reconnect to server {server} within {timeout} s")
            client.info = info
            hello, frames = client.lanes.hello(server, client._tx, timeout)
            sid = client._servers[server]
            assert sid is not None
            client._reactor.call_soon(partial(client._reactor.send_dealer, sid, frames))
            client.lanes.open_data(server, hello.wait(timeout), timeout)
            with client._send_lock:  # nothing goes to this server while the replay is queued
                messages = replay(client._epoch[server])
                for pending, _ in messages:
                    pending.quiet = False  # answered now: its old confirmation queue is gone
                client._queue_first(server, messages)
        finally:
            client._release(server)

    def _swap(self, server: int, address: str, swapped: threading.Event) -> None:
        """Make a new ZeroMQ session with ``address`` ``server``'s connection, closing the old ones (reactor thread).

        Its sequence numbers start over and its incarnation number (``epoch``) grows.
        """
        client, reactor = self._client, self._client._reactor
        old_sid, old_sender = client._servers[server], client._senders[server]
        sid, sender = client.lanes.zmq_pair(address)
        with client._send_lock:
            client._servers[server] = sid
            client._senders[server] = sender
            old_lane = client.lanes.drop(server)
            client._sent[server] = itertools.count(1)
            client._epoch[server] += 1
        client.quiet.forget(node_id(Role.SERVER, server))  # they are sent again, answered
        if old_sid is not None:
            reactor.close_dealer(old_sid)
        if isinstance(old_sender, Sender):
            reactor.unwatch(old_sender)
        if old_lane is not None:
            reactor.close_connection(old_lane)
        if isinstance(old_sender, (StreamConnection, LocalConnection)):
            reactor.close_connection(old_sender)  # not polled any more, not opened again
        else:
            old_sender.close()
        self.watch(server, sid, sender)
        swapped.set()


class WorkerRejoin:
    """A process that replaced a dead worker: which pushes of its rank reached the servers (``client.rejoin``).

    Args:
        client: the client whose requests carry the REJOINs.
    """

    __slots__ = ("_client", "landed")

    def __init__(self, client: WorkerClient) -> None:
        self._client = client
        self.landed: dict[tuple[int, int], int] = {}  # per (server key, offset): this rank's pushes that arrived

    def __call__(self, num_servers: int, timeout: float) -> None:
        """``REJOIN`` every server; :attr:`landed` gets their counts of this rank's pushes.

        Raises:
            OperationTimeoutError, RemoteError, NodeFailedError: a server did not answer.
            ProtocolError: an answer is malformed.
        """
        client = self._client
        body = Rejoin(client.info.token if client.info is not None else "").encode()
        pendings = [client.request(s, Command.REJOIN, what="rejoin", timeout=timeout, body=body)
                    for s in range(num_servers)]
        for pending in pendings:
            for key, offset, count in Rejoined.parse(pending.wait(timeout)).counts:
                self.landed[(key, offset)] = count

    def resume(self, layouts: Sequence[KeyLayout]) -> None:
        """Number each key's pushes on from those of this rank that arrived.

        A key whose parts got different numbers of pushes (the old process died between
        the messages of one push) starts at the fewest: pushing that step again is applied
        only where it had not arrived (the servers ignore a push number they have).
        """
        for rec in layouts:
            count = min(self.landed.get((rec.skey, offset), 0) for _, offset, _ in rec.parts)
            rec.pushes = [count] * len(rec.parts)

    def most(self, rec: KeyLayout) -> int:
        """The most pushes of this rank that arrived at any part of ``rec``'s key (0: it never pushed it)."""
        return max((self.landed.get((rec.skey, offset), 0) for _, offset, _ in rec.parts), default=0)
