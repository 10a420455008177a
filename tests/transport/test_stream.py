"""Data connections (:mod:`pskv.transport.stream`): framing, bounds before allocation, sends that never wait."""

from __future__ import annotations

import socket
import struct
import time

import numpy as np
import pytest

from pskv.errors import InvalidArgumentError, ProtocolError
from pskv.transport.bounds import Bounds
from pskv.transport.stream import (
    AVOIDED,
    INSTEAD,
    MAGIC,
    OPENING_BYTES,
    StreamConnection,
    choose_congestion,
    listen_tcp,
    tag_of,
)

BOUNDS = Bounds(max_message_bytes=1 << 20, max_frames=8, send_queue_bytes=4 << 20, slow_peer_timeout=5.0)
TAG = tag_of("0123456789abcdef", 0)


_OPEN: list = []  # connections and sockets a test made: closed after it


@pytest.fixture
def listener():
    sock = listen_tcp("127.0.0.1")
    yield sock
    sock.close()
    while _OPEN:
        _OPEN.pop().close()


def accept(listener: socket.socket, **kwargs) -> StreamConnection:
    listener.settimeout(5.0)
    sock, _ = listener.accept()
    conn = StreamConnection(sock, "server side", kwargs.pop("bounds", BOUNDS), accepted=True, **kwargs)
    _OPEN.append(conn)
    return conn


def pair(listener: socket.socket, **kwargs) -> tuple[StreamConnection, StreamConnection]:
    port = listener.getsockname()[1]
    client = StreamConnection.connect("127.0.0.1", port, TAG, "client side", 5.0, BOUNDS)
    _OPEN.append(client)
    return client, accept(listener, **kwargs)


def read(conn: StreamConnection, timeout: float = 5.0) -> list[bytes]:
    """The next whole message (the reading thread's way: waiting receives)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            frames = conn.receive(wait=0.05)
        except BlockingIOError:
            continue
        if frames is not None:
            return [bytes(f) for f in frames]
    raise AssertionError("no message came")


def raw(listener: socket.socket, data: bytes, **kwargs) -> StreamConnection:
    """The server side of a connection whose peer sent ``data`` (anything, hostile or not)."""
    peer = socket.create_connection(listener.getsockname(), timeout=5.0)
    peer.sendall(data)
    _OPEN.append(peer)
    return accept(listener, **kwargs)


def test_messages_keep_their_frames_and_order_both_ways_and_the_preamble_names_the_connection(listener):
    client, server = pair(listener)
    client.send([b"header", b"", np.arange(5, dtype=np.float32)])
    client.send([b"second"])
    assert read(server) == [b"header", b"", np.arange(5, dtype=np.float32).tobytes()]
    assert server.tag == TAG and not server.opening
    assert read(server) == [b"second"]
    server.send([b"reply", memoryview(b"xyz")])
    assert read(client) == [b"reply", b"xyz"]
    client.close()
    with pytest.raises(EOFError):
        read(server)


def test_a_message_bigger_than_the_socket_takes_is_queued_uncopied_and_flushed_in_order(listener):
    big = Bounds(64 << 20, 8, 64 << 20, 5.0)
    port = listener.getsockname()[1]
    client = StreamConnection.connect("127.0.0.1", port, TAG, "client side", 5.0, big)
    _OPEN.append(client)
    server = accept(listener, bounds=big)
    value = np.random.default_rng(0).random(4 << 20)  # 32 MiB: more than both socket buffers hold
    client.send([b"hello"])  # a connection's first message is small (OPENING_BYTES)
    assert read(server) == [b"hello"]
    client.send([b"big", value])
    client.send([b"after"])
    assert client.pending  # the rest waits for the reader; send did not wait
    got, deadline = [], time.monotonic() + 20
    while len(got) < 2 and time.monotonic() < deadline:
        client.flush()
        try:
            frames = server.receive()
        except BlockingIOError:
            time.sleep(0.001)
            continue
        if frames is not None:
            got.append([bytes(f) for f in frames])
    assert got == [[b"big", value.tobytes()], [b"after"]]
    assert client.flush() and not client.pending


def test_a_client_refuses_to_send_a_message_over_the_peers_limit(listener):
    client, _ = pair(listener)
    with pytest.raises(InvalidArgumentError, match="PSKV_MAX_MESSAGE_BYTES"):
        client.send([np.zeros(BOUNDS.max_message_bytes + 1, np.uint8)])


def test_a_reader_that_takes_nothing_gets_dropped_past_the_queue_limit(listener):
    client, server = pair(listener, queue_limit=1 << 20)
    with pytest.raises(ConnectionError, match="PSKV_SEND_QUEUE_BYTES"):
        for _ in range(200):
            server.send([np.zeros(256 << 10, np.uint8)])
    with pytest.raises(ConnectionError):  # shut down; whoever polls it drops and closes it
        server.send([b"x"])
    assert server.overdue(time.monotonic() + 100) is False  # its queue was discarded


@pytest.mark.parametrize("data, match", [
    (b"GET / HTTP/1.1\r\n\r\n" + b" " * 20, "not a pskv data connection"),
    (MAGIC + b"0123456789ABCDEF0", "not a pskv data connection"),  # upper-case hex: not a tag
    (MAGIC + TAG + struct.pack("<I", 0), "0 frames"),
    (MAGIC + TAG + struct.pack("<I", 9), "9 frames"),  # over max_frames, refused before the table is read
    (MAGIC + TAG + struct.pack("<I", 1) + struct.pack("<Q", OPENING_BYTES + 1), "first message"),
])
def test_hostile_openings_are_refused_before_anything_is_allocated_for_them(listener, data, match):
    server = raw(listener, data)
    with pytest.raises(ProtocolError, match=match):
        for _ in range(10):
            server.receive(wait=1.0)


def test_after_the_opening_a_message_over_the_byte_limit_is_refused_from_its_table(listener):
    hello = struct.pack("<I", 1) + struct.pack("<Q", 5) + b"hello"
    huge = struct.pack("<I", 2) + struct.pack("<QQ", 1 << 40, 1)  # a terabyte claimed; nothing follows
    server = raw(listener, MAGIC + TAG + hello + huge)
    assert read(server) == [b"hello"]
    with pytest.raises(ProtocolError, match="PSKV_MAX_MESSAGE_BYTES"):
        server.receive(wait=1.0)


def test_a_message_split_across_many_small_writes_is_put_together(listener):
    message = struct.pack("<I", 2) + struct.pack("<QQ", 3, 4) + b"abcdefg"
    peer = socket.create_connection(listener.getsockname(), timeout=5.0)
    _OPEN.append(peer)
    server = accept(listener)
    got = None
    for byte in MAGIC + TAG + message:
        peer.sendall(bytes([byte]))
        try:
            got = server.receive(wait=1.0)
        except BlockingIOError:
            pass
    assert got is not None and [bytes(f) for f in got] == [b"abc", b"defg"]


def test_tags_are_a_session_and_a_lane():
    assert tag_of("0123456789abcdef", 3) == b"0123456789abcdef3"
    for session, lane in (("0123", 0), ("0123456789abcdeg", 0), ("0123456789abcdef", 10)):
        with pytest.raises(ValueError):
            tag_of(session, lane)


def _congestion(sock: socket.socket) -> bytes:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0")


def test_data_connections_leave_bbr_for_a_loss_based_congestion_control_and_keep_any_other(listener):
    with socket.socket() as probe, socket.socket() as other:
        try:
            probe.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"bbr")
            other.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"reno")
        except (AttributeError, OSError):
            pytest.skip("no TCP_CONGESTION, or no bbr in this kernel")
        assert choose_congestion(probe) in INSTEAD and _congestion(probe) in INSTEAD
        assert choose_congestion(other) == b"reno"  # the system's other choices are kept
    client, server = pair(listener)  # both ends choose (on a machine whose default is bbr, this is the fix)
    assert _congestion(client._sock) not in AVOIDED and _congestion(server._sock) not in AVOIDED
