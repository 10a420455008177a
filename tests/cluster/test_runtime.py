"""NodeRuntime: one context, reactor and tracker per node, stopped once in a safe order."""

from __future__ import annotations

import threading

import pytest
import zmq

from pskv.cluster import RequestTracker
from pskv.cluster.runtime import NodeRuntime
from pskv.errors import TransportError


def test_stop_fails_what_waits_and_is_idempotent_from_two_threads():
    tracker = RequestTracker()
    runtime = NodeRuntime("pskv-test", tracker=tracker, describe=lambda: "server 3")
    runtime.reactor.start()
    pending = tracker.new(8, "pull")
    threads = [threading.Thread(target=runtime.stop) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    with pytest.raises(TransportError, match="server 3 stopped"):
        pending.wait(1)
    assert runtime.context.closed


def test_a_borrowed_context_is_left_open():
    ctx = zmq.Context()
    try:
        runtime = NodeRuntime("pskv-test", ctx)
        runtime.reactor.start()
        runtime.stop()
        assert not ctx.closed
    finally:
        ctx.term()


@pytest.mark.parametrize(("setting", "threads"), [(0, 2), (1, 1), (3, 3)])
def test_pskv_io_threads_sets_the_owned_contexts_io_threads(setting, threads):
    from pskv.config import ClusterConfig

    cluster = ClusterConfig.from_env({"PSKV_IO_THREADS": str(setting)})
    runtime = NodeRuntime("pskv-test", io_threads=2, cluster=cluster)
    try:
        assert runtime.context.get(zmq.IO_THREADS) == threads
    finally:
        runtime.stop()
