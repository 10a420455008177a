"""Local (Unix-domain packet) connections: framing, big messages, timeouts, closed peers, a service's
queued sends, validation of every packet, a bounded connect to a frozen listener (and a worker's fallback)."""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import zmq

import pskv.transport.unix as unix
from pskv.errors import OperationTimeoutError, ProtocolError
from pskv.transport.bounds import Bounds
from pskv.transport.frames import Sender
from pskv.transport.reactor import Reactor
from pskv.transport.unix import LocalConnection, local_path
from pskv.worker.lanes import Lanes


def pair(timeout: float = 5.0) -> tuple[LocalConnection, LocalConnection]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    return LocalConnection(a, "a", send_timeout=timeout), LocalConnection(b, "b", send_timeout=timeout)


def receive_whole(conn: LocalConnection) -> list[bytes]:
    while True:
        try:
            frames = conn.receive()
        except BlockingIOError:
            threading.Event().wait(0.001)
            continue
        if frames is not None:
            return [bytes(f) for f in frames]


def test_messages_keep_their_frames_and_order_and_can_span_packets():
    a, b = pair()
    with pytest.raises(BlockingIOError):
        b.receive()  # nothing waiting: never blocks
    big = np.arange(600_000, dtype=np.float32)  # 2.4 MB: several packets
    many = [b"%d" % i for i in range(1000)]  # more frames than one system call gathers
    sender = threading.Thread(target=lambda: (a.send([b"one", b"", memoryview(big).cast("B")]),
                                              a.send(many), a.send([b"last"])))
    sender.start()
    first = receive_whole(b)
    assert first[:2] == [b"one", b""] and np.array_equal(np.frombuffer(first[2], np.float32), big)
    assert receive_whole(b) == many
    assert receive_whole(b) == [b"last"]
    sender.join()
    frames = (b.send([b"x"]), a.receive())[1]
    assert frames is not None and memoryview(frames[0]).readonly is False  # writable, as ZeroMQ frames
    a.close()
    with pytest.raises(EOFError):
        b.receive()
    with pytest.raises(ConnectionError):
        a.send([b"late"])
    b.close()


def test_a_send_to_a_peer_that_reads_nothing_times_out_and_closes():
    a, b = pair(timeout=0.2)
    with pytest.raises(ConnectionError, match="took nothing for 0.2 s"):
        for _ in range(10_000):
            a.send([b"x" * 60_000])
    with pytest.raises(ConnectionError, match="closed"):
        a.send([b"y"])
    with pytest.raises(EOFError):  # shut down, not closed: the reader (a reactor) sees the end, then closes it
        for _ in range(10_000):
            a.receive(wait=0.05)
    a.close()
    b.close()


def test_a_service_connection_queues_what_the_peer_cannot_take_and_never_waits():
    bounds = Bounds(max_message_bytes=1 << 20, max_frames=16, send_queue_bytes=8 << 20, slow_peer_timeout=0.3)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    service, peer = LocalConnection(a, "service", bounds=bounds, queued=True), LocalConnection(b, "peer")
    start = time.monotonic()
    for i in range(20):  # 4 MB: more than the socket buffers take
        service.send([b"%d" % i, bytes(200_000)])
    assert time.monotonic() - start < 1.0 and service.pending  # nothing waited
    assert not service.overdue(time.monotonic())
    time.sleep(0.35)
    assert service.overdue(time.monotonic())  # untouched past slow_peer_timeout: the owner drops it
    got = []
    while len(got) < 20:
        service.flush()
        try:
            frames = peer.receive()
        except BlockingIOError:
            continue
        if frames is not None:
            got.append(bytes(frames[0]))
    assert got == [b"%d" % i for i in range(20)] and service.flush() and not service.pending  # all, in order
    for _ in range(20):  # the peer reads nothing now: the queue is bounded, then dropped
        try:
            service.send([b"x", bytes(1 << 19)])
        except ConnectionError as exc:
            assert "PSKV_SEND_QUEUE_BYTES" in str(exc)
            break
    else:
        raise AssertionError("the queue was not bounded")
    with pytest.raises(ConnectionError, match="closed"):
        service.send([b"late"])
    peer.close()


def test_received_packets_are_validated_before_use():
    bounds = Bounds(max_message_bytes=1000, max_frames=4, send_queue_bytes=1 << 20, slow_peer_timeout=1.0)
    for junk, why in [(b"\x00", "no frame table"), (b"\x00\x01\x02", "no frame table"), (b"\x05abcd", "flag byte"),
                      (b"\x00" + struct.pack("<I", 5) + bytes(40), "5 frames"),
                      (b"\x00" + struct.pack("<I", 1) + struct.pack("<Q", 9) + b"abc", "frames of 9 bytes in 3"),
                      (b"\x00" + struct.pack("<I", 1) + struct.pack("<Q", 2000) + bytes(2000), "over PSKV_MAX_MESSAGE")]:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn = LocalConnection(b, "server side", bounds=bounds, queued=True)
        a.send(junk)
        with pytest.raises(ProtocolError, match=why):
            receive_whole(conn)
        a.close()
        conn.close()


def test_flushing_to_a_peer_that_is_gone_raises_connection_error_and_closes():
    bounds = Bounds(max_message_bytes=1 << 20, max_frames=16, send_queue_bytes=64 << 20, slow_peer_timeout=10.0)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    service = LocalConnection(a, "service", bounds=bounds, queued=True)
    while not service.pending:
        service.send([bytes(200_000)])
    b.close()
    with pytest.raises(ConnectionError):
        service.flush()
    assert not service.pending
    with pytest.raises(ConnectionError, match="closed"):
        service.send([b"late"])


@pytest.fixture
def frozen(tmp_path):
    """The path of a listener that accepts nothing, its backlog full (a frozen server's local socket)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    path = local_path(str(tmp_path))
    listener.bind(path)
    listener.listen(0)
    waiting: list[socket.socket] = []
    try:
        while True:  # the kernel takes a connection or two past listen(0)'s backlog: fill it
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            waiting.append(sock)
            sock.setblocking(False)
            sock.connect(path)
    except BlockingIOError:
        pass
    yield path
    for sock in (listener, *waiting):
        sock.close()


def test_a_connect_to_a_listener_that_accepts_nothing_times_out(frozen, monkeypatch):
    start = time.monotonic()
    with pytest.raises(OperationTimeoutError, match="took no connection in 0.2 s") as raised:
        LocalConnection.connect(frozen, "worker", send_timeout=0.2)
    assert isinstance(raised.value, OSError) and time.monotonic() - start < 1.0
    monkeypatch.setattr(unix, "CONNECT_TIMEOUT", 0.1)  # a long send timeout (a request's): the connect's bound
    start = time.monotonic()
    with pytest.raises(OperationTimeoutError, match="in 0.1 s"):
        LocalConnection.connect(frozen, "worker", send_timeout=300.0)
    assert time.monotonic() - start < 1.0


def test_a_worker_whose_local_server_is_frozen_uses_zeromq(frozen, monkeypatch, caplog):
    monkeypatch.setattr(unix, "CONNECT_TIMEOUT", 0.1)
    context = zmq.Context()
    reactor = Reactor(context, "worker")
    client = SimpleNamespace(_reactor=reactor, _on_reply=lambda frames: None, _servers=[], _tx="w0",
                             _cluster=SimpleNamespace(request_timeout=300.0),
                             replacement=SimpleNamespace(watch=lambda *args: None))
    try:
        with caplog.at_level(logging.INFO, "pskv.worker"):
            lane = Lanes(client)._connect(0, "tcp://127.0.0.1:9", frozen)  # type: ignore[arg-type]
        assert isinstance(lane, Sender) and client._servers[0] is not None
        assert "local socket" in caplog.text and "took no connection in 0.1 s" in caplog.text
    finally:
        reactor.stop()
        context.destroy(linger=0)
