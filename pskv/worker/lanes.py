"""How a worker's requests reach each server, and its replies come back: the lanes, opened and opened again.

Per server (:meth:`Lanes.open`, on connecting):

* on the same host (shared memory on): one local connection
  (:mod:`pskv.transport.unix`, a Unix-domain packet socket in the server's
  shared-memory directory) carries the requests and their replies — no ZeroMQ I/O
  threads on the way, which roughly halves the cost of a small message;
* otherwise ZeroMQ opens the session (:meth:`Lanes.zmq_pair`): requests leave on a
  send-only socket (a :class:`~pskv.transport.frames.Sender`) and replies arrive on a
  DEALER the reactor polls; the server learns that pairing from the ``HELLO`` sent when
  connecting. If its answer offers a data port (``PSKV_DATA_CHANNEL=tcp``), two TCP data
  connections (:mod:`pskv.transport.stream`; sealed with the cluster key's in a keyed
  job, :mod:`pskv.transport.sealed`), each opened with its own ``HELLO``, take over: lane 0 carries the requests and their replies, as a local
  connection does; lane 1 the pulls that overtake the pushes lane 0 still carries
  (:meth:`WorkerClient.request`, ``overtake``; :attr:`Lanes.overtaking`). A data port
  that cannot be reached leaves the ZeroMQ session in use (logged).

Every lane opens with a ``HELLO`` carrying this worker's token (its server binds the
connection to this worker only then: :mod:`pskv.server.senders`). A data connection
that fails closes the other; the requests to that server wait in the client's queue
while both are opened again under the same tags (every :data:`RESTREAM_INTERVAL` s, on
a thread of their own, while the server lives and is not replaced), then every
unanswered request is sent again (the server answers a repeat without applying it
twice). The ZeroMQ session stays, for replacement and for overtaking without lane 1.
The client keeps the lanes in use (``_senders``, ``_servers``) for its hot path; this
module chooses, opens and replaces them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from pskv.cluster import NodeInfo
from pskv.errors import KVStoreError, OperationTimeoutError, ProtocolError, TransportError
from pskv.protocol import TX_PREFIX, Command, Header, Role, encode, node_id, node_name
from pskv.protocol.bodies import Hello, HelloReply
from pskv.transport.frames import Sender
from pskv.transport.shm import host_id
from pskv.transport.stream import StreamConnection, tag_of
from pskv.transport.unix import LocalConnection, local_path
from pskv.worker.shared import shm_dir

if TYPE_CHECKING:
    from pskv.worker.client import Channel, WorkerClient, WorkerRequest

__all__ = ["RESTREAM_INTERVAL", "RX_PREFIX", "Lanes"]

log = logging.getLogger("pskv.worker")

# Routing identity prefix of a worker's reply socket: fixed, so the server's route to it
# (from HELLO) survives a reconnect after a reset connection.
RX_PREFIX = b"pskv-rx-"
# A lost data connection is opened again this often (seconds) until it is back or its server is dead.
RESTREAM_INTERVAL = 0.5


class Lanes:
    """The connections of one :class:`~pskv.worker.client.WorkerClient` to its servers, by server rank.

    Sets the client's sender (and ZeroMQ reply socket) of each server; swaps a sender
    for a data connection under the client's send lock, and holds that server's
    requests in the client's queue while its data connections are opened again.

    Args:
        client: the client whose connections these are.
    """

    __slots__ = ("_client", "_ports", "overtaking")

    def __init__(self, client: WorkerClient) -> None:
        self._client = client
        self._ports: dict[int, int] = {}  # server rank -> its data port, while data connections are used
        # server rank -> its lane 1, for pulls that overtake (read without a lock: swapped under the send lock)
        self.overtaking: dict[int, StreamConnection] = {}

    # -- opening --------------------------------------------------------------------------
    def open(self, info: NodeInfo, timeout: float) -> None:
        """Connect to every server of ``info`` (the client's ``info`` then), each with HELLO, data connections
        where offered.

        Raises:
            OperationTimeoutError: a server did not answer within ``timeout``.
            RemoteError: a server refused (a wrong token).
        """
        client = self._client
        paths = [self._local_path(s, info) for s in range(len(info.servers))]
        connected = threading.Event()

        def connect_all() -> None:
            for server, address in enumerate(info.servers):
                client._senders.append(self._connect(server, address, paths[server]))
            connected.set()

        client._reactor.call_soon(connect_all)
        if not connected.wait(timeout):
            raise OperationTimeoutError("could not connect to the servers")
        client.info = info
        for server, answer in enumerate(self.hello_all(timeout)):
            self.open_data(server, answer, timeout)

    def in_process(self, channels: Sequence[Channel], timeout: float) -> None:
        """Requests go to each server through ``channels``, one per rank, without sockets
        (:meth:`WorkerClient.connect_in_process`); each opens with HELLO."""
        client = self._client
        client._senders = list(channels)
        client._servers = [None] * len(client._senders)
        self.hello_all(timeout)

    def hello_all(self, timeout: float) -> list[Header]:
        """Open every connection with ``HELLO``, before any request; over ZeroMQ the server also
        learns where this worker's replies go.

        Returns:
            Every server's answer, by rank.

        Raises:
            OperationTimeoutError: a server did not answer within ``timeout``.
            RemoteError: a server refused (a wrong token).
        """
        client = self._client
        hellos = []
        for server, sid in enumerate(client._servers):
            tx = client._tx if sid is not None else ""  # a local connection carries its replies itself
            pending, frames = self.hello(server, tx)
            if sid is None:
                client._senders[server].send(frames)
            else:
                client._reactor.call_soon(partial(client._reactor.send_dealer, sid, frames))
            hellos.append(pending)
        answers = []
        for pending in hellos:
            try:
                answers.append(pending.wait(timeout))
            except OperationTimeoutError:
                raise OperationTimeoutError(f"could not connect to the servers: {pending.what} to "
                                            f"{node_name(pending.node)} got no answer") from None
        return answers

    def hello(self, server: int, tx: str, timeout: float | None = None) -> tuple[WorkerRequest, list[Any]]:
        """A ``HELLO`` to ``server`` with this worker's token (``tx``: names its ZeroMQ sockets, "" for none).

        Returns:
            Its pending answer and its frames, to send.
        """
        client = self._client
        assert client.info is not None
        pending = client.tracker.new(node_id(Role.SERVER, server), "hello", timeout=timeout)
        return pending, encode(Header(Command.HELLO, pending.request, client.info.node_id,  # an elastic job's epoch
                                      body=Hello(tx, client.info.token).encode(), epoch=client.view_epoch))

    def _local_path(self, server: int, info: NodeInfo) -> str | None:
        """The local socket of ``server`` if it runs on this host (and shared memory is on)."""
        shm = info.server_shm[server] if server < len(info.server_shm) else None
        if not self._client._cluster.uses_shm or not shm or shm.get("host") != host_id():
            return None
        return local_path(shm_dir(server, shm["dir"], self._client._cluster.job_id))  # checked: a server's path

    def _connect(self, server: int, address: str, path: str | None) -> Sender | LocalConnection:
        """The request channel to ``server`` (on the reactor thread): its local socket, else ZeroMQ.

        Over ZeroMQ, requests leave on a send-only socket and replies arrive on a polled
        DEALER (the client's ``_servers``; None for local connections, which carry both ways).
        """
        client = self._client
        if path is not None:
            try:
                conn = client._reactor.connect_local(path, client._on_reply, client._cluster.request_timeout)
                client._servers.append(None)
                return conn
            except OSError as exc:  # e.g. another mount namespace: ZeroMQ then
                log.info("worker: server %d's local socket %s is unusable, using %s: %s", server, path, address, exc)
        sid, sender = self.zmq_pair(address)
        client._servers.append(sid)
        client.replacement.watch(server, sid, sender)
        return sender

    def zmq_pair(self, address: str) -> tuple[int, Sender]:
        """A ZeroMQ session with the server at ``address`` (reactor thread): its polled reply DEALER's id
        and the send-only socket its requests leave on, both named by this worker's session."""
        client = self._client
        sid = client._reactor.connect_dealer(address, client._on_reply, identity=RX_PREFIX + client._tx.encode())
        return sid, client._reactor.connect_sender(address, TX_PREFIX + client._tx.encode())

    def kinds(self) -> list[str]:
        """How requests reach each server, by rank: ``"local"`` (a Unix socket: the server is on
        this host), ``"tcp"`` (a data connection), ``"zmq"``, or ``"in-process"`` (tests)."""
        kinds = {LocalConnection: "local", StreamConnection: "tcp", Sender: "zmq"}
        return [kinds.get(type(c), "in-process") for c in self._client._senders]

    # -- data connections (pskv.transport.stream) -----------------------------------------
    def open_data(self, server: int, answer: Header, timeout: float) -> None:
        """Send requests to ``server`` on data connections from now on, if its HELLO ``answer`` offers them.

        Call before requests go to ``server`` (connecting, or to a replacement server).
        """
        client = self._client
        if client._cluster.data_channel != "tcp" or client._servers[server] is None:
            return
        try:
            port = HelloReply.parse(answer).stream
        except ProtocolError as exc:
            log.warning("worker: server %d's HELLO answer is malformed, using ZeroMQ: %s", server, exc)
            return
        if not port:
            return
        try:
            requests, overtaking = self._pair(server, port, timeout)
        except (OSError, OperationTimeoutError, KVStoreError) as exc:
            log.warning("worker: server %d's data port %d is unusable, using ZeroMQ: %s", server, port, exc)
            return
        with client._send_lock:
            client._senders[server] = requests
            self.overtaking[server] = overtaking
        self._ports[server] = port

    def drop(self, server: int) -> StreamConnection | None:
        """``server`` was replaced (the client's send lock is held): its lane 1, to be closed, if it had one.

        Its lane 0 is the client's sender, closed with it.
        """
        return self.overtaking.pop(server, None)

    def _pair(self, server: int, port: int, timeout: float) -> tuple[StreamConnection, StreamConnection]:
        """Lane 0 and lane 1 to ``server``, opened.

        Raises:
            as :meth:`_connect_data`.
        """
        requests = self._connect_data(server, port, 0, timeout)
        try:
            return requests, self._connect_data(server, port, 1, timeout)
        except BaseException:
            self._close(requests)
            raise

    def _connect_data(self, server: int, port: int, lane: int, timeout: float) -> StreamConnection:
        """A data connection to ``server`` that its HELLO opened (polled by the reactor).

        Raises:
            OSError: no connection.
            OperationTimeoutError, RemoteError, NodeFailedError: no answer to the HELLO, or a refusal.
        """
        client, reactor = self._client, self._client._reactor
        assert client.info is not None
        address = client.membership.info.servers[server] if client.membership.info else client.info.servers[server]
        host = address.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
        conn = StreamConnection.connect(host, port, tag_of(client._tx, lane),
                                        f"worker data connection to server {server} (lane {lane})",
                                        min(timeout, 10.0), reactor.bounds, on_pending=reactor.wake,
                                        keys=reactor.data_keys)
        adopted = threading.Event()

        def adopt() -> None:
            reactor.adopt_stream(conn, client._on_reply, partial(self._lost, server, conn))
            adopted.set()
        try:
            reactor.call_soon(adopt)
            if not adopted.wait(timeout):
                raise OperationTimeoutError(f"the worker's reactor took no data connection to server {server}")
            hello, frames = self.hello(server, "", timeout)
            conn.send(frames)
            hello.wait(timeout)
        except BaseException:
            self._close(conn)
            raise
        return conn

    def _close(self, conn: StreamConnection) -> None:
        reactor = self._client._reactor
        try:
            reactor.call_soon(partial(reactor.close_connection, conn))
        except TransportError:  # the reactor stopped: it closed everything
            conn.close()

    def _lost(self, server: int, conn: StreamConnection) -> None:
        """Reactor callback: a data connection to ``server`` failed. Both are opened again (another thread)."""
        client = self._client
        lanes = (client._senders[server], self.overtaking.get(server))
        if conn not in lanes or client._reactor.stopped:
            return  # replaced already (a replacement server, or the other lane failed first), or closing
        log.warning("worker: data connection to server %d lost; opening it again", server)
        with client._send_lock:
            self.overtaking.pop(server, None)
        for other in lanes:
            if other is not conn and isinstance(other, StreamConnection):
                client._reactor.close_connection(other)  # its requests are sent again with the others
        client._hold(server)  # requests wait in the queue until it is back
        threading.Thread(target=self._reopen, args=(server, lanes[0]), daemon=True,
                         name=f"pskv-worker-restream-{server}").start()

    def _reopen(self, server: int, lost: object) -> None:
        """Open the data connections to ``server`` again (``lost``: its lane 0), then send every unanswered request again.

        Tries every :data:`RESTREAM_INTERVAL` s while the server lives; requests fail
        meanwhile only by their own timeouts or the server's death (NodeFailedError).
        """
        client = self._client
        node, epoch = node_id(Role.SERVER, server), client._epoch[server]
        try:  # until it is back, the worker closes, the server is dead or replaced (reconnect takes over)
            while (not client._reactor.stopped and node not in client.membership.dead()
                   and client._epoch[server] == epoch):
                try:
                    requests, overtaking = self._pair(server, self._ports[server], 5.0)
                except (OSError, KVStoreError) as exc:
                    log.info("worker: data connection to server %d not back yet: %s", server, exc)
                    time.sleep(RESTREAM_INTERVAL)
                    continue
                with client._send_lock:
                    if client._senders[server] is not lost and self.overtaking.get(server) is not lost:  # replaced
                        self._close(requests)
                        self._close(overtaking)
                        return
                    client._senders[server] = requests
                    self.overtaking[server] = overtaking
                log.warning("worker: data connection to server %d is back", server)
                client.replacement.resend(server)
                return
        finally:
            client._release(server)
