"""A node id is bound to its connections by the scheduler's proof: servers and the scheduler refuse a
message claiming another's."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import zmq

from pskv.cluster import NodeInfo, Scheduler
from pskv.config import ClusterConfig
from pskv.protocol import TX_PREFIX, ArraySpec, Command, Header, decode, encode
from pskv.protocol.bodies import ErrorReply, NodeTable, Register, node_token
from pskv.server.node import ServerNode
from pskv.server.senders import CONNECTIONS_PER_WORKER, SenderBindings
from pskv.transport.unix import LocalConnection, local_path

W0, W1 = 9, 11  # node ids of workers 0 and 1
SECRET = "5e" * 32  # the job's secret, as the scheduler would hand it to the server
WAIT_MS = 5000


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    # not term(): it waits, without a timeout, for every socket of the context to be closed, so one
    # left open by a test (or by a node still closing its own) hung a whole xdist worker in CI
    context.destroy(linger=0)


@pytest.fixture
def dealers(ctx):
    made = []

    def dealer(address, identity=None):
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        if identity is not None:
            sock.identity = identity
        sock.connect(address)
        made.append(sock)
        return sock

    yield dealer
    for sock in made:
        sock.close(0)


@pytest.fixture
def server(ctx):
    cfg = ClusterConfig(num_servers=1, num_workers=2, role="server", root_uri="127.0.0.1", root_port=1, shm=0)
    node = ServerNode(cfg, ctx)
    node._membership.info = NodeInfo(8, 0, (node.address,), 1, 2, secret=SECRET)  # what registering gives
    node._reactor.start()  # serving without registering: enough for the data commands
    yield node
    node.stop()


def ask(sock, command, request, sender, body=None, arrays=(), data=()):
    text = json.dumps(body) if body is not None else ""
    sock.send_multipart(encode(Header(command, request, sender, tuple(arrays), 0, text), list(data)), copy=True)
    assert sock.poll(WAIT_MS), "no reply"
    return decode(sock.recv_multipart())[0]


def hello(sock, sender, token=None, tx=None, request=100):
    """HELLO as worker ``sender`` (its right token unless ``token`` is given)."""
    body = {"token": node_token(SECRET, sender) if token is None else token}
    if tx is not None:
        body["tx"] = tx
    return ask(sock, Command.HELLO, request, sender, body)


def init(sock, request, sender, key=0):
    return ask(sock, Command.INIT, request, sender, arrays=[ArraySpec(key, "float32", (3,))],
               data=[np.zeros(3, np.float32)])


def push(sock, request, sender):
    return ask(sock, Command.PUSH, request, sender, arrays=[ArraySpec(0, "float32", (3,))],
               data=[np.ones(3, np.float32)])


def refusal(reply) -> str:
    assert reply.command is Command.ERROR and ErrorReply.parse(reply).type == "ProtocolError"
    return ErrorReply.parse(reply).message


def test_a_connection_that_claims_another_workers_id_is_refused_and_logged(server, dealers, caplog):
    w0, w1 = dealers(server.address), dealers(server.address)
    assert hello(w0, W0).command is Command.REPLY and hello(w1, W1).command is Command.REPLY
    assert init(w0, 1, W0).command is Command.REPLY
    assert init(w1, 1, W1, key=1).command is Command.REPLY
    with caplog.at_level("ERROR", logger="pskv.server"):
        forged = push(w0, 2, W1)  # worker 0's connection pushes in worker 1's name
        also = hello(w0, W1, request=3)  # even with worker 1's token: w0 speaks for worker 0
    assert "claims worker 1 (node id 11): refused, the connection is bound to worker 0" in refusal(forged)
    assert "the connection is bound to worker 0" in refusal(also)
    assert "PUSH from connection b" in caplog.text and "claims worker 1 (node id 11)" in caplog.text
    assert push(w1, 2, W1).command is Command.REPLY  # worker 1 itself still may


def test_a_stranger_that_speaks_first_cannot_take_a_workers_id(server, dealers, caplog):
    stranger = dealers(server.address)
    with caplog.at_level("ERROR", logger="pskv.server"):
        first = init(stranger, 1, W0)  # before worker 0 ever connected: no first-come binding
        missing = hello(stranger, W0, token="")
        wrong = hello(stranger, W0, token=node_token(SECRET, W1), request=101)  # another worker's token
        guessed = hello(stranger, W0, token="0" * 64, request=102)
        rejoin = ask(stranger, Command.REJOIN, 103, W0, {"token": "f" * 64})
    assert "refused, the connection is not bound to a worker" in refusal(first)
    assert "INIT from connection b" in caplog.text and "claims worker 0 (node id 9)" in caplog.text
    assert "its token is missing" in refusal(missing)
    assert all("its token is wrong" in refusal(r) for r in (wrong, guessed, rejoin))
    assert "token" in refusal(ask(stranger, Command.HELLO, 104, W0, {"token": "../x"}))  # malformed: refused too
    worker = dealers(server.address)  # the real worker 0 is unaffected
    assert hello(worker, W0).command is Command.REPLY
    assert init(worker, 1, W0).command is Command.REPLY and push(worker, 2, W0).command is Command.REPLY
    assert "not bound to a worker" in refusal(push(stranger, 3, W0))  # and the stranger is still refused


def test_a_new_connection_with_the_token_binds_a_session_or_a_replacement(server, dealers):
    first = dealers(server.address)
    assert hello(first, W0).command is Command.REPLY and init(first, 1, W0).command is Command.REPLY
    # a worker's session: HELLO on its reply socket also binds the send-only socket it names
    rx, tx = dealers(server.address), dealers(server.address, TX_PREFIX + b"0123456789abcdef")
    assert hello(rx, W0, tx="0123456789abcdef").command is Command.REPLY
    tx.send_multipart(encode(Header(Command.SYNC, 2, W0)), copy=True)
    assert rx.poll(WAIT_MS) and decode(rx.recv_multipart())[0].command is Command.REPLY  # answered on rx
    # a HELLO cannot hand worker 0's send-only socket to worker 1, even with worker 1's token
    other = dealers(server.address)
    assert "is bound to worker 0" in refusal(hello(other, W1, tx="0123456789abcdef"))
    # a replacement process (--restart-workers) opens with REJOIN carrying the same token
    replacement = dealers(server.address)
    assert ask(replacement, Command.REJOIN, 1, W0, {"token": node_token(SECRET, W0)}).command is Command.REPLY
    assert ask(replacement, Command.SYNC, 2, W0).command is Command.REPLY
    assert ask(first, Command.SYNC, 3, W0).command is Command.REPLY  # the old connections stay bound (bounded)


def test_a_hello_that_comes_before_the_servers_registration_is_held_until_it(ctx, dealers):
    # a worker may learn the server's address and say HELLO before the server took in its own
    # registration reply (the secret): the HELLO waits, bounded, and is checked then
    cfg = ClusterConfig(num_servers=1, num_workers=2, role="server", root_uri="127.0.0.1", root_port=1, shm=0)
    node = ServerNode(cfg, ctx)
    node._reactor.start()  # serving, not registered yet: no secret
    try:
        worker, stranger = dealers(node.address), dealers(node.address)
        worker.send_multipart(encode(Header(Command.HELLO, 1, W0, body=json.dumps({"token": node_token(SECRET, W0)}))))
        stranger.send_multipart(encode(Header(Command.HELLO, 1, W1, body=json.dumps({"token": "0" * 64}))))
        assert "not bound to a worker" in refusal(push(stranger, 2, W1))  # only openings wait
        assert not worker.poll(300) and not stranger.poll(10)  # held
        node._membership.info = NodeInfo(8, 0, (node.address,), 1, 2, secret=SECRET)  # the registration reply
        node._reactor.call_soon(node._core.registered)
        assert worker.poll(WAIT_MS) and decode(worker.recv_multipart())[0].command is Command.REPLY
        assert stranger.poll(WAIT_MS) and "its token is wrong" in refusal(decode(stranger.recv_multipart())[0])
        assert init(worker, 2, W0).command is Command.REPLY  # bound
    finally:
        node.stop()


def test_a_zeromq_peer_cannot_pose_as_a_bound_local_connection(ctx, dealers, caplog):
    # local connections' identities are the server's own (b"\x00local-<n>"); a ZeroMQ peer may
    # choose any routing identity, but one of those is dropped: it cannot use their bindings
    cfg = ClusterConfig(num_servers=1, num_workers=2, role="server", root_uri="127.0.0.1", root_port=1,
                        job_id="senders-test")
    node = ServerNode(cfg, ctx)
    node._membership.info = NodeInfo(8, 0, (node.address,), 1, 2, secret=SECRET)
    node._reactor.start()
    try:
        local = LocalConnection.connect(local_path(node._shm_dir.path), "test", 5.0)
        local.send(encode(Header(Command.HELLO, 1, W0, body=json.dumps({"token": node_token(SECRET, W0)}))))
        deadline = time.monotonic() + WAIT_MS / 1000
        while not node._core.senders._node_of and time.monotonic() < deadline:
            time.sleep(0.01)
        (identity,) = node._core.senders._node_of  # the local connection, bound to worker 0
        assert identity.startswith(b"\x00local-")
        impostor = dealers(node.address, identity)
        with caplog.at_level("ERROR", logger="pskv.transport"):
            impostor.send_multipart(encode(Header(Command.INIT, 2, W0, (ArraySpec(5, "float32", (3,)),)),
                                           [np.zeros(3, np.float32)]), copy=True)
            assert not impostor.poll(500)
        assert (5, 0) not in node._shard.parts  # dropped, not handled as worker 0's
        assert "whose routing identity" in caplog.text and "is a local connection's" in caplog.text
        local.close()
    finally:
        node.stop()


def test_a_reconnect_keeps_its_binding(server, dealers):
    # ZeroMQ reconnects a reset connection under the same routing identity
    sock = dealers(server.address, b"pskv-rx-aaaaaaaaaaaaaaaa")
    assert hello(sock, W0).command is Command.REPLY and init(sock, 1, W0).command is Command.REPLY
    sock.close(0)
    again = dealers(server.address, b"pskv-rx-aaaaaaaaaaaaaaaa")
    assert ask(again, Command.SYNC, 2, W0).command is Command.REPLY
    assert ask(again, Command.SYNC, 3, W1).command is Command.ERROR


def test_the_record_is_bounded_per_worker():
    bindings = SenderBindings(lambda: "server 0", lambda: SECRET)
    token = node_token(SECRET, W0)
    for i in range(3 * CONNECTIONS_PER_WORKER):
        bindings.check(b"c%d" % i, Header(Command.HELLO, 1, W0, body=json.dumps({"tx": f"{i:016x}", "token": token})))
    assert sum(bindings.node_of(b"c%d" % i) == W0 for i in range(3 * CONNECTIONS_PER_WORKER)) <= CONNECTIONS_PER_WORKER
    assert bindings.node_of(b"c%d" % (3 * CONNECTIONS_PER_WORKER - 1)) == W0  # the newest is kept


def test_a_flood_of_new_connections_forgets_idle_ones_not_the_one_in_use():
    """Eviction is by last use: a worker's live connection survives any number of new ones."""
    bindings = SenderBindings(lambda: "server 0", lambda: SECRET)
    token = node_token(SECRET, W0)
    hello = lambda i: Header(Command.HELLO, 1, W0, body=json.dumps({"tx": f"{i:016x}", "token": token}))  # noqa: E731
    bindings.check(b"live", hello(0))
    bindings.check(b"live", Header(Command.SYNC, 1, W0))  # the live connection has spoken once
    for i in range(1, 50 * CONNECTIONS_PER_WORKER):
        bindings.check(b"c%d" % i, hello(i))  # a burst: the live one says nothing meanwhile
    assert bindings.node_of(b"live") == W0
    assert bindings.node_of(b"c1") is None  # an idle one was forgotten


def test_the_scheduler_refuses_a_message_claiming_another_nodes_id(ctx, dealers, caplog):
    cfg = ClusterConfig(num_servers=1, num_workers=1)
    scheduler = Scheduler(cfg, ctx, address="tcp://127.0.0.1:0")
    scheduler.start()
    try:
        server, worker = dealers(scheduler.address), dealers(scheduler.address)
        server.send_multipart(encode(Header(Command.REGISTER, 1, 0, body=Register("server", "tcp://x:1", 0).encode())))
        reg = encode(Header(Command.REGISTER, 1, 0, body=Register("worker", "", 0).encode()))
        worker.send_multipart(reg)
        assert server.poll(WAIT_MS) and worker.poll(WAIT_MS)
        server_table = NodeTable.parse(decode(server.recv_multipart())[0])
        worker_table = NodeTable.parse(decode(worker.recv_multipart())[0])
        assert worker_table.node_id == W0 and len(server_table.secret) == 64  # the server gets the job's secret,
        assert worker_table.token == node_token(server_table.secret, W0)  # the worker its proof ...
        assert not server_table.token and not worker_table.secret  # ... and nothing else
        with caplog.at_level("ERROR", logger="pskv.scheduler"):
            worker.send_multipart(encode(Header(Command.HEARTBEAT, 2, 8)))  # worker 0 claims server 0's id
            assert worker.poll(WAIT_MS)
            refused = decode(worker.recv_multipart())[0]
        assert refused.command is Command.ERROR and "claiming node id 8" in ErrorReply.parse(refused).message
        assert "registered as worker 0: refused" in caplog.text
        worker.send_multipart(encode(Header(Command.REGISTER, 3, 0, body=Register("server", "tcp://y:1", 0).encode())))
        assert worker.poll(WAIT_MS)
        again = decode(worker.recv_multipart())[0]
        assert again.command is Command.ERROR and "REGISTER as a server of rank 0" in ErrorReply.parse(again).message
        worker.send_multipart(encode(Header(Command.HEARTBEAT, 4, W0)))  # its own id: answered
        assert worker.poll(WAIT_MS) and decode(worker.recv_multipart())[0].command is Command.REPLY
    finally:
        scheduler.stop()


def test_without_a_key_the_scheduler_cannot_tell_a_stranger_from_a_node(ctx, dealers):
    # what docs/security.md says a keyless peer can do at the scheduler: take a slot while
    # the job assembles, and (recovery on) take over a worker's rank by naming it
    cfg = ClusterConfig(num_servers=1, num_workers=1, recovery_timeout=30.0)
    scheduler = Scheduler(cfg, ctx, address="tcp://127.0.0.1:0")
    scheduler.start()
    try:
        server, stranger = dealers(scheduler.address), dealers(scheduler.address)
        server.send_multipart(encode(Header(Command.REGISTER, 1, 0, body=Register("server", "tcp://x:1", 0).encode())))
        stranger.send_multipart(encode(Header(Command.REGISTER, 1, 0, body=Register("worker", "", -1).encode())))
        assert stranger.poll(WAIT_MS)
        taken = json.loads(decode(stranger.recv_multipart())[0].body)
        assert taken["node_id"] == W0 and taken["token"]  # it is worker 0 now, with worker 0's token
        second = dealers(scheduler.address)
        second.send_multipart(encode(Header(Command.REGISTER, 1, 0, body=Register("worker", "", 0).encode())))
        assert second.poll(WAIT_MS)
        table = json.loads(decode(second.recv_multipart())[0].body)
        assert table["node_id"] == W0 and table["recovery"]  # taken for worker 0's replacement
        assert table["token"] == taken["token"]  # a replacement gets its rank's token
    finally:
        scheduler.stop()
