"""A server node's wire behaviour, driven by raw sockets (no scheduler, no worker library)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zmq

from pskv.cluster import NodeInfo
from pskv.config import ClusterConfig
from pskv.protocol import TX_PREFIX, ArraySpec, Command, Flag, Header, decode, encode
from pskv.protocol.bodies import node_token
from pskv.server.node import ServerNode

WAIT_MS = 10_000
W0, W1 = 9, 11  # node ids of workers 0 and 1
SECRET = "5e" * 32  # the job's secret, as the scheduler would hand it to the server


@pytest.fixture
def node():
    ctx = zmq.Context()
    cfg = ClusterConfig(num_servers=1, num_workers=2, role="server", root_uri="127.0.0.1", root_port=1, shm=0)
    server = ServerNode(cfg, ctx)
    server._membership.info = NodeInfo(8, 0, (server.address,), 1, 2, secret=SECRET)  # what registering gives
    server._reactor.start()  # serving without registering: enough for the data commands
    sockets = []

    def dealer(identity=None, worker=None):
        """A connection; with ``worker``, opened as that worker's (HELLO with its token)."""
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if identity is not None:
            sock.setsockopt(zmq.IDENTITY, identity)
        sock.connect(server.address)
        sockets.append(sock)
        if worker is not None:
            send(sock, Command.HELLO, 10**9, worker, {"token": node_token(SECRET, worker)})
            assert recv(sock)[0].command is Command.REPLY
        return sock

    yield server, dealer
    for sock in sockets:
        sock.close(0)
    server.stop()
    ctx.term()


def send(sock, command, request, sender, body=None, arrays=(), data=(), flags=0):
    text = json.dumps(body) if body is not None else ""
    sock.send_multipart(encode(Header(command, request, sender, tuple(arrays), 0, text, flags), list(data)), copy=True)


def pull(sock, request, sender, n, size=3):
    """A PULL of key 0 (one part of ``size`` float32) including the sender's ``n``-th push."""
    send(sock, Command.PULL, request, sender, arrays=[ArraySpec(0, "float32", (size,), 0, n)])


def recv(sock, timeout_ms=WAIT_MS):
    assert sock.poll(timeout_ms), "no reply"
    return decode(sock.recv_multipart())


def push(sock, request, sender, value, quiet=True):
    spec = ArraySpec(0, "float32", (value.size,))
    send(sock, Command.PUSH, request, sender, None, [spec], [value], Flag.QUIET if quiet else 0)


def test_replies_go_where_the_hello_came_from_and_quiet_pushes_are_answered_only_on_failure(node):
    server, dealer = node
    rx0, tx0, rx1 = dealer(), dealer(TX_PREFIX + b"0123456789abcdef"), dealer(worker=W1)
    send(rx0, Command.HELLO, 1, W0, {"tx": "0123456789abcdef", "token": node_token(SECRET, W0)})
    assert recv(rx0)[0].command is Command.REPLY
    send(rx1, Command.HELLO, 1, W1, {"tx": "../not-hex-digits"})  # refused: names no send-only socket
    assert recv(rx1)[0].command is Command.ERROR
    send(tx0, Command.INIT, 2, W0, arrays=[ArraySpec(0, "float32", (3,))], data=[np.zeros(3, np.float32)])
    assert recv(rx0)[0].request == 2 and not tx0.poll(50)  # sent on tx0, answered on rx0
    push(tx0, 3, W0, np.ones(3, np.float32))  # quiet: no answer
    pull(tx0, 4, W0, 1)  # waits for the round of push 1
    assert not rx0.poll(100)
    push(rx1, 5, W1, np.ones(4, np.float32))  # wrong size: refused, and answered at once
    header, _ = recv(rx1)
    assert (header.command, header.request) == (Command.ERROR, 5) and "ShapeMismatchError" in header.body
    header, _ = recv(rx0)  # the round it would have joined fails for the others at once, naming it
    assert (header.command, header.request) == (Command.ERROR, 4) and "worker 1's push of key 0" in header.body
    push(rx1, 6, W1, np.full(3, 2.0, np.float32))  # round 2: the refused push held its place in round 1 (void)
    pull(tx0, 8, W0, 1)
    assert recv(rx0)[0].command is Command.ERROR  # round 1 changed nothing: its pulls fail, later ones too
    push(tx0, 9, W0, np.ones(3, np.float32))
    pull(tx0, 10, W0, 2)
    header, buffers = recv(rx0)
    assert header.request == 10 and np.frombuffer(buffers[0], np.float32).tolist() == [3.0] * 3
    send(tx0, Command.SYNC, 7, W0)
    assert recv(rx0)[0].request == 7  # a SYNC is answered at once
    assert not tx0.poll(50) and not rx1.poll(50)


def test_a_pull_sent_before_its_push_waits_for_it_and_refused_pushes_count(node):
    server, dealer = node
    s0, s1 = dealer(worker=W0), dealer(worker=W1)
    send(s0, Command.INIT, 1, W0, arrays=[ArraySpec(0, "float32", (3,))], data=[np.zeros(3, np.float32)])
    recv(s0)
    pull(s1, 2, W1, 2)  # worker 1's push 2 has not arrived
    push(s1, 3, W1, np.ones(4, np.float32))  # push 1: refused (counted)
    assert recv(s1)[0].command is Command.ERROR
    assert not s1.poll(100)
    push(s1, 4, W1, np.ones(3, np.float32))  # push 2 arrives; its round waits for worker 0
    assert not s1.poll(100)
    push(s0, 5, W0, np.full(3, 7.0, np.float32), quiet=False)  # an acknowledged push, in round 1: void
    header, _ = recv(s0)
    assert header.request == 5 and header.command is Command.REPLY and not header.arrays
    assert not s1.poll(100)
    push(s0, 6, W0, np.full(3, 5.0, np.float32))  # round 2, with worker 1's push 2
    header, buffers = recv(s1)
    assert header.request == 2 and np.frombuffer(buffers[0], np.float32).tolist() == [6.0] * 3


def test_a_push_is_acknowledged_before_the_pulls_its_round_answers(node):
    server, dealer = node
    s0, s1 = dealer(worker=W0), dealer(worker=W1)
    send(s0, Command.INIT, 1, W0, arrays=[ArraySpec(0, "float32", (3,))], data=[np.zeros(3, np.float32)])
    recv(s0)
    push(s1, 2, W1, np.ones(3, np.float32))
    pull(s1, 3, W1, 1)
    pull(s0, 4, W0, 1)  # overtakes worker 0's own push
    push(s0, 5, W0, np.ones(3, np.float32), quiet=False)  # completes the round: answers both pulls
    assert [recv(s0)[0].request for _ in range(2)] == [5, 4]  # the push's acknowledgement first
    assert recv(s1)[0].request == 3


@pytest.mark.parametrize("sender", [-1, 2, 8, 2**40])
def test_a_sender_that_is_no_worker_of_the_job_gets_a_protocol_error(node, sender):
    server, dealer = node
    sock = dealer(worker=W0)
    send(sock, Command.SYNC, 7, sender)
    header, _ = recv(sock)
    assert header.command is Command.ERROR and "ProtocolError" in header.body, header.body
    send(sock, Command.SYNC, 8, W0)  # the server serves on
    assert recv(sock)[0].command is Command.REPLY


# -- repeats after a reset connection ---------------------------------------------------------
def test_repeated_requests_are_answered_again_but_applied_once(node):
    server, dealer = node
    s0, s1 = dealer(worker=W0), dealer(worker=W1)
    send(s0, Command.INIT, 1, W0, arrays=[ArraySpec(0, "float32", (3,))], data=[np.zeros(3, np.float32)])
    recv(s0)
    send(s0, Command.INIT, 1, W0, arrays=[ArraySpec(0, "float32", (3,))], data=[np.zeros(3, np.float32)])
    assert recv(s0)[0].command is Command.REPLY  # the same answer, not "duplicate init"
    push(s0, 2, W0, np.ones(3, np.float32), quiet=False)
    assert recv(s0)[0].request == 2
    push(s0, 2, W0, np.ones(3, np.float32), quiet=False)  # a repeat: acknowledged again, not counted
    assert recv(s0)[0].request == 2
    push(s0, 3, W0, np.full(3, 7.0, np.float32))  # quiet, then its repeat: dropped
    push(s0, 3, W0, np.full(3, 7.0, np.float32))
    send(s1, Command.PUSHPULL, 1, W1, arrays=[ArraySpec(0, "float32", (3,))], data=[np.full(3, 10.0, np.float32)])
    send(s1, Command.PUSHPULL, 1, W1, arrays=[ArraySpec(0, "float32", (3,))], data=[np.full(3, 10.0, np.float32)])
    for _ in range(2):  # round 1 = 1 + 10 (worker 0's repeat not counted); the repeat, answered
        header, buffers = recv(s1)  # after the first: the same round again, its push not applied
        assert header.request == 1 and np.frombuffer(buffers[0], np.float32).tolist() == [11.0] * 3
    pull(s1, 9, W1, 3)  # waits for worker 1's push 3
    pull(s1, 9, W1, 3)  # its repeat while it waits: dropped
    send(s1, Command.PUSHPULL, 2, W1, arrays=[ArraySpec(0, "float32", (3,))], data=[np.full(3, 1.0, np.float32)])
    header, buffers = recv(s1)  # round 2 = worker 0's quiet push (7, once) + 1
    assert header.request == 2 and np.frombuffer(buffers[0], np.float32).tolist() == [8.0] * 3
    push(s1, 10, W1, np.full(3, 2.0, np.float32))  # worker 1's push 3: round 3 waits for worker 0
    push(s0, 11, W0, np.full(3, 3.0, np.float32))  # round 3 = 5: answers the pull, once
    header, buffers = recv(s1)
    assert header.request == 9 and np.frombuffer(buffers[0], np.float32).tolist() == [5.0] * 3
    assert not s1.poll(200)


def test_each_socket_has_its_own_request_ids(node):
    # a replacement process starts its request ids again, on new sockets: not a repeat
    server, dealer = node
    old, new = dealer(worker=W0), dealer()
    send(old, Command.INIT, 1, W0, arrays=[ArraySpec(0, "float32", (3,))], data=[np.zeros(3, np.float32)])
    recv(old)
    send(new, Command.HELLO, 7, W0, {"tx": "fedcba9876543210", "token": node_token(SECRET, W0)})  # a new session starts with HELLO (senders.py)
    assert recv(new)[0].command is Command.REPLY
    send(new, Command.INIT, 1, W0, arrays=[ArraySpec(5, "float32", (3,))], data=[np.zeros(3, np.float32)])
    assert recv(new)[0].command is Command.REPLY
    assert (5, 0) in server._shard.parts  # handled, not answered from the other socket's record
