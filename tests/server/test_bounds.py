"""Per-peer state of a server stays bounded under many peers and request ids (issue 10), without sockets."""

from __future__ import annotations

import numpy as np
import pytest

from pskv.config import ClusterConfig
from pskv.errors import InvalidArgumentError
from pskv.protocol import ArraySpec, Command, Header, decode, encode
from pskv.protocol.bodies import Hello, node_token
from pskv.server.core import ServerCore
from pskv.server.dedup import SEEN_PER_SOCKET, ReplyCache
from pskv.server.gather import PARKED_PER_PART, PARKED_SLACK
from pskv.server.routes import ROUTES_PER_WORKER, Routes
from pskv.server.senders import CONNECTIONS_PER_WORKER

W0 = 9  # node id of worker 0


def test_reply_cache_forgets_the_least_recently_used_sockets():
    cache = ReplyCache(sockets=4)
    for peer in range(100):
        for request in range(3):
            cache.begin(b"peer-%d" % peer, request)
            cache.end()
    assert len(cache) == 4 and cache.remembered() == 12
    cache.begin(b"peer-96", 99)  # used again: kept while newer sockets come
    cache.end()
    for peer in range(200, 203):
        cache.begin(b"peer-%d" % peer, 0)
        cache.end()
    assert cache.begin(b"peer-96", 99) is not None  # still remembered: a repeat


def test_routes_keep_a_few_per_worker_and_the_newest_wins():
    routes = Routes()
    for i in range(1000):
        routes.add(b"tx-%d" % i, b"rx-%d" % i, W0)
    routes.add(b"tx-w1", b"rx-w1", 11)
    assert len(routes) == ROUTES_PER_WORKER + 1
    assert routes.get(b"tx-999") == b"rx-999" and routes.get(b"tx-0") == b"tx-0"  # forgotten: answered in place
    assert routes.get(b"tx-w1") == b"rx-w1"  # another worker's route is untouched


SECRET = "5e" * 32  # the job's secret (the scheduler's, in a job)


def _core(sent: list) -> ServerCore:
    return ServerCore(ClusterConfig(num_servers=1, num_workers=2), lambda peer, frames: sent.append((peer, frames)),
                      lambda: 8, lambda: "server 0", lambda: 0, lambda: SECRET)


def _hello(core: ServerCore, connection: bytes, sender: int = W0, tx: str = "") -> None:
    """Open ``connection`` as worker ``sender`` does: HELLO with its token."""
    core.handle(connection, _request(Command.HELLO, 10**9, body=Hello(tx, node_token(SECRET, sender)).encode(),
                                     sender=sender))


def _request(command: Command, request: int, arrays=(), data=(), body: str = "", sender: int = W0) -> list:
    return [bytes(f) for f in encode(Header(command, request, sender, tuple(arrays), body=body), list(data))]


def test_a_server_core_bounds_routes_windows_and_parked_pulls_of_a_hostile_peer():
    sent: list = []
    core = _core(sent)
    spec = ArraySpec(5, "float32", (4,))
    _hello(core, b"conn")
    core.handle(b"conn", _request(Command.INIT, 1, [spec], [np.zeros(4, np.float32)]))
    for i in range(500):  # many send-only sockets said HELLO, each on a new connection
        _hello(core, b"conn-%d" % i, tx=f"{i:016x}")
    assert len(core.routes) <= ROUTES_PER_WORKER
    assert len(core.replies) <= CONNECTIONS_PER_WORKER * 2
    for request in range(3 * SEEN_PER_SOCKET):  # one socket, ever new request ids
        core.handle(b"conn-499", _request(Command.SYNC, 1000 + request))
    assert core.replies.remembered() <= len(core.replies) * SEEN_PER_SOCKET
    sent.clear()
    limit = PARKED_PER_PART * 1 + PARKED_SLACK
    far = ArraySpec(5, "float32", (4,), 0, 10**9)  # a pull after push 10^9: it would wait forever
    for request in range(limit + 50):
        core.handle(b"conn-499", _request(Command.PULL, 10**6 + request, [far]))
    refused = [decode(frames)[0] for _, frames in sent]
    assert len(refused) == 50 and all(h.command is Command.ERROR for h in refused)
    assert "would pass the bound" in refused[0].body and "worker 0" in refused[0].body
    assert core.data.parking.held[W0] == limit
    sent.clear()  # the worker's other connection keeps its own room
    core.handle(b"conn-498", _request(Command.PULL, 2 * 10**6, [ArraySpec(5, "float32", (4,), 0, 1)]))
    assert not sent and core.data.parking.held_by[b"conn-498"] == 1


def test_a_parked_pull_answered_frees_its_place():
    sent: list = []
    core = _core(sent)
    spec = ArraySpec(5, "float32", (4,))
    _hello(core, b"conn")
    _hello(core, b"conn-w1", sender=11)
    core.handle(b"conn", _request(Command.INIT, 1, [spec], [np.zeros(4, np.float32)]))
    core.handle(b"conn", _request(Command.PULL, 2, [ArraySpec(5, "float32", (4,), 0, 1)]))  # after push 1: parked
    assert core.data.parking.held == {W0: 1}
    core.handle(b"conn", _request(Command.PUSH, 3, [spec], [np.ones(4, np.float32)]))
    assert core.data.parking.held == {W0: 1}  # its round waits for worker 1
    core.handle(b"conn-w1", _request(Command.PUSH, 1, [spec], [np.ones(4, np.float32)], sender=11))
    assert core.data.parking.held == {}  # answered: its place is free
    assert 2 in [decode(f)[0].request for _, f in sent]
    with pytest.raises(InvalidArgumentError):
        core.data.parking.park(W0, b"conn", core.data.parking.limit() + 1, None)


def test_a_route_in_use_is_kept_while_new_ones_come():
    routes = Routes()
    routes.add(b"tx-live", b"rx-live", W0)
    for i in range(100):
        routes.add(b"tx-%d" % i, b"rx-%d" % i, W0)
        assert routes.get(b"tx-live") == b"rx-live"  # its requests keep coming: never the least recently used
    assert len(routes) == ROUTES_PER_WORKER
