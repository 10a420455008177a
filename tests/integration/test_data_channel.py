"""Workers reach servers on other hosts through plain TCP data connections (``PSKV_DATA_CHANNEL``).

``PSKV_SHM=0`` makes every server "remote" to every worker: requests then travel on a
data connection (:mod:`pskv.transport.stream`; sealed in a job with a CURVE key) unless
the job says ``zmq``. A data connection that fails is opened again and the unanswered requests sent
again: the server answers a repeat without applying it twice.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import zmq

import pskv
from pskv.optimizer import SGD
from pskv.testing import InProcessCluster
from pskv.transport.security import generate_keys, write_key_file

DEADLINE = 60.0
REPO = Path(__file__).resolve().parents[2]


def run(fn, servers=2, workers=2, **settings):
    with InProcessCluster(servers, workers, deadline=DEADLINE, **settings) as cluster:
        return cluster.run_stores(fn)


def exchange(kv):
    """Push and pull a small key and one cut into pieces over both servers; the channels and the values."""
    kv.init(["small", "big"], [np.zeros(10, np.float32), np.zeros(300_000, np.float32)])
    for i in range(3):
        kv.push(["small", "big"], [np.full(10, kv.rank + i, np.float32), np.full(300_000, kv.rank - i, np.float32)])
        small, big = kv.pull(["small", "big"])
    return kv._worker.client.channels(), small.tolist(), float(big.min()), float(big.max())


PIECES = dict(shm=0, bigarray_bound=1000, part_bytes=64 << 10)  # the big key: 10 pieces per server


def test_without_shared_memory_every_request_travels_on_a_data_connection():
    results = run(exchange, **PIECES)
    for channels, small, low, high in results:
        assert channels == ["tcp", "tcp"]
        assert small == [5.0] * 10 and low == high == -3.0  # (0 + 2) + (1 + 2); (0 - 2) + (1 - 2)


def test_pskv_data_channel_zmq_keeps_zeromq_and_gives_the_same_values():
    assert run(exchange, data_channel="zmq", **PIECES) == [(["zmq", "zmq"], [5.0] * 10, -3.0, -3.0)] * 2


def test_a_worker_on_the_servers_host_keeps_its_local_connection():
    assert [r[0] for r in run(exchange, shm=1)] == [["local", "local"]] * 2


@pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")
def test_a_job_with_curve_uses_sealed_data_connections(tmp_path):
    # sealed with keys agreed from the cluster key (pskv.transport.sealed; tests/integration/test_sealed_channel.py)
    key = write_key_file(tmp_path / "k", generate_keys())
    assert run(exchange, curve_key_file=str(key), **PIECES) == [(["tcp", "tcp"], [5.0] * 10, -3.0, -3.0)] * 2


def test_a_data_connection_that_breaks_is_opened_again_and_no_push_is_applied_twice():
    """Worker 0 cuts its connections to both servers between and right after pushes (some in flight).

    SGD with learning rate 1 on the servers subtracts every round's sum once: a push
    applied twice, or lost, changes the value.
    """
    rounds = 12

    def fn(kv):
        kv.set_optimizer(SGD(learning_rate=1.0))
        kv.init(["w", "big"], [np.zeros(4, np.float32), np.zeros(200_000, np.float32)])
        for i in range(rounds):
            kv.push(["w", "big"], [np.ones(4, np.float32), np.ones(200_000, np.float32)])
            if kv.rank == 0 and i % 3 == 1:
                for conn in kv._worker.client._senders:
                    conn._sock.shutdown(socket.SHUT_RDWR)  # as a reset would: both ends see it fail
            kv.pull(["w", "big"])
        w, big = kv.pull(["w", "big"])
        return kv._worker.client.channels(), w.tolist(), float(big.min()), float(big.max())

    results = run(fn, **PIECES)
    for channels, w, low, high in results:
        assert channels == ["tcp", "tcp"]  # opened again, not switched to ZeroMQ
        assert w == [-2.0 * rounds] * 4 and low == high == -2.0 * rounds


WORKER = textwrap.dedent("""
    import numpy as np
    import pskv
    kv = pskv.create("dist_sync")
    kv.init("w", np.zeros(100_000, np.float32))
    for i in range(3):
        kv.push("w", np.full(100_000, kv.rank + 1.0, np.float32))
        out = kv.pull("w")
    print(f"rank={kv.rank} channels={','.join(kv._worker.client.channels())} value={out.min()},{out.max()}", flush=True)
    kv.close()
""")


@pytest.mark.timeout(90)
def test_a_launched_job_without_shared_memory_uses_data_connections(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    argv = [sys.executable, "-m", "pskv", "launch", "-n", "2", "-s", "2", "--stop-grace", "2", "--timeout", "60",
            "--env", "PSKV_SHM=0", "--env", "MXNET_KVSTORE_BIGARRAY_BOUND=1000", "--env", "PSKV_PART_BYTES=65536",
            "--", sys.executable, str(script)]
    res = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=80,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    for rank in (0, 1):
        assert f"rank={rank} channels=tcp,tcp value=3.0,3.0" in out, out


def test_a_stranger_on_the_data_port_is_refused_and_the_job_is_unaffected(monkeypatch):
    """Without the worker's token nothing is applied; silent or malformed connections are closed."""
    from pskv.protocol import Command, Header, decode, encode, node_id
    from pskv.protocol import Role as R
    from pskv.protocol.bodies import Hello
    from pskv.transport import reactor
    from pskv.transport.stream import StreamConnection, tag_of

    monkeypatch.setattr(reactor, "OPENING_TIMEOUT", 0.5)

    def reply(conn):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                frames = conn.receive(wait=0.1)
            except BlockingIOError:
                continue
            if frames is not None:
                return decode(frames)[0]
        raise AssertionError("no answer")

    def closed(sock, within=5.0):
        sock.settimeout(within)
        try:
            return sock.recv(1) == b""
        except ConnectionResetError:
            return True

    with InProcessCluster(1, 2, deadline=DEADLINE, shm=0) as cluster:
        def body(cfg):
            kv = pskv.create("dist_sync", cluster=cfg)
            try:
                kv.init("w", np.zeros(1000, np.float32))
                if kv.rank == 0:
                    port = cluster.servers[0]._core.data.stream_port
                    me = node_id(R.WORKER, 0)
                    stranger = StreamConnection.connect("127.0.0.1", port, tag_of("00000000000000aa", 0), "stranger",
                                                        5.0)
                    stranger.send(encode(Header(Command.PUSH, 7, me)))
                    assert "not bound to a worker" in reply(stranger).body
                    stranger.send(encode(Header(Command.HELLO, 8, me, body=Hello("", "0" * 64).encode())))
                    assert "its token is wrong" in reply(stranger).body
                    stranger.close()
                    silent = socket.create_connection(("127.0.0.1", port))
                    junk = socket.create_connection(("127.0.0.1", port))
                    junk.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b" " * 16)
                    assert closed(junk) and closed(silent)  # malformed at once, silent after OPENING_TIMEOUT
                    silent.close()
                    junk.close()
                for _ in range(3):
                    kv.push("w", np.full(1000, kv.rank + 1.0, np.float32))
                    out = kv.pull("w")
                return kv._worker.client.channels(), float(out.min()), float(out.max())
            finally:
                kv.close()

        assert cluster.run_workers(body) == [(["tcp"], 3.0, 3.0)] * 2
