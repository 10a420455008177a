"""The reactor: ROUTER/DEALER round trips over inproc and loopback TCP, calls, timers, stop."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import zmq

from pskv.errors import TransportError
from pskv.transport import Reactor
from pskv.transport.reactor import ZERO_COPY_BYTES, recv_frames, send_frames
from pskv.transport.unix import PACKET_BYTES, local_path

WAIT = 10.0


@pytest.fixture
def context():
    ctx = zmq.Context()
    yield ctx
    ctx.term()


@pytest.mark.parametrize("address", ["inproc://pskv-test-echo", "tcp://127.0.0.1:0"])
def test_request_reply_round_trip(context, address):
    server = Reactor(context, "server")
    client = Reactor(context, "client", identity=b"client-9")
    seen: list[bytes] = []

    def echo(identity: bytes, frames: list[zmq.Frame]) -> None:
        seen.append(identity)
        server.send_router(sid, identity, [b"re:" + frames[0].bytes, frames[1]])

    sid, bound = server.bind_router(address, echo)
    assert bound.startswith(address.rsplit(":", 1)[0]) and not bound.endswith(":0")
    got: list[list[bytes]] = []
    done = threading.Event()

    def on_reply(frames: list[zmq.Frame]) -> None:
        got.append([f.bytes for f in frames])
        if len(got) == 3:
            done.set()

    dealer = client.connect_dealer(bound, on_reply)
    server.start()
    client.start()
    for i in range(3):
        client.call_soon(lambda i=i: client.send_dealer(dealer, [b"ping%d" % i, memoryview(b"x" * i)]))
    assert done.wait(WAIT)
    assert got == [[b"re:ping%d" % i, b"x" * i] for i in range(3)]
    assert seen == [b"client-9"] * 3
    client.stop()
    server.stop()
    client.stop()  # idempotent


def test_timers_and_call_soon_run_on_the_reactor_thread(context):
    r = Reactor(context, "timers")
    ticks: list[str] = []
    fired = threading.Event()

    def tick() -> None:
        ticks.append(threading.current_thread().name)
        if len(ticks) >= 3:
            fired.set()

    r.add_timer(0.01, tick)
    r.start()
    assert fired.wait(WAIT)
    ran = threading.Event()
    r.call_soon(lambda: ran.set() if r.on_reactor_thread() else None)
    assert ran.wait(WAIT)
    assert set(ticks) == {"timers"}
    r.stop()
    with pytest.raises(TransportError, match="stopped"):
        r.call_soon(lambda: None)


def test_handler_failure_reaches_the_owner(context):
    failures: list[BaseException] = []
    failed = threading.Event()

    def on_failure(exc: BaseException) -> None:
        failures.append(exc)
        failed.set()

    r = Reactor(context, "failing", on_failure=on_failure)
    r.start()
    r.call_soon(lambda: 1 / 0)
    assert failed.wait(WAIT)
    assert isinstance(failures[0], ZeroDivisionError) and isinstance(r.error, ZeroDivisionError)
    r.stop()


def test_bind_errors_are_typed(context):
    r = Reactor(context, "binder")
    r.bind_router("inproc://pskv-test-dup", lambda i, f: None)
    with pytest.raises(TransportError, match="cannot bind inproc://pskv-test-dup"):
        r.bind_router("inproc://pskv-test-dup", lambda i, f: None)
    r.stop()


def test_reply_to_vanished_peer_is_dropped_not_fatal(context):
    r = Reactor(context, "lonely")
    sid, _ = r.bind_router("inproc://pskv-test-lonely", lambda i, f: None)
    result: list[bool] = []
    done = threading.Event()
    r.start()
    r.call_soon(lambda: (result.append(r.send_router(sid, b"nobody", [b"x"])), done.set()))
    assert done.wait(WAIT)
    assert result == [False] and r.error is None
    r.stop()


def test_senders_are_shared_by_threads_and_replies_reach_the_polled_socket(context):
    server = Reactor(context, "server")
    client = Reactor(context, "client")
    got: list[bytes] = []
    done = threading.Event()
    big = np.arange(100_000, dtype=np.float32)  # sent without a copy (above ZERO_COPY_BYTES)
    rx_identity: list[bytes] = []

    def handle(identity: bytes, frames: list[zmq.Frame]) -> None:
        if frames[0].bytes == b"hello":
            rx_identity.append(identity)
            return
        assert np.frombuffer(frames[1].buffer, np.float32)[-1] == big[-1]
        server.send_router(sid, rx_identity[0], [frames[0], b"ok"])  # reply to the other socket

    def on_reply(frames: list[zmq.Frame]) -> None:
        got.append(frames[0].bytes)
        if len(got) == 40:
            done.set()

    sid, address = server.bind_router("tcp://127.0.0.1:0", handle)
    rx = client.connect_dealer(address, on_reply)
    sender = client.connect_sender(address)
    server.start()
    client.start()
    client.call_soon(lambda: client.send_dealer(rx, [b"hello"]))
    while not rx_identity:
        threading.Event().wait(0.01)

    def send_some(t: int) -> None:
        for i in range(10):
            sender.send([b"%d-%d" % (t, i), memoryview(big).cast("B")])

    threads = [threading.Thread(target=send_some, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert done.wait(WAIT)
    assert sorted(got) == sorted(b"%d-%d" % (t, i) for t in range(4) for i in range(10))
    for t in range(4):  # one thread's messages stay in order
        mine = [g for g in got if g.startswith(b"%d-" % t)]
        assert mine == [b"%d-%d" % (t, i) for i in range(10)]
    client.stop()
    with pytest.raises(TransportError, match="stopped"):
        sender.send([b"late"])
    server.stop()


def test_local_connections_carry_messages_both_ways_like_router_peers(context, tmp_path):
    server = Reactor(context, "server")
    client = Reactor(context, "client")
    seen: list[tuple[bytes, list[bytes]]] = []
    got: list[list[bytes]] = []
    done = threading.Event()
    huge = np.arange(3 * PACKET_BYTES // 4 + 5, dtype=np.float32)  # spans several packets

    def handle(identity: bytes, frames: list[memoryview]) -> None:
        seen.append((identity, [bytes(f) for f in frames[:1]]))
        server.send_router(sid, identity, [b"re:" + bytes(frames[0]), *frames[1:]])

    def on_reply(frames: list[memoryview]) -> None:
        got.append([bytes(f) for f in frames])
        if len(got) == 42:
            done.set()

    sid, _ = server.bind_router("tcp://127.0.0.1:0", handle)
    path = local_path(str(tmp_path))
    server.bind_local(sid, path)
    server.start()
    conn = client.connect_local(path, on_reply)
    client.start()

    def send_some(t: int) -> None:
        for i in range(10):
            conn.send([b"%d-%d" % (t, i), b"", memoryview(np.full(3, i, np.int64)).cast("B")])

    threads = [threading.Thread(target=send_some, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    conn.send([b"big", memoryview(huge).cast("B")])
    conn.send([b"after"])
    assert done.wait(WAIT)
    assert len({identity for identity, _ in seen}) == 1  # one peer, its own identity
    by_name = {m[0]: m for m in got}
    assert by_name[b"re:2-7"] == [b"re:2-7", b"", np.full(3, 7, np.int64).tobytes()]
    assert np.array_equal(np.frombuffer(by_name[b"re:big"][1], np.float32), huge)
    assert got[-1] == [b"re:after"]  # order kept across a multi-packet message
    for t in range(4):
        mine = [m[0] for m in got if m[0].startswith(b"re:%d-" % t)]
        assert mine == [b"re:%d-%d" % (t, i) for i in range(10)]
    client.stop()  # the server notices the closed connection and drops it
    for _ in range(100):
        if not server._local_peers:
            break
        threading.Event().wait(0.02)
    assert not server._local_peers and server.error is None
    with pytest.raises(ConnectionError):
        conn.send([b"late"])
    server.stop()


def test_send_and_recv_frames_keep_frames_and_copy_only_small_ones(context):
    a, b = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    a.bind("inproc://pskv-test-frames")
    b.connect("inproc://pskv-test-frames")
    small = np.ones(4, np.float32)
    large = np.ones(ZERO_COPY_BYTES, np.uint8)
    send_frames(a, [b"head", memoryview(small).cast("B"), memoryview(large).cast("B")])
    small[:] = 7  # copied at send: the receiver still sees ones
    assert b.poll(WAIT * 1000)
    frames = recv_frames(b)
    assert [len(f.buffer) for f in frames] == [4, 16, ZERO_COPY_BYTES]
    assert np.frombuffer(frames[1].buffer, np.float32).tolist() == [1.0] * 4
    a.close(0)
    b.close(0)
