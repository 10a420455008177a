"""Sealed data connections (:mod:`pskv.transport.sealed`): no plaintext on the wire, every change refused.

Each test puts a :class:`~tests.transport.tap.Tap` between a worker-side
:class:`~pskv.transport.stream.StreamConnection` and a server-side one: it records what the
wire carries, and holds the client's records so the test can send them changed, repeated,
reordered or cut. The server side must refuse each with a ``ProtocolError`` (an ``EOFError``
for a cut) and hand on nothing of the record that failed.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from pskv.errors import ProtocolError
from pskv.transport.bounds import Bounds
from pskv.transport.sealed import NO_KEYS, PLAIN, SEALED_MAGIC, ClusterKeys, Keys
from pskv.transport.stream import StreamConnection, listen_tcp, tag_of
from tests.transport.tap import Tap

KEYS = ClusterKeys(os.urandom(32))
TAG = tag_of("0123456789abcdef", 0)
BOUNDS = Bounds(max_message_bytes=64 << 20, max_frames=16, send_queue_bytes=64 << 20, slow_peer_timeout=5.0)
PATTERN = b"pskv-known-array" * 8
OPENING = len(SEALED_MAGIC) + len(TAG) + 32  # the sealed preamble: magic, tag, X25519 public key

_OPEN: list = []


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = listen_tcp("127.0.0.1")
    yield sock
    sock.close()
    while _OPEN:
        _OPEN.pop().close()


def connect_in_thread(port: int, keys: Keys) -> Callable[[], StreamConnection]:
    """Connect from another thread (the connecting side waits for the server's answer); returns a joiner."""
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["conn"] = StreamConnection.connect("127.0.0.1", port, TAG, "client side", 5.0, BOUNDS, keys=keys)
        except BaseException as exc:  # handed to the test
            out["error"] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join() -> StreamConnection:
        thread.join(10)
        if "error" in out:
            raise out["error"]  # type: ignore[misc]
        conn = out["conn"]
        assert isinstance(conn, StreamConnection)
        _OPEN.append(conn)
        return conn
    return join


def accept(listener: socket.socket, keys: Keys) -> StreamConnection:
    listener.settimeout(5.0)
    sock, _ = listener.accept()
    conn = StreamConnection(sock, "server side", BOUNDS, accepted=True, seal=keys.channel("server side"))
    _OPEN.append(conn)
    return conn


def opened(conn: StreamConnection, timeout: float = 5.0) -> None:
    """Read the accepted side's preamble (and answer the key exchange)."""
    deadline = time.monotonic() + timeout
    while conn.tag is None:
        assert time.monotonic() < deadline, "no preamble came"
        try:
            assert conn.receive(wait=0.05) is None
        except BlockingIOError:
            pass


def pair(listener: socket.socket, client_keys: Keys = KEYS, server_keys: Keys = KEYS,
         tap: Tap | None = None) -> tuple[StreamConnection, StreamConnection]:
    join = connect_in_thread(tap.port if tap is not None else listener.getsockname()[1], client_keys)
    server = accept(listener, server_keys)
    opened(server)
    return join(), server


def read(conn: StreamConnection, timeout: float = 10.0, sender: StreamConnection | None = None) -> list[bytes]:
    """The next whole message; ``sender``'s queue is flushed meanwhile (no reactor does it here)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sender is not None:
            sender.flush()
        try:
            frames = conn.receive(wait=0.05)
        except BlockingIOError:
            continue
        if frames is not None:
            return [bytes(f) for f in frames]
    raise AssertionError("no message came")


def tap_for(listener: socket.socket, **kwargs: int) -> Tap:
    tap = Tap("127.0.0.1", listener.getsockname()[1], **kwargs)
    _OPEN.append(tap)
    return tap


def messages() -> list[list[bytes]]:
    """Small, gathered (< 64 KiB), and big ones whose frames span the 4 MiB sealing pieces, with an empty frame."""
    rng = np.random.default_rng(3)
    return [[b"header", PATTERN],
            [b"h" * 100, rng.bytes(40_000), b""],
            [b"x" * 7, rng.bytes(5 << 20), PATTERN * 1000, rng.bytes((4 << 20) + 3)],
            [b""]]


@pytest.mark.parametrize("keys", [KEYS, NO_KEYS], ids=["sealed", "plain"])
def test_messages_arrive_whole_both_ways_and_only_the_plain_wire_shows_them(listener, keys):
    tap = tap_for(listener)
    client, server = pair(listener, keys, keys, tap)
    for message in messages():
        client.send(message)
        assert read(server, sender=client) == message
        server.send(message[::-1])
        assert read(client, sender=server) == message[::-1]
    captured = tap.captured()
    assert len(captured) > 18 << 20
    assert (PATTERN in captured) is (keys is NO_KEYS)  # the plain connection is the control


def wire_length(message: list[bytes], sealed: bool = True) -> int:
    """Bytes of a message on a sealed connection: count, lengths, tag, frames, tag."""
    return 4 + 8 * len(message) + sum(map(len, message)) + (32 if sealed else 0)


def flip(at: int) -> Callable[[bytes], bytes]:
    def change(data: bytes) -> bytes:
        out = bytearray(data)
        out[at] ^= 0x01
        return bytes(out)
    return change


FIRST, SECOND = [b"first", PATTERN], [b"second", b"y" * 70_000]
N1 = wire_length(FIRST)
CHANGES = {  # what the man in the middle sends instead of FIRST + SECOND, and the messages that should arrive
    "a length changed": (flip(4 + 8), []),
    "a byte of a frame changed": (flip(4 + 16 + 16 + 3), []),
    "the body's tag changed": (flip(N1 - 1), []),
    "the second message's body changed": (flip(N1 + 4 + 16 + 16 + 50_000), [FIRST]),
    "a message replayed": (lambda d: d[:N1] + d[:N1] + d[N1:], [FIRST]),
    "two messages reordered": (lambda d: d[N1:] + d[:N1], []),
    "a record dropped": (lambda d: d[:4 + 16 + 16] + d[N1:], []),  # the first body: the second table is read as it
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_changed_replayed_reordered_or_dropped_record_is_refused_and_nothing_of_it_is_handed_on(listener, change):
    transform, arriving = CHANGES[change]
    tap = tap_for(listener, hold_after=OPENING)
    client, server = pair(listener, tap=tap)
    client.send(FIRST)
    client.send(SECOND)
    flow = tap.flows[0]
    deadline = time.monotonic() + 5
    while len(flow.held) < N1 + wire_length(SECOND) and time.monotonic() < deadline:
        time.sleep(0.01)
    flow.release(transform)
    got = []
    with pytest.raises(ProtocolError, match="server side: record [0-9]+ from the peer failed authentication"):
        while True:
            got.append(read(server))
    assert got == arriving


def test_a_cut_message_is_not_handed_on(listener):
    tap = tap_for(listener, hold_after=OPENING)
    client, server = pair(listener, tap=tap)
    client.send(FIRST)
    flow = tap.flows[0]
    while len(flow.held) < N1:
        time.sleep(0.01)
    flow.release(lambda d: d[:-5])
    flow.server.shutdown(socket.SHUT_WR)
    with pytest.raises(EOFError):
        read(server)


def test_a_peer_with_another_cluster_key_fails_at_its_first_record(listener):
    client, server = pair(listener, client_keys=ClusterKeys(os.urandom(32)))
    client.send(FIRST)
    with pytest.raises(ProtocolError, match="record 0 from the peer failed authentication"):
        read(server)


def test_a_plain_peer_is_refused_by_a_keyed_node_and_a_keyed_peer_by_a_plain_one(listener):
    plain = StreamConnection.connect("127.0.0.1", listener.getsockname()[1], TAG, "plain client", 5.0, BOUNDS)
    _OPEN.append(plain)
    plain.send(FIRST)
    server = accept(listener, KEYS)
    with pytest.raises(ProtocolError, match="a plain data connection .the peer has no cluster key. to a keyed node"):
        read(server)
    join = connect_in_thread(listener.getsockname()[1], KEYS)
    server = accept(listener, NO_KEYS)
    with pytest.raises(ProtocolError, match="a sealed data connection .the peer has a cluster key. to a node without one"):
        opened(server)
    server.close()
    with pytest.raises(ConnectionError, match="closed the connection during its opening"):
        join()


def test_an_invalid_key_exchange_is_refused(listener):
    sock = socket.create_connection(listener.getsockname())
    _OPEN.append(sock)
    sock.sendall(SEALED_MAGIC + TAG + b"\0" * 32)  # a low-order point: no shared secret
    server = accept(listener, KEYS)
    with pytest.raises(ProtocolError, match="the peer's key exchange is invalid"):
        opened(server)


def test_two_connections_of_one_tag_get_different_keys(listener):
    """A capture replayed on a new connection meets a new server key: its records fail (see the integration test)."""
    tap = tap_for(listener)
    for _ in range(2):
        client, server = pair(listener, tap=tap)
        client.send(FIRST)
        assert read(server) == FIRST
    first, second = (bytes(f.up[OPENING:]) for f in tap.flows)
    assert len(first) == len(second) == N1 and first != second
    assert struct.unpack_from("<I", first) == (2,)  # the count travels in the clear; the lengths do not
    assert struct.pack("<Q", len(PATTERN)) not in first


def test_without_a_key_sealing_hands_everything_back_as_it_is():
    assert NO_KEYS.channel("any") is PLAIN
    views = [memoryview(b"table"), memoryview(b"frame")]
    assert PLAIN.seal(views) is views
    record = memoryview(bytearray(8))
    assert PLAIN.open_body(record) is record and PLAIN.open_table(record, 1) is record


def test_big_records_are_sealed_in_pieces_and_opened_in_parts(listener, monkeypatch):
    """Bodies over AESGCM's one-call limit are opened in parts (here 10,000 bytes, as for over 1 GiB), and sealed
    into pieces (here 7,000 bytes) that frames cross; a changed byte is still refused."""
    from pskv.transport import sealed

    monkeypatch.setattr(sealed, "_OPEN_AT_ONCE", 10_000)
    monkeypatch.setattr(sealed, "_PIECE", 7_000)
    monkeypatch.setattr(sealed, "_GATHER", 100)
    tap = tap_for(listener, hold_after=OPENING)
    client, server = pair(listener, tap=tap)
    big = [b"head", os.urandom(33_333), b"", PATTERN * 100]
    client.send(big)
    client.send(big)
    flow = tap.flows[0]
    n = wire_length(big)
    while len(flow.held) < 2 * n:
        time.sleep(0.01)
    flow.release(flip(n + 4 + 32 + 16 + 20_000))  # in the second message's body, past the first part
    assert read(server) == big
    with pytest.raises(ProtocolError, match="record 3 from the peer failed authentication"):
        read(server)
