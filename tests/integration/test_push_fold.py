"""A small non-blocking push and the pull behind it travel as one message (:mod:`pskv.worker.fold`).

``push(key, v, block=False)`` then ``pull(key)`` costs one ``PUSHPULL`` per server, not a
quiet ``PUSH`` and a ``PULL``: the servers handle half the messages, and every value, handle
and round comes out as before. A push no pull follows still goes out at once.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import pskv
from pskv.testing import InProcessCluster

ROUNDS = 40


@pytest.mark.parametrize(("servers", "shm"), [(1, 1), (2, 0)])
def test_a_small_push_and_the_pull_behind_it_are_one_message_per_server(servers, shm):
    def worker(cfg):
        kv = pskv.create("dist_sync", cluster=cfg)
        try:
            kv.init(["a", "big"], [np.zeros(1024, np.float32), np.zeros(3000, np.float32)])  # "big": on every server
            held = kv._worker.client.held
            val = np.full(1024, kv.rank + 1, np.float32)
            out, big_out = np.zeros(1024, np.float32), np.zeros(3000, np.float32)
            kv.barrier()
            ops, folded = _server_ops(cluster), held.folded
            for _ in range(ROUNDS):
                out[:] = 0
                handle = kv.push("a", val, block=False)
                kv.pull("a", out=out)
                assert np.all(out == 3.0)  # the round's sum over both workers
                handle.wait(10)  # the push's handle completes with the pull's reply
            kv.barrier()
            ops = _server_ops(cluster) - ops
            kv.push("big", np.full(3000, kv.rank + 1, np.float32), block=False)  # one message per server
            kv.pull("big", out=big_out)
            assert np.all(big_out == 3.0)
            kv.push("a", val, block=False)
            kv.pull("big", out=big_out)  # another key: the held push goes first, unfolded
            kv.pull("a", out=out)
            assert np.all(out == 3.0)
            kv.wait(timeout=10)
            return held.folded - folded, ops
        finally:
            kv.close()

    with InProcessCluster(servers, 2, deadline=60, shm=shm, bigarray_bound=2000) as cluster:
        results = cluster.run_workers(worker)
    folded = [f for f, _ in results]
    # unfolded, the servers handle 2 messages per worker and round (2 x 2 x ROUNDS, plus 2 barrier marks each)
    # (this process's threads take the GIL from each other: now and then the network thread sends one first)
    assert min(folded) >= (ROUNDS + servers) * 3 // 4, folded
    assert results[0][1] <= 2 * (ROUNDS + 2) * 3 // 2, results


def test_a_push_no_pull_follows_goes_out_at_once():
    def worker(cfg):
        kv = pskv.create("dist_sync", cluster=cfg)
        try:
            kv.init("a", np.zeros(1024, np.float32))
            out = np.zeros(1024, np.float32)
            kv.barrier()
            start = time.monotonic()
            kv.push("a", np.full(1024, kv.rank + 1, np.float32), block=False)
            if kv.rank == 0:
                time.sleep(1.0)  # no pskv call: only the network thread can send the held push
            kv.pull("a", out=out)
            assert np.all(out == 3.0)
            return time.monotonic() - start
        finally:
            kv.close()

    with InProcessCluster(1, 2, deadline=60, shm=1) as cluster:
        took = cluster.run_workers(worker)
    assert took[1] < 0.5, took  # rank 0's push arrived long before its pull


def _server_ops(cluster: InProcessCluster) -> int:
    """Messages the cluster's servers handled so far."""
    return sum(s._core.observer.counters.ops for s in cluster.servers)
