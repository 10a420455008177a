"""A node whose own loop was held up does not blame its peers for the silence (issue 28).

While a reactor is busy, the heartbeats sent to it wait unread in its sockets. The
scheduler's liveness check and a node's check of the scheduler used to run first when the
loop came back, and mark everyone dead; now they wait one check, by which time the
waiting heartbeats are read.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

import pskv
from pskv.cluster.attention import Attention
from pskv.testing import InProcessCluster


def test_attention_says_held_up_only_after_more_than_two_periods():
    attention = Attention(0.3)
    assert attention.held_up() == 0.0
    time.sleep(0.2)
    assert attention.held_up() == 0.0
    time.sleep(0.7)
    assert attention.held_up() >= 0.7
    assert attention.held_up() == 0.0  # measured from the previous call


def _train(cfg, hold) -> float:
    kv = pskv.create("dist_sync", cluster=cfg)
    try:
        kv.init(3, np.zeros(8, np.float32))
        kv.barrier()
        if kv.rank == 0:
            hold()
        for _ in range(30):
            kv.push(3, np.full(8, 1.0, np.float32))
            out = kv.pull(3)
            time.sleep(0.05)
        kv.barrier()
        return float(out[0])
    finally:
        kv.close()


def _judging(cluster_config, timeout: float):
    """``cluster_config`` with a shorter heartbeat timeout: the checker's alone (its peers keep the job's)."""
    return dataclasses.replace(cluster_config, heartbeat_timeout=timeout)


def test_a_scheduler_held_up_past_the_heartbeat_timeout_marks_no_node_dead(caplog):
    with InProcessCluster(1, 2, deadline=60, shm=0, heartbeat_interval=0.2, heartbeat_timeout=10.0) as c:
        def hold() -> None:  # the scheduler judges silence after 0.6 s, and is held up for 1.5 s
            c.scheduler._cluster = _judging(c.scheduler._cluster, 0.6)
            c.scheduler._reactor.call_soon(lambda: time.sleep(1.5))

        assert c.run_workers(lambda cfg: _train(cfg, hold)) == [2.0, 2.0]
        assert not c.errors
    assert "marked dead" not in caplog.text
    assert "scheduler: its loop was held up" in caplog.text


def test_a_server_held_up_past_the_heartbeat_timeout_does_not_mark_the_scheduler_dead(caplog):
    with InProcessCluster(1, 2, deadline=60, shm=0, heartbeat_interval=0.2, heartbeat_timeout=10.0) as c:
        def hold() -> None:  # the server judges the scheduler's silence after 0.6 s, and is held up for 1.5 s
            membership = c.servers[0]._membership
            membership._cluster = _judging(membership._cluster, 0.6)
            c.servers[0]._reactor.call_soon(lambda: time.sleep(1.5))

        assert c.run_workers(lambda cfg: _train(cfg, hold)) == [2.0, 2.0]
        assert not c.errors
    assert "lost its heartbeats" not in caplog.text and "no answer for" not in caplog.text
