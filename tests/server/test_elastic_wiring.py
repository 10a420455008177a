"""An elastic job's server wiring (issue 24, step 3): COMMIT, KEYS, views and epochs through a real ServerCore.

The snapshots and views are tested as units (test_commits.py, test_members.py); here the messages
go through ``ServerCore.handle`` as a worker sends them: a commit, pushes after it, then a view
that voids them rolls the values back bit-exactly, a message of an older view is refused with
MembershipChangedError (mapped to that class by the worker's RequestTracker), one of a newer view
is held until that view comes, also when its header is too long to be read at once (an INIT
naming thousands of str keys), and KEYS lists the parts in pages. A job that is not elastic
refuses both. No sockets, no threads: milliseconds.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import zmq

import pskv.server.control as control
from pskv.cluster.requests import Pending, RequestTracker
from pskv.config import ClusterConfig
from pskv.errors import MembershipChangedError
from pskv.optimizer import SGD, Adam
from pskv.partition import server_key
from pskv.protocol import ArraySpec, Command, Header, Role, decode, encode
from pskv.protocol.bodies import (
    Commit,
    ErrorReply,
    Hello,
    InitBody,
    KeysRequest,
    KeyTable,
    OptimizerConfig,
    Roster,
    View,
    node_token,
)
from pskv.protocol.codec import PEEK_BYTES
from pskv.server.commits import CommitSnapshots, NoCommits
from pskv.server.core import ServerCore
from pskv.testing.cluster import InProcessCluster
from tests.cluster.test_elastic_scheduler import roster, wait_for
from tests.cluster.test_scheduler import Node

SECRET = "5e" * 32
W0, W1 = 9, 11  # node ids of worker slots 0 and 1
KEY = 5
SPEC = ArraySpec(KEY, "float32", (4,))


class Server:
    """A ServerCore and what it sent, with a worker's requests made for it."""

    def __init__(self, elastic: bool = True) -> None:
        self.sent: list = []
        self.asked: list[int] = []
        cluster = ClusterConfig(num_servers=1, num_workers=2, min_workers=1 if elastic else 0,
                                max_workers=4 if elastic else 0)
        self.core = ServerCore(cluster,
                               lambda peer, frames: self.sent.append((peer, frames)), lambda: 8, lambda: "server 0",
                               lambda: 0, lambda: SECRET, ask_view=lambda: self.asked.append(1))
        self.request = 0
        self.epoch = 0

    def send(self, sender: int, command: Command, arrays=(), data=(), body: str = "", epoch: int | None = None,
             identity: bytes | None = None) -> int:
        self.request += 1
        header = Header(command, self.request, sender, tuple(arrays), body=body,
                        epoch=self.epoch if epoch is None else epoch)
        self.core.handle(identity or bytes([sender]), [bytes(f) for f in encode(header, list(data))])
        return self.request

    def reply(self, request: int):
        """The one reply to ``request`` (header, buffers), taken out of what was sent."""
        found = [i for i, (_, frames) in enumerate(self.sent) if decode(frames)[0].request == request]
        assert len(found) == 1, (request, [decode(f)[0] for _, f in self.sent])
        return decode(self.sent.pop(found[0])[1])

    def ok(self, request: int) -> Header:
        header, _ = self.reply(request)
        assert header.command is Command.REPLY, ErrorReply.parse(header)
        return header

    def value(self, sender: int, number: int) -> np.ndarray:
        """``sender``'s pull of the round of its push ``number``."""
        header, buffers = self.reply(self.send(sender, Command.PULL, [SPEC._replace(round=number)]))
        assert header.command is Command.REPLY, ErrorReply.parse(header)
        return np.frombuffer(buffers[0], np.float32).copy()

    def start(self) -> None:
        """View 1 (slots 0 and 1), both workers opened, the key made."""
        self.view(View(1, (0, 1), 0, "start"))
        for w in (W0, W1):
            self.ok(self.send(w, Command.HELLO, body=Hello("", node_token(SECRET, w)).encode()))
        self.ok(self.send(W0, Command.INIT, [SPEC], [np.zeros(4, np.float32)]))

    def view(self, view: View) -> None:
        self.core.adopt(view)
        self.epoch = view.epoch

    def push_round(self, number: int, a: np.ndarray, b: np.ndarray) -> None:
        for w, data in ((W0, a), (W1, b)):
            self.ok(self.send(w, Command.PUSH, [SPEC._replace(round=number)], [data]))


def _values(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)


def _error(server: Server, request: int) -> tuple[str, str]:
    header, _ = server.reply(request)
    assert header.command is Command.ERROR
    kind, message, _ = ErrorReply.parse(header)
    return kind, message


OPTIMIZERS = [None, SGD(learning_rate=0.1, momentum=0.9), Adam(learning_rate=0.01)]


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=["sum", "sgd-momentum", "adam"])
def test_a_voiding_view_rolls_back_to_the_commit_and_the_redo_is_bit_exact(optimizer):
    server = Server()
    assert isinstance(server.core.commits, CommitSnapshots)
    server.start()
    if optimizer is not None:
        server.ok(server.send(W0, Command.SET_OPTIMIZER, body=OptimizerConfig(optimizer.to_config()).encode()))
    server.push_round(1, *_values(1))
    committed = server.value(W0, 1)
    server.ok(server.send(W0, Command.COMMIT, body=Commit(1, 1).encode()))
    server.push_round(2, *_values(2))
    first = server.value(W0, 2)
    server.push_round(3, *_values(3))
    assert not np.array_equal(server.value(W0, 3), first)
    server.view(View(2, (0, 1), 1, "refill"))  # names commit 1 and voids everything since
    np.testing.assert_array_equal(server.value(W0, 0), committed)  # push numbers start over: push 0 reads it
    server.push_round(1, *_values(2))  # the redo of step 2, in view 2
    np.testing.assert_array_equal(server.value(W0, 1), first)  # values and optimizer state were put back


def test_a_departure_fails_the_parked_pulls_and_the_rounds_wait_for_the_survivors_only():
    server = Server()
    server.start()
    server.push_round(1, *_values(1))
    committed = server.value(W0, 1)
    server.ok(server.send(W0, Command.COMMIT, body=Commit(1, 1).encode()))
    server.ok(server.send(W0, Command.PUSH, [SPEC._replace(round=2)], [np.ones(4, np.float32)]))
    parked = server.send(W0, Command.PULL, [SPEC._replace(round=2)])  # waits for slot 1's push 2: it departs
    server.view(View(2, (0,), 1, "failure"))
    kind, message = _error(server, parked)
    assert kind == "MembershipChangedError" and "view 2" in message
    assert server.core.shard.num_workers == 1 and server.core.view.members == {W0}
    np.testing.assert_array_equal(server.value(W0, 0), committed)
    redo = _values(2)[0]
    server.ok(server.send(W0, Command.PUSH, [SPEC._replace(round=1)], [redo]))  # the one member's round completes
    np.testing.assert_array_equal(server.value(W0, 1), redo)
    assert _error(server, server.send(W1, Command.PULL, [SPEC]))[1] == f"sender {W1} is not a worker of this job"


def test_a_message_of_an_older_view_gets_membership_changed_naming_its_epoch_and_the_worker_that_class():
    server = Server()
    server.start()
    server.view(View(2, (0, 1), 0, "failure"))
    request = server.send(W0, Command.PULL, [SPEC], epoch=1)
    header, buffers = server.reply(request)
    kind, message = _error(server, server.send(W0, Command.PULL, [SPEC], epoch=1))
    assert kind == "MembershipChangedError"
    assert "a request of view 1 reached a server in view 2" in message
    tracker = RequestTracker()
    pending: Pending = tracker.new(8, "pull")
    tracker.deliver(pending, header, buffers)
    assert isinstance(pending.error, MembershipChangedError)
    assert str(pending.error).startswith(MembershipChangedError.PREFIX) and "view 1" in str(pending.error)


def test_a_message_of_a_newer_view_is_held_until_the_view_comes():
    server = Server()
    server.start()
    request = server.send(W0, Command.PULL, [SPEC], epoch=2)
    assert server.sent == [] and server.asked == [1]  # held; the view asked for at once
    server.view(View(2, (0, 1), 0, "grow"))
    server.ok(request)


def test_a_strangers_message_of_a_newer_view_is_refused_not_held():
    server = Server()
    server.start()
    kind, message = _error(server, server.send(13, Command.PULL, [SPEC], epoch=2, identity=b"stranger"))
    assert kind == "ProtocolError" and "not bound" in message and server.asked == []


def test_a_joiners_hello_of_the_next_view_is_held_and_answered_once_it_is_a_member():
    server = Server()
    server.start()
    joiner = 13  # slot 2
    hello = server.send(joiner, Command.HELLO, body=Hello("", node_token(SECRET, joiner)).encode(), epoch=2)
    assert server.sent == [] and server.asked == [1]
    server.view(View(2, (0, 1, 2), 0, "grow"))
    server.ok(hello)
    assert server.core.view.rank(joiner) == 2 and server.core.shard.num_workers == 3


def _long_init(server: Server, names: list[str], epoch: int | None = None) -> int:
    """An INIT of a str key per name, naming them in its body: a msgpack header past PEEK_BYTES (read in two
    halves, its epoch with its specs)."""
    specs = [ArraySpec(server_key(n), "float32", (1,)) for n in names]
    body = InitBody.of(names).encode()
    assert len(encode(Header(Command.INIT, 1, W0, tuple(specs), body=body, epoch=server.epoch))[0]) > PEEK_BYTES
    return server.send(W0, Command.INIT, specs, [np.zeros(1, np.float32)] * len(specs), body, epoch)


def test_a_long_header_of_the_current_view_is_served_and_one_of_another_view_is_refused_or_held():
    server = Server()
    server.start()
    server.view(View(2, (0, 1), 0, "grow"))
    names = [f"layer{i}.weight" for i in range(3_000)]  # an INIT of a model's str keys in one call
    server.ok(_long_init(server, names))  # its epoch read with its specs (once peeked at, it seemed view 0)
    assert server.core.key_names[server_key(names[-1])] == names[-1]
    kind, message = _error(server, _long_init(server, [f"old{i}" for i in range(3_000)], epoch=1))
    assert kind == "MembershipChangedError" and "a request of view 1 reached a server in view 2" in message
    held = _long_init(server, [f"new{i}" for i in range(3_000)], epoch=3)
    assert server.sent == [] and server.asked == [1]
    server.view(View(3, (0, 1), 0, "grow"))
    server.ok(held)


def test_a_commit_with_an_open_round_is_refused():
    server = Server()
    server.start()
    server.send(W0, Command.PUSH, [SPEC._replace(round=1)], [np.ones(4, np.float32)])
    kind, message = _error(server, server.send(W0, Command.COMMIT, body=Commit(1, 1).encode()))
    assert kind == "CollectiveMismatchError" and "commit 1" in message


def test_keys_lists_the_parts_in_pages(monkeypatch):
    monkeypatch.setattr(control, "MAX_KEY_PARTS", 2)
    server = Server()
    server.start()
    for key in (6, 7):
        server.ok(server.send(W0, Command.INIT, [ArraySpec(key, "float64", (3,))], [np.zeros(3)]))
    first = KeyTable.parse(server.ok(server.send(W1, Command.KEYS, body=KeysRequest(0).encode())))
    assert [(p.key, p.dtype, p.size, p.row_width) for p in first.parts] == [(KEY, "float32", 4, 0), (6, "float64", 3, 0)]
    assert first.next == 2
    last = KeyTable.parse(server.ok(server.send(W1, Command.KEYS, body=KeysRequest(first.next).encode())))
    assert [p.key for p in last.parts] == [7] and last.next == 0


def test_a_job_that_is_not_elastic_has_no_snapshots_and_refuses_commits_and_epochs():
    server = Server(elastic=False)
    assert isinstance(server.core.commits, NoCommits) and server.core.shard.observer is server.core.observer
    for w in (W0, W1):
        server.ok(server.send(w, Command.HELLO, body=Hello("", node_token(SECRET, w)).encode()))
    assert _error(server, server.send(W0, Command.COMMIT, body=Commit(1, 1).encode()))[0] == "NotSupportedError"
    kind, message = _error(server, server.send(W0, Command.PULL, [SPEC], epoch=3))
    assert kind == "InvalidArgumentError" and "not elastic" in message and server.asked == []
    specs = [ArraySpec(k, "float32", (1, 1)) for k in range(PEEK_BYTES // 8)]  # 2-D: a msgpack header, long
    kind, message = _error(server, server.send(W0, Command.PULL, specs, epoch=3))
    assert kind == "InvalidArgumentError" and "not elastic" in message  # its epoch read, not taken for 0


def test_trace_keeps_the_copy_on_write_observer():
    server = Server()
    server.core.trace(None)
    assert server.core.shard.observer is not server.core.observer  # wrapped again
    assert getattr(server.core.shard.observer, "inner", None) is server.core.observer


def test_a_server_node_adopts_the_view_it_registered_in_and_the_views_its_heartbeats_bring():
    """Through the node: the admission view at registration, a departure's view from the scheduler."""
    settings = {"min_workers": 1, "max_workers": 3, "heartbeat_interval": 0.05, "heartbeat_timeout": 1.0,
                "launch_token": SECRET}
    ctx = zmq.Context()
    workers: list[Node] = []
    try:
        with InProcessCluster(1, 2, deadline=10.0, **settings) as cluster:
            workers = [Node(ctx, cluster.worker_config(r), Role.WORKER) for r in range(2)]
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(lambda r: workers[r].member.register(r), range(2)))
            core = cluster.servers[0]._core
            wait_for(lambda: core.view.epoch == 1, "the server adopts the view it was admitted in")
            assert core.view.members == {W0, W1} and isinstance(core.commits, CommitSnapshots)
            assert roster(ctx, cluster.scheduler, Roster("gone", 1, SECRET)).command is Command.REPLY
            wait_for(lambda: core.view.epoch == 2, "the server hears of the departure's view")
            assert core.view.members == {W0} and core.shard.num_workers == 1
            cluster.servers[0].stop()
    finally:
        for w in workers:
            w.stop()
        ctx.destroy(linger=0)
