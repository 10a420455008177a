"""A key's own gradient compression: ``init(keys, values, compression=)`` on a distributed store.

Each worker compresses its pushes of such a key with its own residual per part (error
feedback); the servers decode each message by the compression its body names and sum
— ``summed`` keys too, which the store's ``set_gradient_compression`` never compresses.
What ``pskv.torch``'s ``Compression.twobit()`` and the like stand on.
"""

from __future__ import annotations

import numpy as np
import pytest

import pskv
from pskv.compression import create
from pskv.protocol import Flag
from pskv.testing import InProcessCluster
from pskv.worker.client import WorkerClient

DEADLINE = 60.0
PIECES = dict(bigarray_bound=1000, part_bytes=64 << 10)  # the big key: over both servers, in pieces
OWN = {"w": {"type": "2bit", "threshold": 0.5}, "big": {"type": "1bit", "threshold": 0.25}}
SIZES = {"w": 37, "big": 50_000, "plain": 5}


def grads(rank, step):
    rng = np.random.default_rng(100 * rank + step)
    return {k: rng.uniform(-0.8, 0.8, n).astype(np.float32) for k, n in SIZES.items()}


def expected(workers, steps):
    """Per step, the sum over workers of what each worker's push decodes to: compressed with its
    residual of the key (carried over from step to step), plain for the key without compression."""
    comps = {k: create(p) for k, p in OWN.items()}
    residual = {(r, k): np.zeros(SIZES[k], np.float32) for r in range(workers) for k in OWN}
    out = []
    for step in range(steps):
        total = {k: np.zeros(n, np.float32) for k, n in SIZES.items()}
        for r in range(workers):
            for k, g in grads(r, step).items():
                total[k] += comps[k].decompress(comps[k].compress(g, residual[(r, k)]), g.size) if k in comps else g
        out.append(total)
    return out


def _run(cfg, fn):
    kv = pskv.create("dist_sync", cluster=cfg)
    try:
        return fn(kv)
    finally:
        kv.close()


@pytest.mark.parametrize("shm", [0, 1], ids=["sockets", "shared-memory"])
def test_summed_keys_hold_the_sum_of_the_decoded_pushes_with_residuals_carried_over(shm, monkeypatch):
    steps = 3
    want = expected(2, steps)
    bodies = set()
    request = WorkerClient.request

    def spy(self, server, command, arrays=(), data=None, body="", *args, flags=0, **kwargs):
        if command.name in ("PUSH", "PUSHPULL") and flags & Flag.COMPRESSED:
            bodies.add(body)
        return request(self, server, command, arrays, data, body, *args, flags=flags, **kwargs)
    monkeypatch.setattr(WorkerClient, "request", spy)

    def fn(kv):
        kv.set_optimizer(pskv.optimizer.create("sgd", learning_rate=1.0))  # summed keys sum all the same
        kv.init(list(SIZES), [np.zeros(n, np.float32) for n in SIZES.values()], summed=True,
                compression=[OWN["w"], OWN["big"], None])
        got = []
        for step in range(steps):
            g = grads(kv.rank, step)
            if step % 2:
                kv.push(list(g), list(g.values()))
                got.append(dict(zip(SIZES, kv.pull(list(SIZES)))))
            else:
                outs = [np.zeros(n, np.float32) for n in SIZES.values()]
                kv.pushpull(list(g), list(g.values()), out=outs)
                got.append(dict(zip(SIZES, outs)))
        return got

    with InProcessCluster(2, 2, deadline=DEADLINE, shm=shm, **PIECES) as cluster:
        results = cluster.run_workers(lambda cfg: _run(cfg, fn))
    for got in results:
        for step, (mine, theirs) in enumerate(zip(got, want)):
            for k in SIZES:
                np.testing.assert_allclose(mine[k], theirs[k], rtol=0, atol=1e-6, err_msg=f"{k} step {step}")
    if not shm:  # through sockets each compression's pushes name it: one message never mixes two
        assert {frozenset(create(OWN[k]).params.items()) for k in OWN} == {
            frozenset(__import__("json").loads(b).items()) for b in bodies}


def test_a_keys_own_compression_beats_the_stores_and_both_keep_their_residuals():
    """The store compresses with 2-bit at 0.5, key ``own`` with 2-bit at 1.0: 0.3 a push sends
    nothing, then 0.5 (store: residual 0.6 > 0.5) ... while ``own`` waits for its residual to reach 1.0."""
    def fn(kv):
        kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
        kv.init("store", np.zeros(8, np.float32))
        kv.init("own", np.zeros(8, np.float32), compression={"type": "2bit", "threshold": 1.0})
        seen = []
        for _ in range(4):
            kv.push(["store", "own"], [np.full(8, 0.3, np.float32)] * 2)
            store, own = kv.pull(["store", "own"])
            seen += [float(store[0]), float(own[0])]
        return seen

    with InProcessCluster(1, 1, deadline=DEADLINE, shm=0) as cluster:
        [seen] = cluster.run_workers(lambda cfg: _run(cfg, fn))
    # residuals: store 0.3 -> 0.6 sends 0.5 (0.1) -> 0.4 -> 0.7 sends 0.5; own 0.3, 0.6, 0.9, 1.2 sends 1.0
    assert seen == pytest.approx([0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.5, 1.0])


def test_a_bad_compression_is_refused_at_init_and_the_key_can_be_made_again():
    def fn(kv):
        zeros = np.zeros(4, np.float32)
        with pytest.raises(pskv.InvalidArgumentError, match="takes float32 values only; the key holds int64"):
            kv.init("i", np.zeros(4, np.int64), compression={"type": "2bit"})
        with pytest.raises(pskv.InvalidArgumentError, match="unknown gradient compression type '3bit'"):
            kv.init("a", zeros, compression={"type": "3bit"})
        with pytest.raises(pskv.InvalidArgumentError, match="unknown parameter"):  # the store's, not a key's
            kv.init("a", zeros, compression={"type": "2bit", "both_ways": True})
        with pytest.raises(pskv.InvalidArgumentError, match="2 compressions for 1 keys"):
            kv.init(["a"], [zeros], compression=[None, None])
        kv.init("a", zeros, compression={"type": "2bit", "threshold": 0.5})
        kv.push("a", np.ones(4, np.float32))
        return kv.pull("a").tolist()

    with InProcessCluster(1, 1, deadline=DEADLINE, shm=0) as cluster:
        assert cluster.run_workers(lambda cfg: _run(cfg, fn)) == [[0.5] * 4]


def test_workers_that_compress_a_key_differently_fail_its_init_together():
    def fn(kv):
        params = {"type": "2bit", "threshold": 0.5 + kv.rank}
        with pytest.raises(pskv.InitMismatchError, match="compressed"):
            kv.init("w", np.zeros(4, np.float32), compression=params)
        return True

    with InProcessCluster(1, 2, deadline=DEADLINE, shm=0) as cluster:
        assert cluster.run_workers(lambda cfg: _run(cfg, fn)) == [True, True]


def test_a_server_refuses_a_push_compressed_by_an_unknown_type_by_name(monkeypatch):
    """A peer's body is checked: an unknown type is an error reply naming it, and the server goes on."""
    request = WorkerClient.request

    def forged(self, server, command, arrays=(), data=None, body="", *args, flags=0, **kwargs):
        if flags & Flag.COMPRESSED:
            body = '{"type": "9bit", "threshold": 0.5}'
        return request(self, server, command, arrays, data, body, *args, flags=flags, **kwargs)

    def fn(kv):
        kv.init("w", np.zeros(4, np.float32), compression={"type": "2bit"})
        monkeypatch.setattr(WorkerClient, "request", forged)
        with pytest.raises(pskv.KVStoreError, match="unknown gradient compression type '9bit'"):
            kv.push("w", np.ones(4, np.float32))
            kv.pull("w")
        monkeypatch.setattr(WorkerClient, "request", request)
        kv.init("v", np.ones(4, np.float32))
        return kv.pull("v").tolist()

    with InProcessCluster(1, 1, deadline=DEADLINE, shm=0) as cluster:
        assert cluster.run_workers(lambda cfg: _run(cfg, fn)) == [[1.0] * 4]
