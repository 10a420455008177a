"""A worker whose scheduler stops answering gives up on everything, naming the scheduler.

A worker learns of a server's death only through the scheduler's heartbeat replies; a
server cut off together with the scheduler (or one that stopped because it lost the
scheduler) never answers again. Before, the worker marked the scheduler dead but a call
blocked on a server waited for its whole request timeout (found by the network-partition
test in tests/fault/test_network.py, where the workers are cut off from scheduler and
server).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import pskv
from pskv.testing import InProcessCluster

DEADLINE = 30.0  # the request timeout: what a blocked pull waited for before


@pytest.mark.timeout(60)
def test_a_pull_blocked_on_a_server_fails_when_the_scheduler_dies():
    with InProcessCluster(1, 2, deadline=DEADLINE, heartbeat_interval=0.05, heartbeat_timeout=0.6) as cluster:
        parked = threading.Event()

        def fn(cfg):
            kv = pskv.create("dist_sync", cluster=cfg)
            kv.init(0, np.zeros(2))
            if kv.rank == 1:  # never pushes: worker 0's pull stays parked on the server
                parked.wait(DEADLINE)
                time.sleep(0.2)
                cluster.scheduler.stop()  # the scheduler dies; the server stops when it notices
                kv.close()  # leaves without a scheduler (logs instead of failing)
                return None
            kv.push(0, np.ones(2))
            start = time.monotonic()
            parked.set()
            with pytest.raises(pskv.NodeFailedError, match="scheduler failed: no answer for 0.6 s") as info:
                kv.pull(0)
            elapsed = time.monotonic() - start
            assert info.value.node == "scheduler"
            with pytest.raises(pskv.NodeFailedError, match="scheduler failed"):
                kv.pull(0)  # and every later call, at once
            kv.close()
            return elapsed

        elapsed = cluster.run_workers(fn)[0]
    assert elapsed < 5  # about one heartbeat timeout, not the request timeout (30 s)
