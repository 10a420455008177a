"""A live server under hostile or slow peers keeps serving the job's workers exactly (issue 10).

Black-box peers, as an attacker on the host or network would be (without CURVE anyone
who reaches a port can send): a ZeroMQ DEALER that asks for big replies and never reads
them, junk packets on the server's Unix socket. Meanwhile real workers run a job and
must get exact results; the slow peer is dropped and logged, the junk refused.
"""

from __future__ import annotations

import socket
import threading
import time
import types

import numpy as np
import pytest
import zmq

import pskv
from pskv.arrays import ArrayMeta
from pskv.config import ClusterConfig
from pskv.errors import ProtocolError
from pskv.kvstore.compressing import GradientCompression
from pskv.metrics import NodeCounters
from pskv.protocol import ArraySpec, Command, Flag, Header, decode, encode
from pskv.protocol.bodies import Hello, node_token
from pskv.testing import InProcessCluster, fuzz
from pskv.transport.unix import local_path
from pskv.worker.kv_worker import Exchange, KVWorker
from pskv.worker.layout import KeyLayout

KEYS = list(range(10_000, 10_008))
BIG = 10_099  # a 1 MB key the hostile peer pulls again and again


def _job(cfg, started=None, steps: int = 20, pause: float = 0.0) -> bool:
    kv = pskv.create("dist_sync", cluster=cfg)
    try:
        kv.init(BIG, np.zeros(1 << 18, np.float32))
        kv.init(KEYS, [np.zeros((4, 3), np.float32)] * len(KEYS))
        kv.barrier()
        if started is not None and kv.rank == 0:
            started()
        for step in range(steps):
            kv.push(KEYS, [np.full((4, 3), kv.rank + step, np.float32)] * len(KEYS))
            out = kv.pull(KEYS)
            assert all(np.all(o == 2 * step + 1) for o in out), (step, out[0])
            time.sleep(pause)
        kv.barrier()
        return True
    finally:
        kv.close()


def test_a_peer_that_never_reads_is_dropped_while_workers_get_exact_results(caplog):
    with InProcessCluster(1, 2, deadline=60, shm=0, slow_peer_timeout=1.0, send_queue_bytes=32 << 20) as c:
        stop = threading.Event()
        stats = {"sent": 0}

        def hog() -> None:  # worker 1's name after a HELLO with its token, then pulls of the big key, never reading
            ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
            sock = ctx.socket(zmq.DEALER)
            sock.linger = 0
            sock.setsockopt(zmq.RCVBUF, 4096)
            sock.setsockopt(zmq.RCVHWM, 1)
            sock.connect(c.servers[0].address)
            try:
                token = node_token(c.scheduler._secret, 11)  # as a worker (or a peer that learnt its token) holds it
                sock.send_multipart(encode(Header(Command.HELLO, 1, 11, body=Hello("00000000000000ff", token).encode())))
                request = 2
                while not stop.is_set() and request < 20_000:
                    pull = encode(Header(Command.PULL, request, 11, (ArraySpec(BIG, "float32", (1 << 18,)),)))
                    sock.send_multipart(pull)
                    request += 1
                    stats["sent"] += 1
                    if request % 200 == 0:
                        time.sleep(0.01)
            finally:
                sock.close(0)

        thread = threading.Thread(target=hog, daemon=True)

        def job(cfg):  # ~3 s of steps while the peer floods the server with pulls it never reads
            return _job(cfg, thread.start, steps=60, pause=0.05)

        try:
            assert c.run_workers(job) == [True, True]
        finally:
            stop.set()
            thread.join(10)
        assert stats["sent"] > 1000
        assert "dropped it" in caplog.text, "the peer that never reads was not dropped"
        assert not c.errors and all(s._reactor.error is None for s in c.servers)


def test_junk_packets_on_the_server_unix_socket_are_refused_and_the_job_runs(caplog):
    junk = [*fuzz.UNIX_JUNK.values(), b"\x01\x02", b"\x01" + b"\x00" * 100]  # the last two: messages left unfinished
    with InProcessCluster(1, 2, deadline=60) as c:
        path = local_path(c.servers[0]._shm_dir.path)
        for packet in junk:
            raw = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            raw.settimeout(10)
            raw.connect(path)
            raw.send(packet)
            if packet[0] == 1:  # an unfinished message: the server waits for the rest; ours closes
                raw.close()
                continue
            assert raw.recv(64) == b"", packet  # the server closed this connection
            raw.close()
        assert caplog.text.count("closed a local connection") == len(junk) - 2
        assert c.run_workers(_job) == [True, True]
        assert not c.errors and all(s._reactor.error is None for s in c.servers)


@pytest.mark.parametrize("shm", [0, 1], ids=["zeromq", "local socket"])
def test_a_request_over_the_message_limit_fails_at_once_on_the_worker(shm):
    """The servers would drop it (and ZeroMQ the connection): the worker refuses to send it."""
    with InProcessCluster(1, 1, deadline=30, shm=shm, max_message_bytes=1 << 20) as c:
        def job(cfg):
            kv = pskv.create("dist_sync", cluster=cfg)
            try:
                kv.init(1, np.zeros(10, np.float32))
                start = time.monotonic()
                with pytest.raises(pskv.InvalidArgumentError, match="exceeds PSKV_MAX_MESSAGE_BYTES=1048576"):
                    kv.init(2, np.zeros(1 << 19, np.float32))  # 2 MB
                assert time.monotonic() - start < 5
                kv.push(1, np.ones(10, np.float32))  # the store goes on
                return float(kv.pull(1)[0])
            finally:
                kv.close()

        assert c.run_workers(job) == [1.0]


def test_a_strangers_pushes_of_200000_arrays_never_stall_the_server_past_its_heartbeats(caplog):
    """Issue 28, finding 1: five PUSHes from a peer no worker of the job, each naming 200,000 arrays,
    used to keep the server's loop reading for ~1 s each, long enough (at a 2 s heartbeat timeout) for the
    scheduler to mark it dead and every worker to fail. A peer not trusted yet now gets a few frames a
    message; the rest is discarded in steps between the reactor's other work."""
    head = fuzz.raw_header(Command.PUSH, 7, 13, arrays=[fuzz.raw_array(k, fuzz.dtype_code("float32"), [1])
                                                        for k in range(200_000)])
    message = [head] + [b"\0" * 4] * 200_000
    with InProcessCluster(1, 2, deadline=60, shm=0, heartbeat_interval=0.3, heartbeat_timeout=2.0) as c:
        slowest: list[float] = []

        def attack() -> None:
            sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
            sock.connect(c.servers[0].address)
            try:
                for _ in range(5):
                    sock.send_multipart(message)
            finally:
                sock.close(linger=20_000)  # every message delivered

        def job(cfg):
            kv = pskv.create("dist_sync", cluster=cfg)
            try:
                kv.init(KEYS, [np.zeros((4, 3), np.float32)] * len(KEYS))
                kv.barrier()
                if kv.rank == 0:
                    threading.Thread(target=attack, daemon=True).start()
                longest = 0.0
                for step in range(80):  # ~5 s: past the attack, and past the heartbeat timeout twice over
                    time.sleep(0.05)
                    start = time.monotonic()
                    kv.push(KEYS, [np.full((4, 3), kv.rank + step, np.float32)] * len(KEYS))
                    out = kv.pull(KEYS)
                    longest = max(longest, time.monotonic() - start)
                    assert all(np.all(o == 2 * step + 1) for o in out), (step, out[0])
                slowest.append(longest)
                kv.barrier()
                return True
            finally:
                kv.close()

        assert c.run_workers(job) == [True, True]
        assert not c.errors and all(s._reactor.error is None for s in c.servers)
    assert "marked dead" not in caplog.text
    assert caplog.text.count("from a peer not trusted yet") == 5, caplog.text[-2000:]
    assert max(slowest) < 2.0, slowest


def test_a_compressed_reply_whose_spec_is_not_the_parts_is_refused_before_it_is_decoded():
    """A short REPLY (COMPRESSED, an 8-byte topk payload) whose spec says 2**32-1 float32 elements used to be
    decompressed first — 16 GiB of zeros — and only then compared with the part asked for. The codec lets a
    compressed frame be shorter than its shape; the worker checks the spec against the layout before decoding."""
    settings = GradientCompression({"type": "topk", "k": 1})
    worker = KVWorker(ClusterConfig(), client=types.SimpleNamespace(counters=NodeCounters(),
                                                                     held=types.SimpleNamespace()))
    worker.set_compression(settings)
    rec = KeyLayout(7, 7, ArrayMeta("numpy", (100,), "float32", "cpu"), [(0, 0, 100)], [0], nbytes=400, itemsize=4)
    decoded: list[int] = []
    real = worker.compression.compressor.decompress
    worker.compression.compressor.decompress = lambda buf, n: decoded.append(n) or real(buf, n)  # type: ignore
    body = worker.compression.body
    try:
        for spec in (ArraySpec(7, "float32", (2**32 - 1,), 0, 1), ArraySpec(7, "float32", (100,), 5, 1),
                     ArraySpec(8, "float32", (100,), 0, 1), ArraySpec(7, "float32", (1, 100), 0, 1)):
            frames = encode(Header(Command.REPLY, 1, 0, (spec,), body=body, flags=Flag.COMPRESSED),
                            [np.zeros(8, np.uint8)])
            header, buffers = decode(frames)  # the codec passes it: a compressed frame may be shorter
            pending = types.SimpleNamespace(node=8, buffers=buffers, done=lambda: True,
                                            wait=lambda limit, h=header: h)
            sent = Exchange()
            sent.messages.append(([(rec, 0)], pending))  # type: ignore[arg-type]
            with pytest.raises(ProtocolError, match="server 0's reply for key 7 does not match its layout"):
                worker.values(sent, timeout=1)
        assert decoded == []
    finally:
        worker.compression.close()
