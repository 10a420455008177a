"""A hostile peer sends random and mutated messages to a live server; the server keeps serving the job.

Black-box: the fuzzer is a plain ZeroMQ DEALER connected to the server's port, as an
attacker on the network would be (without CURVE anyone who reaches the port can send).
Every message must be rejected (logged) or answered — and, as the fuzzer holds no
worker's token from the scheduler, none is accepted (``pskv/server/senders.py``);
afterwards real workers must get exact results from the same server.
"""

from __future__ import annotations

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings

import pskv
from pskv.protocol import ArraySpec, Command, Header, encode
from pskv.testing import InProcessCluster, fuzz

REPLIES = {"error": 0, "other": 0}  # what the server answered: proves messages got past decoding


def test_raw_headers_are_laid_out_as_the_codec_encodes():
    """fuzz.raw_header builds malformed headers by hand: its field order must be the codec's."""
    header = Header(Command.PUSH, 42, 11, (ArraySpec(7, "float64", (2, 3), 5, 1),), -2, '{"quiet": true}')
    arrays = [fuzz.raw_array(7, fuzz.dtype_code("float64"), [2, 3], 5, 1)]
    assert fuzz.raw_header(Command.PUSH, 42, 11, -2, '{"quiet": true}', arrays) == bytes(encode(header)[0])
    assert fuzz.reply_request(fuzz.raw_header(Command.PULL, 424242)) == 424242


@pytest.fixture(scope="module")
def cluster():
    with InProcessCluster(1, 2, deadline=60) as c:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(c.servers[0].address)
        yield c, sock
        sock.close(0)
        ctx.term()


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(frames=fuzz.message_strategy())
def test_random_and_mutated_messages_do_not_hurt_the_server(cluster, frames):
    _, sock = cluster
    if frames:
        sock.send_multipart(frames)
    while sock.poll(0):  # answers (errors) are fine; drain them
        reply = sock.recv_multipart()
        REPLIES["error" if b"Error" in reply[0] else "other"] += 1


def test_after_the_fuzzing_real_workers_get_exact_results(cluster):
    c, sock = cluster
    while sock.poll(500):  # replies that came after their test's drain (a loaded machine) count too
        reply = sock.recv_multipart()
        REPLIES["error" if b"Error" in reply[0] else "other"] += 1
    assert REPLIES["error"] > 10, REPLIES  # the fuzzer got past the decoder
    assert REPLIES["other"] == 0, REPLIES  # and nothing was accepted: it holds no worker's token (senders.py)
    keys = list(range(10_000, 10_020))

    def worker(cfg):
        kv = pskv.create("dist_sync", cluster=cfg)
        try:
            kv.init(keys, [np.zeros((4, 3), np.float32)] * len(keys))
            for step in range(5):
                kv.push(keys, [np.full((4, 3), kv.rank + step, np.float32)] * len(keys))
                out = kv.pull(keys)
                assert all(np.all(o == 2 * step + 1) for o in out)
            with pytest.raises(pskv.UnknownKeyError):
                kv.pull(123_456)
            return True
        finally:
            kv.close()

    assert c.run_workers(worker) == [True, True]
    assert not c.errors
