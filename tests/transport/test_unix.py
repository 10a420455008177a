"""Local (Unix-domain packet) connections: framing, big messages, timeouts, closed peers."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from pskv.transport.unix import LocalConnection


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
    b.close()
