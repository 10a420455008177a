"""``init`` right after non-blocking pushes: the worker's queued operations reach the servers before
its meeting, so no meeting finds a worker behind on a round it has already pushed (pskv.torch
declares a new name's key while earlier buckets are still being sent)."""

from __future__ import annotations

import numpy as np

import pskv
from pskv.testing import InProcessCluster


def test_init_after_queued_pushpulls_meets_without_a_step_mismatch():
    with InProcessCluster(1, 2, deadline=60, shm=0) as c:
        def job(cfg):
            kv = pskv.create("dist_sync", cluster=cfg)
            try:
                kv.init("w", np.zeros(1 << 16, np.float32))
                outs = []
                for i in range(8):
                    handles = [kv.pushpull("w", np.full(1 << 16, kv.rank + 1.0, np.float32), block=False)
                               for _ in range(3)]
                    kv.init(f"new{i}", np.zeros(4, np.float32))  # a meeting while the pushpulls are queued
                    for h in handles:
                        h.wait()
                    outs.append(float(kv.pull("w")[0]))
                kv.barrier()
                return outs
            finally:
                kv.close()

        assert c.run_workers(job) == [[3.0] * 8] * 2
