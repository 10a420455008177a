"""A call's credit window between hosts (pskv.worker.pacing), through the store's API on data connections.

Worker 0 starts a pushpull of one big key alone: each server can answer a partition only
once worker 1's piece of it has come too, so worker 0 must stop at ``PSKV_CALL_WINDOW``
messages per server, and go on as worker 1's pushes complete the rounds.
"""

from __future__ import annotations

import socket
import threading
import time

import numpy as np

from pskv.optimizer import SGD
from pskv.protocol import Role, node_id
from pskv.testing import InProcessCluster

N = 300_000  # float32: 1.2 MB over 2 servers, 10 pieces of 64 KiB each
SETTINGS = dict(shm=0, bigarray_bound=1000, part_bytes=64 << 10, call_window=2)  # sockets: data connections


def sent_per_server(kv, servers=2):
    """Worker's pushpull messages out and unanswered, per server."""
    tracker = kv._worker.client.tracker
    return [sum(1 for p in tracker.outstanding_to(node_id(Role.SERVER, s)) if p.what == "pushpull" and p.sent is not None)
            for s in range(servers)]


def wait_for_window(kv, window):
    """Until worker 0 has ``window`` messages out to each server; then a moment more, in which no more may leave."""
    deadline = time.monotonic() + 20
    while sent_per_server(kv) != [window, window]:
        assert time.monotonic() < deadline, sent_per_server(kv)
        time.sleep(0.01)
    time.sleep(0.3)
    assert sent_per_server(kv) == [window, window]


def run(fn, **settings):
    with InProcessCluster(2, 2, deadline=60.0, **{**SETTINGS, **settings}) as cluster:
        return cluster.run_stores(fn)


def paced_round(kv, went_out, value, out, during=lambda: None):
    """Worker 0: pushpull in a thread, wait for the window, ``during()``, let worker 1 go; worker 1: wait, pushpull."""
    if kv.rank == 1:
        assert went_out.wait(30)
        kv.pushpull("big", np.full(N, value, np.float32), out=out)
        return
    caller = threading.Thread(target=kv.pushpull, args=("big", np.full(N, value, np.float32)), kwargs={"out": out})
    caller.start()
    try:
        wait_for_window(kv, 2)
        during()
    finally:
        went_out.set()
        caller.join(30)
    assert not caller.is_alive()


def test_a_worker_keeps_at_most_the_window_of_a_calls_messages_unanswered_per_server():
    went_out = threading.Event()

    def fn(kv):
        kv.init("big", np.zeros(N, np.float32))
        out = np.zeros(N, np.float32)
        paced_round(kv, went_out, kv.rank + 1.0, out)
        return float(out.min()), float(out.max()), kv._worker.client.channels()

    assert run(fn) == [(3.0, 3.0, ["tcp", "tcp"])] * 2


def test_held_messages_go_out_after_a_broken_connection_and_none_is_applied_twice():
    """Worker 0's data connections fail while it holds most of its call: every round still sums each piece once."""
    went_out = [threading.Event() for _ in range(2)]

    def cut(kv):
        for conn in kv._worker.client._senders:
            conn._sock.shutdown(socket.SHUT_RDWR)  # as a reset would: both ends see it fail

    def fn(kv):
        kv.init("big", np.zeros(N, np.float32))
        outs = [np.zeros(N, np.float32) for _ in went_out]
        paced_round(kv, went_out[0], kv.rank + 1.0, outs[0], during=lambda: cut(kv))
        paced_round(kv, went_out[1], 10 * (kv.rank + 1.0), outs[1])
        return [(float(o.min()), float(o.max())) for o in outs], kv._worker.client.channels()

    assert run(fn) == [([(3.0, 3.0), (30.0, 30.0)], ["tcp", "tcp"])] * 2


def sgd_rounds(kv, rounds=3):
    """Both workers pushpull ones into a key the servers update with SGD (learning rate 1)."""
    kv.init("big", np.zeros(N, np.float32))
    out = np.zeros(N, np.float32)
    for _ in range(rounds):
        kv.pushpull("big", np.ones(N, np.float32), out=out)
    return float(out.min()), float(out.max())


def test_no_call_is_paced_while_the_servers_run_an_optimizer():
    """A server updates a key's pieces together and answers none before it has them all: a window would stall."""
    def fn(kv):
        kv.set_optimizer(SGD(learning_rate=1.0))
        return sgd_rounds(kv), kv._worker.client.pacing.window

    assert run(fn) == [((-6.0, -6.0), 0)] * 2


def test_a_call_the_servers_do_not_answer_piece_by_piece_is_let_go_after_a_while(monkeypatch):
    """The safety net: an optimizer installed behind the pacing's back (here: sent by hand, so no worker knows)."""
    from pskv.worker import pacing

    monkeypatch.setattr(pacing, "ESCAPE", 0.3)
    monkeypatch.setattr(pacing, "TICK", 0.05)

    def fn(kv):
        if kv.rank == 0:
            kv._worker.control.set_optimizer(SGD(learning_rate=1.0).to_config())
        kv.barrier()
        start = time.monotonic()
        values = sgd_rounds(kv)
        return values, kv._worker.client.pacing.window, time.monotonic() - start >= 0.3

    assert run(fn) == [((-6.0, -6.0), 2, True)] * 2
