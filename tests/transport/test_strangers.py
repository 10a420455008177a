"""What a stranger on a data port costs (issue 28, finding 2): buffers no bigger than what it sent, a short
time to authenticate, and a small pool of its own that never takes a member's place."""

from __future__ import annotations

import gc
import socket
import struct
import time
import tracemalloc
import weakref

import pytest
import zmq

from pskv.errors import ProtocolError
from pskv.transport import Reactor, polled, reactor
from pskv.transport.bounds import DEFAULT_BOUNDS
from pskv.transport.frames import STRANGER_BOUNDS
from pskv.transport.stream import GROWTH, MAGIC, OPENING_BYTES, StreamConnection, listen_tcp, tag_of

TAG = tag_of("0123456789abcdef", 0)
HELLO = struct.pack("<I", 1) + struct.pack("<Q", 5) + b"hello"


def message(*frames: bytes) -> bytes:
    return struct.pack(f"<I{len(frames)}Q", len(frames), *map(len, frames)) + b"".join(frames)


@pytest.fixture
def listener():
    sock = listen_tcp("127.0.0.1")
    yield sock
    sock.close()


def attack(listener: socket.socket, data: bytes, stranger: bool) -> tuple[socket.socket, StreamConnection]:
    """A raw peer that sent ``data``, and the accepted end (default bounds: 200,002 frames, 2 GiB)."""
    peer = socket.create_connection(listener.getsockname(), timeout=5.0)
    peer.sendall(data)
    listener.settimeout(5.0)
    sock, _ = listener.accept()
    return peer, StreamConnection(sock, "server side", DEFAULT_BOUNDS, accepted=True, stranger=stranger)


def peak_while_reading(conn: StreamConnection, reads: int = 5) -> int:
    """The most memory Python held, above the start, while ``conn`` read what came (tracemalloc)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(reads):
            try:
                conn.receive(wait=0.2)
            except BlockingIOError:
                pass
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_a_frame_count_of_200002_allocates_only_what_has_arrived(listener):
    """The reported attack: preamble, a first message, then a count of 200,002 frames and 35 more bytes
    (a connection not held to a stranger's bounds after its first message; a stranger's is refused below)."""
    peer, conn = attack(listener, MAGIC + TAG + HELLO + struct.pack("<I", 200_002) + b"\0" * 35, False)
    try:
        assert bytes(conn.receive(wait=5.0)[0]) == b"hello"  # type: ignore[index]
        assert peak_while_reading(conn) < 2 * GROWTH  # was 1.6 MB: the whole table, zero-filled
    finally:
        peer.close()
        conn.close()


@pytest.mark.parametrize("stranger", [False, True])
def test_a_first_or_untrusted_message_may_have_a_strangers_few_frames(listener, stranger):
    """As a ZeroMQ peer not trusted yet (STRANGER_BOUNDS): 8 frames, not PSKV_MAX_FRAMES (200,002), in a
    connection's first message and, a stranger's, in every one until it is trusted."""
    eight, nine, many = message(*[b"x"] * 8), message(*[b"y"] * 9), struct.pack("<I", 200_002)
    cases = [(nine, 9), (many, 200_002)] + ([(eight + nine, 9), (eight + many, 200_002)] if stranger else [])
    for data, count in cases:
        peer, conn = attack(listener, MAGIC + TAG + data, stranger)
        try:
            if data.startswith(eight):
                assert [bytes(f) for f in conn.receive(wait=5.0)] == [b"x"] * 8  # type: ignore[union-attr]
            with pytest.raises(ProtocolError, match=f"a message of {count} frames, over "
                                                    f"{STRANGER_BOUNDS.max_frames} for a connection's first message"):
                conn.receive(wait=5.0)
        finally:
            peer.close()
            conn.close()


def test_a_stranger_its_owner_trusts_by_now_is_asked_before_its_message_is_refused(listener):
    """A HELLO held until the server registered is handled after the connection's next message was sent: the
    owner is asked (``vouch``) before that message is refused for a stranger's bounds, never for a first one."""
    asked: list[bool] = []

    def vouch() -> bool:  # as the server's reactor does, once the worker's token was checked
        asked.append(True)
        return True
    nine, big = message(*[b"y"] * 9), message(b"z" * (OPENING_BYTES + 1))
    peer, conn = attack(listener, MAGIC + TAG + nine, stranger=True)
    conn.vouch = vouch
    try:
        with pytest.raises(ProtocolError, match="a message of 9 frames, over 8"):
            conn.receive(wait=5.0)
        assert asked == []  # a first message: the owner knows nothing of it yet
    finally:
        peer.close()
        conn.close()
    peer, conn = attack(listener, MAGIC + TAG + HELLO + nine + big, stranger=True)
    conn.vouch = vouch
    try:
        got = []
        while len(got) < 3:
            frames = conn.receive(wait=5.0)
            if frames is not None:
                got.append(len(frames))
        assert got == [1, 9, 1] and asked == [True] and conn.trusted
    finally:
        peer.close()
        conn.close()


def test_a_strangers_body_grows_as_it_arrives_and_is_bounded_until_trusted(listener):
    claimed = OPENING_BYTES - 100  # under the stranger's bound, but only 10 bytes of it sent
    data = MAGIC + TAG + HELLO + struct.pack("<IQ", 1, claimed) + b"x" * 10
    peer, conn = attack(listener, data, stranger=True)
    try:
        assert bytes(conn.receive(wait=5.0)[0]) == b"hello"  # type: ignore[index]
        assert peak_while_reading(conn) < 2 * GROWTH
        peer.sendall(b"y" * (claimed - 10))  # the rest: the message is put together from its pieces
        frames = None
        while frames is None:
            frames = conn.receive(wait=5.0)
        assert bytes(frames[0]) == b"x" * 10 + b"y" * (claimed - 10)
        peer.sendall(struct.pack("<IQ", 1, OPENING_BYTES + 1))  # after its first message, still a stranger's bound
        with pytest.raises(ProtocolError, match="before it is trusted"):
            for _ in range(10):
                conn.receive(wait=1.0)
    finally:
        peer.close()
        conn.close()


def test_a_trusted_connection_takes_big_messages_and_long_tables(listener):
    many = [b"%d" % i for i in range(5000)]  # a table of 40 KB: read in GROWTH pieces
    big = b"z" * (OPENING_BYTES * 2)
    peer, conn = attack(listener, MAGIC + TAG + HELLO, stranger=True)
    try:
        assert bytes(conn.receive(wait=5.0)[0]) == b"hello"  # type: ignore[index]
        conn.trust()
        peer.sendall(message(*many) + message(big))
        got = []
        while len(got) < 2:
            frames = conn.receive(wait=5.0)
            if frames is not None:
                got.append([bytes(f) for f in frames])
        assert got == [many, [big]]
    finally:
        peer.close()
        conn.close()


def test_a_closed_connection_leaves_nothing_behind(listener):
    peer, conn = attack(listener, MAGIC + TAG + HELLO + struct.pack("<IQ", 1, 60_000) + b"x" * 20_000, True)
    peak_while_reading(conn, reads=3)  # its first message, then part of the second
    gone = weakref.ref(conn)
    conn.close()
    peer.close()
    del conn
    gc.collect()
    assert gone() is None  # its buffers went with it


# -- through a reactor's data port --------------------------------------------------------------


def closed(sock: socket.socket, within: float = 5.0) -> bool:
    """True if the server closes ``sock`` within ``within`` seconds (what it answered first is read)."""
    deadline = time.monotonic() + within
    try:
        while time.monotonic() < deadline:
            sock.settimeout(max(deadline - time.monotonic(), 0.01))
            if sock.recv(4096) == b"":
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        pass
    return False


def test_strangers_are_closed_in_seconds_and_never_take_a_members_place(monkeypatch):
    """A member (its HELLO trusted) connects and is answered while strangers fill their pool; strangers that
    sent a refused first message are closed like silent ones, the member stays."""
    monkeypatch.setattr(reactor, "OPENING_TIMEOUT", 0.5)
    monkeypatch.setattr(polled, "MAX_STRANGERS", 3)
    ctx = zmq.Context()
    server = Reactor(ctx, "server")
    members: set[bytes] = set()

    def on_message(identity: bytes, frames: list) -> None:
        if bytes(frames[0]) == b"hello":
            members.add(identity)
        server.send_router(sid, identity, [b"ok" if identity in members else b"refused"])

    sid, _ = server.bind_router("tcp://127.0.0.1:0", on_message)
    port = server.bind_stream(sid, "127.0.0.1", trusted=lambda identity: identity in members)
    server.start()
    opened: list = []
    try:
        def stranger(first: bytes | None) -> socket.socket:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5.0)
            opened.append(sock)
            sock.sendall(MAGIC + tag_of("00000000000000aa", len(opened) % 10) + (first or b""))
            return sock

        refused = [stranger(message(b"sync")) for _ in range(3)]
        member = StreamConnection.connect("127.0.0.1", port, TAG, "member", 5.0)
        opened.append(member)
        member.send([b"hello"])
        assert [bytes(f) for f in read(member)] == [b"ok"]
        later = [stranger(None) for _ in range(4)]  # the pool is full: the oldest strangers make room
        assert all(closed(sock) for sock in refused + later)  # refused at once, or idle past OPENING_TIMEOUT
        member.send([b"again"])
        assert [bytes(f) for f in read(member)] == [b"ok"]
    finally:
        for sock in opened:
            sock.close()
        server.stop()
        ctx.term()


def read(conn: StreamConnection, timeout: float = 5.0) -> list[memoryview]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            frames = conn.receive(wait=0.1)
        except BlockingIOError:
            continue
        if frames is not None:
            return frames
    raise AssertionError("no answer")


def test_a_servers_data_port_closes_a_refused_stranger_and_keeps_its_workers(monkeypatch, caplog):
    """Through a real server (the finding's attack): a stranger whose first message is refused and who then
    announces 200,002 frames is closed at once (over a stranger's 8 frames); the workers' connections, trusted by their
    HELLO, are never closed as strangers' and the job's values are exact. (On a loaded machine a worker's
    data connection is sometimes lost and opened again, also before this change: not counted here.)"""
    import numpy as np

    import pskv
    from pskv.protocol import Command, Header, encode, node_id
    from pskv.protocol import Role as R
    from pskv.testing import InProcessCluster

    monkeypatch.setattr(reactor, "OPENING_TIMEOUT", 0.5)
    closed_as_strangers: list[str] = []  # every connection the server closes for not being trusted in time
    close_unopened = polled.PolledConnections.close_unopened

    def spy(self, timeout):
        before = list(self._opening.values())
        close_unopened(self, timeout)
        closed_as_strangers.extend(c.name for c in before if c.closed)
    monkeypatch.setattr(polled.PolledConnections, "close_unopened", spy)
    stranger_ports: list[int] = []
    with InProcessCluster(1, 2, deadline=60.0, shm=0) as cluster:
        def body(cfg):
            kv = pskv.create("dist_sync", cluster=cfg)
            try:
                kv.init("w", np.zeros(100, np.float32))
                if kv.rank == 0:
                    port = cluster.servers[0]._core.data.stream_port
                    sock = socket.create_connection(("127.0.0.1", port), timeout=5.0)
                    stranger_ports.append(sock.getsockname()[1])
                    try:
                        sync = encode(Header(Command.SYNC, 7, node_id(R.WORKER, 0)))
                        sock.sendall(MAGIC + tag_of("00000000000000aa", 0) + message(*map(bytes, sync)))
                        sock.sendall(struct.pack("<I", 200_002) + b"\0" * 35)
                        assert closed(sock)  # refused, never trusted: closed at its count
                    finally:
                        sock.close()
                time.sleep(2.0)  # past OPENING_TIMEOUT and the check after it: the workers' connections stay
                kv.push("w", np.full(100, kv.rank + 1.0, np.float32))
                out = kv.pull("w")
                return kv._worker.client.channels(), float(out.min()), float(out.max())
            finally:
                kv.close()

        assert cluster.run_workers(body) == [(["tcp"], 3.0, 3.0)] * 2
    # the stranger was closed for its count (before OPENING_TIMEOUT), and no connection for not being trusted
    # in time but perhaps the stranger's (trusted or closed they were)
    assert f":{stranger_ports[0]}: a message of 200002 frames, over 8 for a connection's first message" in caplog.text
    assert all(name.endswith(f":{stranger_ports[0]}") for name in closed_as_strangers), \
        (closed_as_strangers, stranger_ports)
