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


def test_a_socket_left_open_costs_a_warning_not_a_node_that_cannot_exit(monkeypatch, caplog):
    """ZeroMQ's term() waits without a timeout for every socket: stop() waits for it a bounded time."""
    import time

    from pskv.cluster import runtime as runtime_module

    monkeypatch.setattr(runtime_module, "TERM_TIMEOUT", 0.3)
    runtime = NodeRuntime("pskv-test", describe=lambda: "server 2")
    runtime.reactor.start()
    leaked = runtime.context.socket(zmq.DEALER)  # a bug's socket, never closed by its owner
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="pskv.cluster.runtime"):
        runtime.stop()
    assert time.monotonic() - started < 5
    assert "server 2: a socket of its ZeroMQ context was still open" in caplog.text
    leaked.close(linger=0)  # lets the pending term() end


def test_stop_from_the_reactor_thread_returns_and_ends_the_context():
    runtime = NodeRuntime("pskv-test")
    runtime.reactor.start()
    stopped = threading.Event()
    runtime.reactor.call_soon(lambda: (runtime.stop(), stopped.set()))
    assert stopped.wait(10)
    deadline = threading.Event()
    for _ in range(100):
        if runtime.context.closed:
            break
        deadline.wait(0.05)
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
