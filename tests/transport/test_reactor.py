"""The reactor: ROUTER/DEALER round trips over inproc and loopback TCP, calls, timers, stop; hostile and
slow peers (bounded messages, bounded per-peer queues, junk on the local socket)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
import zmq

from pskv.errors import InvalidArgumentError, TransportError
from pskv.transport import Reactor
from pskv.transport.bounds import Bounds
from pskv.transport.frames import ZERO_COPY_BYTES, recv_frames, send_frames
from pskv.transport.unix import PACKET_BYTES, LocalConnection, local_path

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


# -- hostile and slow peers (issue 10): bounded, and the reactor never waits ------------------
SMALL = Bounds(max_message_bytes=1 << 20, max_frames=1000, send_queue_bytes=4 << 20, slow_peer_timeout=1.0)


@pytest.fixture
def owned(context):
    """Reactors and sockets a test made, stopped or closed however it ends (the context can then end)."""
    things: list[Reactor | zmq.Socket | LocalConnection] = []
    yield things
    for thing in reversed(things):
        if isinstance(thing, Reactor):
            thing.stop()
        elif isinstance(thing, LocalConnection):
            thing.close()
        else:
            thing.close(0)


def _dealer(context: zmq.Context, owned: list, address: str, reads: bool = True) -> zmq.Socket:
    sock = context.socket(zmq.DEALER)
    owned.append(sock)
    sock.linger = 0
    if not reads:  # takes as little as ZeroMQ allows before its sender's queue fills
        sock.setsockopt(zmq.RCVBUF, 4096)
        sock.setsockopt(zmq.RCVHWM, 1)
    sock.connect(address)
    return sock


def _echo_service(context: zmq.Context, owned: list, bounds: Bounds, reply: bytes | memoryview = b""
                  ) -> tuple[Reactor, str, list[float]]:
    """A ROUTER service answering every message with its first frame (and ``reply``); records each send's time."""
    server = Reactor(context, "server", bounds=bounds)
    owned.append(server)
    took: list[float] = []

    def echo(identity: bytes, frames: list[zmq.Frame]) -> None:
        start = time.monotonic()
        server.send_router(sid, identity, [bytes(frames[0].buffer), reply])
        took.append(time.monotonic() - start)

    sid, address = server.bind_router("tcp://127.0.0.1:0", echo)
    server.start()
    return server, address, took


def _round_trip(context: zmq.Context, address: str, payload: bytes = b"ping") -> list[bytes]:
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(address)
    try:
        sock.send(payload)
        assert sock.poll(WAIT * 1000), "the service did not answer"
        return sock.recv_multipart()
    finally:
        sock.close(0)


def test_a_peer_that_reads_nothing_is_dropped_and_others_are_served(context, owned, caplog):
    reply = memoryview(bytes(100_000))  # zero-copy: ZeroMQ's queue holds references, not copies
    server, address, took = _echo_service(context, owned, SMALL, reply)
    hog = _dealer(context, owned, address, reads=False)
    for _ in range(3000):  # ~300 MB of replies if all were kept; it never reads one
        hog.send(b"x")
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline and "dropped it" not in caplog.text:
        assert _round_trip(context, address)[0] == b"ping"  # served all along
        time.sleep(0.05)
    assert "took none of its messages" in caplog.text or "PSKV_SEND_QUEUE_BYTES" in caplog.text
    assert max(took) < 0.5 and server.error is None  # no send waited on the hog
    assert sum(b.bytes for b in server._backlogs.values()) <= SMALL.send_queue_bytes
    assert _round_trip(context, address)[0] == b"ping"


def test_a_slow_peer_that_reads_late_gets_every_reply_in_order(context, owned):
    roomy = Bounds(SMALL.max_message_bytes, SMALL.max_frames, send_queue_bytes=64 << 20, slow_peer_timeout=10.0)
    server, address, _ = _echo_service(context, owned, roomy, memoryview(bytes(10_000)))
    slow = _dealer(context, owned, address, reads=False)
    n = 3000  # past ZeroMQ's 1000 queued and the socket buffers: the rest wait in the reactor's backlog
    for i in range(n):
        slow.send(b"%d" % i)
    deadline = time.monotonic() + WAIT
    while not server._backlogs and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server._backlogs, "the replies never filled ZeroMQ's queue"
    got = []
    while len(got) < n and slow.poll(WAIT * 1000):
        got.append(int(slow.recv_multipart()[0]))
    assert got == list(range(n))


def test_a_message_of_more_frames_than_allowed_is_discarded_unbuilt(context, owned, caplog):
    seen: list[int] = []
    server = Reactor(context, "server")  # the default bounds
    owned.append(server)

    def handle(identity: bytes, frames: list[zmq.Frame]) -> None:
        seen.append(len(frames))
        server.send_router(sid, identity, [b"ok"])

    sid, address = server.bind_router("tcp://127.0.0.1:0", handle)
    ticks: list[float] = []
    server.add_timer(0.02, lambda: ticks.append(time.monotonic()))  # as a node's heartbeats run
    hostile = _dealer(context, owned, address)
    hostile.send_multipart([b""] * 400_000)  # twice PSKV_MAX_FRAMES (bench/faults sends 2 million)
    hostile.send(b"after")  # behind the big one on the same connection
    start = time.monotonic()
    server.start()
    assert hostile.poll(3 * WAIT * 1000) and hostile.recv_multipart() == [b"ok"]
    answered = time.monotonic()  # "after" is answered once the big message is discarded
    assert _round_trip(context, address)[0] == b"ok"
    assert "a message of 400001 frames" in caplog.text and "discarded" in caplog.text
    assert seen == [1, 1] and server.error is None
    assert time.monotonic() - start < 2 * WAIT
    # the rest was dropped in steps: the timer kept running meanwhile (counted, not timed: a loaded machine
    # stretches every gap, but a discard in one go would leave at most the tick before it)
    assert len([t for t in ticks if t < answered]) >= 3, (ticks[:5], answered - start)


def test_oversize_messages_are_refused_and_senders_refuse_to_send_them(context, owned, caplog):
    _, address, _ = _echo_service(context, owned, SMALL)
    hostile = _dealer(context, owned, address)
    hostile.send(bytes(2 << 20))  # one frame over the limit: ZeroMQ refuses it before allocating
    hostile.send_multipart([b"many"] + [bytes(600_000)] * 3)  # frames under, the message over
    assert _round_trip(context, address)[0] == b"ping"
    deadline = time.monotonic() + WAIT
    while "PSKV_MAX_MESSAGE_BYTES" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "PSKV_MAX_MESSAGE_BYTES=1048576: discarded" in caplog.text
    assert not hostile.poll(200)  # neither was answered
    client = Reactor(context, "client", bounds=SMALL)
    owned.append(client)
    sender = client.connect_sender(address)
    with pytest.raises(InvalidArgumentError, match="exceeds PSKV_MAX_MESSAGE_BYTES"):
        sender.send([b"h", memoryview(bytes(SMALL.max_message_bytes))])


@pytest.mark.parametrize("junk", [b"\x00", b"\x00\x01", b"\x00\x01\x02", b"\x07abcdefgh",
                                  b"\x00" + struct.pack("<I", 5) + struct.pack("<Q", 1 << 40) * 5,
                                  b"\x00" + struct.pack("<I", 1) + struct.pack("<Q", 99) + b"short",
                                  b"\x00" + struct.pack("<I", 1 << 30)],
                         ids=["1 byte", "2 bytes", "3 bytes", "bad flag", "lying lengths", "short frame",
                              "huge count"])
def test_junk_packets_on_the_local_socket_close_that_connection_only(context, owned, tmp_path, caplog, junk):
    server = Reactor(context, "server", bounds=SMALL)
    owned.append(server)
    handled: list[bytes] = []

    def handle(identity: bytes, frames: list[memoryview]) -> None:
        handled.append(bytes(frames[0]))
        server.send_router(sid, identity, [b"re:" + bytes(frames[0])])

    sid, _ = server.bind_router("tcp://127.0.0.1:0", handle)
    path = local_path(str(tmp_path))
    server.bind_local(sid, path)
    server.start()
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    raw.settimeout(WAIT)
    raw.connect(path)
    raw.send(junk)
    assert raw.recv(100) == b""  # the server closed this connection
    raw.close()
    assert "closed a local connection" in caplog.text and server.error is None and not handled
    client = Reactor(context, "client")
    owned.append(client)
    got: list[bytes] = []
    done = threading.Event()
    conn = client.connect_local(path, lambda frames: (got.append(bytes(frames[0])), done.set()))
    client.start()
    conn.send([b"legit"])
    assert done.wait(WAIT) and got == [b"re:legit"]


def test_a_local_peer_that_reads_nothing_is_dropped_without_stalling_the_reactor(context, owned, tmp_path, caplog):
    server = Reactor(context, "server", bounds=SMALL)
    owned.append(server)
    took: list[float] = []

    def handle(identity: bytes, frames: list[memoryview]) -> None:
        start = time.monotonic()
        server.send_router(sid, identity, [bytes(frames[0]), bytes(200_000)])
        took.append(time.monotonic() - start)

    sid, address = server.bind_router("tcp://127.0.0.1:0", handle)
    path = local_path(str(tmp_path))
    server.bind_local(sid, path)
    server.start()
    hog = LocalConnection.connect(path, "hog")  # sends, never reads
    owned.append(hog)
    deadline = time.monotonic() + WAIT
    with pytest.raises(ConnectionError):  # the server closes it once its replies pass the 4 MB bound
        sent = 0
        while time.monotonic() < deadline:  # 200 KB of replies each; under load the server may lag behind
            hog.send([b"x"])
            sent += 1
            if sent % 50 == 0:
                time.sleep(0.01)
    deadline = time.monotonic() + WAIT
    while "dropped" not in caplog.text and time.monotonic() < deadline:
        assert _round_trip(context, address)[0] == b"ping"  # the TCP side is served meanwhile
        time.sleep(0.05)
    assert "PSKV_SEND_QUEUE_BYTES" in caplog.text and max(took) < 0.5 and server.error is None
    assert not server._local_peers and not server._writable


def test_many_slow_peers_together_are_bounded_the_biggest_dropped_first(context, owned, caplog):
    patient = Bounds(SMALL.max_message_bytes, SMALL.max_frames, send_queue_bytes=4 << 20, slow_peer_timeout=60.0)
    server, address, took = _echo_service(context, owned, patient, memoryview(bytes(100_000)))
    hogs = [_dealer(context, owned, address, reads=False) for _ in range(8)]
    for hog in hogs:  # each stays under its own 4 MB bound; together they pass 4 x 4 MB
        for _ in range(300):
            hog.send(b"x")
    deadline = time.monotonic() + WAIT
    while "held the most" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "held the most" in caplog.text and "4 x PSKV_SEND_QUEUE_BYTES" in caplog.text
    assert sum(b.bytes for b in server._backlogs.values()) <= 4 * patient.send_queue_bytes
    assert max(took) < 0.5 and server.error is None
    assert _round_trip(context, address)[0] == b"ping"


def _local_echo(context: zmq.Context, owned: list, tmp_path, ready: Callable[[], bool] | None = None
                ) -> tuple[Reactor, str]:
    """A service answering each local message with ``re:`` + its first frame; its local socket's path.

    With ``ready``, each answer (but to ``later``) leaves only once ``ready()`` holds.
    """
    server = Reactor(context, "server")
    owned.append(server)

    def handle(identity: bytes, frames: list[memoryview]) -> None:
        if bytes(frames[0]) == b"bye":
            server._drop_local(server._local_peers[identity])  # closes the connection: the client reads EOF
            return
        reply = [b"re:" + bytes(frames[0])]
        if ready is None or frames[0] == b"later":
            server.send_router(sid, identity, reply)
            return

        def when_read() -> None:
            deadline = time.monotonic() + WAIT
            while not ready() and time.monotonic() < deadline:
                time.sleep(0.001)
            try:
                server.call_soon(lambda: server.send_router(sid, identity, reply))
            except TransportError:  # its test ended (its server stopped) while this waited: nothing to answer
                pass
        threading.Thread(target=when_read, daemon=True).start()

    sid, _ = server.bind_router("tcp://127.0.0.1:0", handle)
    path = local_path(str(tmp_path))
    server.bind_local(sid, path)
    server.start()
    return server, path


def test_a_waiting_thread_reads_its_replies_itself_and_the_reactor_takes_the_connection_back(context, owned,
                                                                                                tmp_path):
    client = Reactor(context, "client")
    owned.append(client)
    got: list[tuple[bytes, str]] = []
    arrived = threading.Event()

    def on_reply(frames: list[memoryview]) -> None:
        got.append((bytes(frames[0]), threading.current_thread().name))
        arrived.set()

    conns: list[LocalConnection] = []
    _, path = _local_echo(context, owned, tmp_path, ready=lambda: conns[0].claimed)  # answers once read
    conn = client.connect_local(path, on_reply)
    conns.append(conn)
    client.start()
    for i in range(20):  # each reply read by the thread that waits for it; none by the reactor
        conn.send([b"%d" % i])
        deadline = time.monotonic() + WAIT
        while len(got) < i + 1 and time.monotonic() < deadline:  # at once if the reactor holds the connection
            client.read_local(conn, on_reply, lambda n=i + 1: len(got) == n, deadline)  # (a loaded machine): again
        assert got[-1] == (b"re:%d" % i, "MainThread")
    assert not conn.claimed
    for _ in range(3):  # nobody waits now: the reactor reads (its poll takes the connection back when woken)
        arrived.clear()
        conn.send([b"later"])
        client.wake()
        assert arrived.wait(WAIT)
        assert got[-1] == (b"re:later", "client")
    assert conn.polled and client.error is None


def test_a_waiting_reader_stops_when_told_at_its_deadline_and_when_the_connection_fails(context, owned, tmp_path):
    _, path = _local_echo(context, owned, tmp_path)
    client = Reactor(context, "client")
    owned.append(client)
    got: list[bytes] = []
    conn = client.connect_local(path, lambda frames: got.append(bytes(frames[0])))
    client.start()
    start = time.monotonic()
    client.read_local(conn, lambda frames: got.append(bytes(frames[0])), lambda: False, start + 0.2)
    assert 0.2 <= time.monotonic() - start < 2.0 and not got  # no reply: the deadline ends it
    told = threading.Event()
    threading.Timer(0.2, told.set).start()  # e.g. its request failed on another thread (dead peer, expiry)
    start = time.monotonic()
    client.read_local(conn, lambda frames: got.append(bytes(frames[0])), told.is_set, start + WAIT)
    assert time.monotonic() - start < 2.0 and not got
    conn.send([b"bye"])  # the service closes the connection while this thread reads it
    start = time.monotonic()
    client.read_local(conn, lambda frames: got.append(bytes(frames[0])), lambda: False, start + WAIT)
    assert time.monotonic() - start < 2.0
    deadline = time.monotonic() + WAIT
    while conn.fd in client._locals and time.monotonic() < deadline:  # the reactor drops it
        time.sleep(0.01)
    assert conn.fd not in client._locals and not client._client_locals and client.error is None
    with pytest.raises(ConnectionError):
        conn.send([b"late"])
