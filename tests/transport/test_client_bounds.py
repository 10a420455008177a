"""What whoever answers at an address costs a client's DEALER socket: the nodes' DEALERs (workers to servers,
nodes to the scheduler), ``pskv top`` and the launcher's ROSTER reports. A frame over the bound is refused by
ZeroMQ before it is allocated, and a message of many frames is read off without building its list."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator

import pytest
import zmq

from pskv.launch.roster import RosterClient
from pskv.metrics import MetricsClient
from pskv.protocol import Command, Header, encode
from pskv.protocol.bodies import JobReport
from pskv.transport.bounds import DEFAULT_BOUNDS, Bounds
from pskv.transport.frames import dealer_socket

JUNK = [b"ab"] * 20_000  # 20,000 two-byte frames: a list of them costs ~870 KB of Python objects


@pytest.fixture
def router() -> Iterator[tuple[zmq.Socket[bytes], str]]:
    """A peer at an address a client connects to (its ROUTER bound to a port of 127.0.0.1)."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 0
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    yield sock, f"tcp://127.0.0.1:{port}"
    sock.close(0)
    ctx.term()


def test_a_dealers_frames_are_bounded_by_the_nodes_bounds(router):
    sock, address = router
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    small = Bounds(1024, 8, DEFAULT_BOUNDS.send_queue_bytes, DEFAULT_BOUNDS.slow_peer_timeout)
    dealer = dealer_socket(ctx, address, b"worker", None, small)
    default = dealer_socket(ctx, address, b"other", None)
    try:
        assert dealer.getsockopt(zmq.MAXMSGSIZE) == 1024
        assert default.getsockopt(zmq.MAXMSGSIZE) == DEFAULT_BOUNDS.max_message_bytes
        dealer.send(b"hello")
        assert sock.poll(5000) and sock.recv_multipart() == [b"worker", b"hello"]
        sock.send_multipart([b"worker", b"x" * 1024])
        assert dealer.poll(5000) and dealer.recv() == b"x" * 1024  # at the bound: taken
        sock.send_multipart([b"worker", b"x" * 1025])
        assert not dealer.poll(300)  # over it: refused, the connection dropped
    finally:
        dealer.close(0)
        default.close(0)
        ctx.term()


def _answer_after_junk(sock: zmq.Socket[bytes], reply: Callable[[int], list[bytes]], ask: Callable[[], object]
                       ) -> int:
    """The client ``ask``-ed once and got no answer: learn its identity, queue it a message of 20,000 frames and
    ``reply(2)`` (the answer to its next request); the peak of Python memory while it ``ask``-s again."""
    ask()
    assert sock.poll(5000)
    identity = sock.recv_multipart()[0]
    sock.send_multipart([identity, *JUNK])
    sock.send_multipart([identity, *reply(2)])
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        ask()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_pskv_top_reads_one_frame_answers_only(router):
    sock, address = router
    report = JobReport(1, 1, 0, ()).encode()
    got: list[object] = []

    def ask() -> None:
        try:
            got.append(client.query(0.2 if not got else 5.0))
        except Exception as exc:
            got.append(exc)

    with MetricsClient(address) as client:
        assert client._socket.getsockopt(zmq.MAXMSGSIZE) == 16 << 20  # the codec's header limit
        peak = _answer_after_junk(sock, lambda request: encode(Header(Command.REPLY, request, 1, body=report)), ask)
    assert type(got[0]).__name__ == "OperationTimeoutError" and got[1].num_workers == 1  # type: ignore[attr-defined]
    assert peak < 256 << 10, peak  # was ~870 KB: recv_multipart built the 20,000 frames


def test_the_launchers_roster_report_reads_one_frame_answers_only(router):
    sock, address = router
    got: list[bool] = []
    client = RosterClient(address, "00" * 32, timeout=0.2)
    try:
        assert client._socket.getsockopt(zmq.MAXMSGSIZE) == 64 << 10
        peak = _answer_after_junk(sock, lambda request: encode(Header(Command.REPLY, request, 1)),
                                  lambda: got.append(client.report("gone", 0)))
    finally:
        client.close()
    assert got == [False, True]
    assert peak < 512 << 10, peak  # was ~870 KB; msgpack's packing of the report may take 256 KiB
