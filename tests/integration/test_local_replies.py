"""Replies on a worker's local connection are read by the thread that waits for them.

A blocking call to a server on this host (shared memory on, a Unix packet socket per
server) reads its reply in the calling thread (``Reactor.read_local``): one thread is
woken per reply instead of two (the reactor, then the caller). Requests nobody waits
for directly — non-blocking pulls, the SYNC that confirms quiet pushes — are still read
by the reactor at once, and every value comes out the same.
"""

from __future__ import annotations

import threading
import time

import numpy as np

import pskv
from pskv.testing import InProcessCluster

ROUNDS = 50


def test_blocking_calls_read_their_replies_in_the_calling_thread_and_the_rest_still_arrives():
    def worker(cfg):
        kv = pskv.create("dist_sync", cluster=cfg)
        try:
            kv.init(["a", "b"], [np.zeros(1024, np.float32)] * 2)
            client = kv._worker.client
            assert all(type(c).__name__ == "LocalConnection" for c in client._senders)  # the path under test
            me = threading.current_thread()
            handled_here = []
            handle = client._on_reply

            def on_reply(frames):  # what read_local hands the replies to (the reactor has its own reference)
                handled_here.append(threading.current_thread() is me)
                handle(frames)
            client._on_reply = on_reply
            val = np.full(1024, kv.rank + 1, np.float32)
            out = np.zeros(1024, np.float32)
            for _ in range(ROUNDS):
                out[:] = 0
                kv.push("a", val, block=False)
                kv.pull("a", out=out)
                assert np.all(out == 3.0)  # the round's sum over both workers
                out[:] = 0
                kv.pushpull("b", val, out=out)
                assert np.all(out == 3.0)
            # a reply that lands while the reactor is reading the connection is read there (on a loaded
            # machine one in a hundred or so): most, not every, blocking call reads its own
            assert len(handled_here) >= 2 * ROUNDS * 9 // 10 and all(handled_here), len(handled_here)
            took = []
            conn, reactor = client._senders[0], client._reactor
            for _ in range(20):
                _unpolled(conn, reactor)  # as after an inline read: the reactor sleeps without the connection
                start = time.monotonic()
                kv.pull("a", out=out, block=False).wait(10)  # nobody reads inline: the reactor must poll at once
                took.append(time.monotonic() - start)
            assert np.all(out == 3.0)
            kv.push("a", val, block=False)
            kv.wait(timeout=10)  # a quiet push, confirmed by a SYNC nobody reads inline
            return sorted(took)[len(took) // 2]
        finally:
            kv.close()

    with InProcessCluster(1, 2, deadline=60, shm=1) as cluster:
        took = cluster.run_workers(worker)
    # left to the reactor's next timer turn (at most 0.1 s away) each would take ~50 ms (median)
    assert max(took) < 0.04, took


def _unpolled(conn, reactor) -> None:
    """Leave ``conn`` out of ``reactor``'s poll, as a thread reading it inline does, then let go of it."""
    with conn.reading:
        conn.claimed = True
        reactor.wake()
        deadline = time.monotonic() + 10
        while conn.polled and time.monotonic() < deadline:
            time.sleep(0.001)
        conn.claimed = False
    assert not conn.polled


def test_threads_waiting_on_one_connection_each_get_their_reply():
    """One thread reads the connection at a time; the others' replies reach them (read by it, or by the
    reactor once it lets go)."""
    threads, rounds = 4, 30

    def worker(cfg):
        kv = pskv.create("dist_sync", cluster=cfg)
        try:
            keys = [f"k{t}" for t in range(threads)]
            kv.init(keys, [np.zeros(256, np.float32)] * threads)
            errors: list[BaseException] = []

            def run(t: int) -> None:
                val = np.full(256, (kv.rank + 1) * (t + 1), np.float32)
                out = np.zeros(256, np.float32)
                try:
                    for i in range(rounds):
                        if i % 2:
                            kv.pushpull(keys[t], val, out=out, timeout=20)
                        else:
                            kv.push(keys[t], val, block=False)
                            kv.pull(keys[t], out=out, timeout=20)
                        assert np.all(out == 3.0 * (t + 1)), (t, i, out[0])
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            pool = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
            for th in pool:
                th.start()
            for th in pool:
                th.join(60)
            assert not any(th.is_alive() for th in pool) and not errors, errors
        finally:
            kv.close()

    with InProcessCluster(1, 2, deadline=60, shm=1) as cluster:
        cluster.run_workers(worker)
