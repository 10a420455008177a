"""A hostile peer sends random and mutated messages to a live server; the server keeps serving the job.

Black-box: the fuzzer is a plain ZeroMQ DEALER connected to the server's port, as an
attacker on the network would be (without CURVE anyone who reaches the port can send).
Every message must be rejected (logged) or answered; afterwards real workers must get
exact results from the same server.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pskv
from pskv.protocol.codec import encode
from pskv.protocol.messages import ArraySpec, Command, Header
from pskv.testing import InProcessCluster

DTYPES = ["float16", "bfloat16", "float32", "float64", "int32", "int64"]
BODIES = ["", "{}", '{"overwrite": true}', '{"parts": [[1, 0, 0]]}', '{"parts": "x"}', '{"shm": [[1, 0]]}',
          "not json", '{"rounds": [1e308]}', "[" * 1000]
REPLIES = {"error": 0, "other": 0}  # what the server answered: proves messages got past decoding
FUZZ_COMMANDS = [c for c in Command if c.name in {"INIT", "PUSH", "PULL", "PUSHPULL", "HELLO", "ERROR"}]


def valid_message(rng: random.Random) -> list[bytes]:
    """A well-formed message of a data command, from a claimed worker id."""
    n = rng.randint(0, 3)
    arrays, data = [], []
    for _ in range(n):
        dtype = rng.choice(DTYPES)
        size = rng.randint(0, 8)
        np_dtype = np.uint16 if dtype == "bfloat16" else np.dtype(dtype)
        arrays.append(ArraySpec(rng.randint(0, 40), dtype, (size,), rng.randint(0, 4), rng.randint(0, 3)))
        data.append(np.zeros(size, dtype=np_dtype))
    header = Header(rng.choice(FUZZ_COMMANDS), rng.randint(0, 2**31), rng.choice([9, 11, 13, 8, 1, -1, 2**40]),
                    tuple(arrays), rng.randint(-5, 5), rng.choice(BODIES))
    return [bytes(f) for f in encode(header, data)]


def mutate(frames: list[bytes], rng: random.Random) -> list[bytes]:
    frames = list(frames)
    kind = rng.randrange(5)
    i = rng.randrange(len(frames))
    buf = bytearray(frames[i])
    if kind == 0 and buf:  # flip bytes
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
    elif kind == 1:  # truncate
        buf = buf[: rng.randint(0, len(buf))]
    elif kind == 2:  # append garbage
        buf += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    elif kind == 3:  # drop or duplicate a frame
        if len(frames) > 1 and rng.random() < 0.5:
            del frames[i]
            return frames
        frames.insert(i, frames[i])
        return frames
    else:  # a random frame instead
        buf = bytearray(rng.randbytes(rng.randint(0, 128)))
    frames[i] = bytes(buf)
    return frames


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
@given(seed=st.integers(0, 2**32 - 1), mutated=st.booleans(), raw=st.lists(st.binary(max_size=64), max_size=4))
def test_random_and_mutated_messages_do_not_hurt_the_server(cluster, seed, mutated, raw):
    _, sock = cluster
    rng = random.Random(seed)
    frames = raw if (raw and rng.random() < 0.3) else valid_message(rng)
    if mutated:
        frames = mutate(frames, rng)
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
    assert REPLIES["error"] > 10, REPLIES  # the fuzzer reached the handlers, not only the decoder
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
