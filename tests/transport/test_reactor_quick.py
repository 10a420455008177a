"""The reactor's quick turns (issue 23, small messages): while every ZeroMQ socket is settled, a turn waits with
one ``poll`` of the plain descriptors and the sockets' mailbox descriptors instead of ``zmq_poll`` of everything
(two system calls more per ZeroMQ socket and turn); ZeroMQ input that comes meanwhile is still handled at once,
in order, and so is a reply sent on a ZeroMQ socket from a handler."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from pskv.transport import Reactor
from pskv.transport.unix import local_path

WAIT = 10.0


@pytest.fixture
def context():
    ctx = zmq.Context()
    yield ctx
    ctx.term()


class Counting:
    """Counts the reactor's full waits (``zmq_poll`` of everything) and its quick ones."""

    def __init__(self, reactor: Reactor) -> None:
        self.full = self.quick = 0
        poller = reactor._poller
        full_poll, quick_wait = poller.poll, poller.quick_wait

        def full(timeout: int | None = None) -> list:
            self.full += 1
            return full_poll(timeout)

        def quick(timeout_ms: int) -> dict | None:
            self.quick += 1
            return quick_wait(timeout_ms)

        poller.poll = full  # type: ignore[method-assign]
        poller.quick_wait = quick  # type: ignore[method-assign]


def test_local_messages_take_quick_turns_and_zeromq_input_is_not_missed(context, tmp_path):
    server = Reactor(context, "server")
    client = Reactor(context, "client", identity=b"client-1")
    local: list[bytes] = []
    routed: list[bytes] = []
    replies: list[bytes] = []
    local_done, routed_done, replies_done = threading.Event(), threading.Event(), threading.Event()

    def on_message(identity: bytes, frames: list) -> None:
        body = bytes(frames[0])
        if body.startswith(b"local"):
            local.append(body)
            server.send_router(sid, identity, [b"re:" + body])  # back on the local connection: no ZeroMQ
            if len(local) == 200:
                local_done.set()
        else:
            routed.append(body)
            server.send_router(sid, identity, [b"re:" + body])  # a ZeroMQ send from a handler
            if len(routed) == 20:
                routed_done.set()

    def on_reply(frames: list) -> None:
        replies.append(bytes(frames[0]))
        if len(replies) == 20:
            replies_done.set()

    sid, address = server.bind_router("tcp://127.0.0.1:0", on_message)
    path = local_path(str(tmp_path))
    server.bind_local(sid, path)
    counting = Counting(server)
    server.start()
    local_replies: list[bytes] = []
    conn = client.connect_local(path, lambda frames: local_replies.append(bytes(frames[0])))
    dealer = client.connect_dealer(address, on_reply)
    client.start()
    time.sleep(0.3)  # the server settles (its first turns ask every ZeroMQ socket)
    before = counting.full
    for i in range(200):
        conn.send([b"local%d" % i])
        if i % 20 == 0:
            time.sleep(0.002)  # turns of their own, not one batch
    assert local_done.wait(WAIT)
    # a wait that zmq_poll made for every local message would be ~200; heartbeat-free, only a few are left
    assert counting.full - before < 20, (counting.full - before, counting.quick)
    assert counting.quick > 5
    assert local == [b"local%d" % i for i in range(200)]
    for i in range(20):  # ZeroMQ input while the server waits quick turns: its mailbox descriptor wakes it
        time.sleep(0.01)
        client.call_soon(lambda i=i: client.send_dealer(dealer, [b"zmq%d" % i]))
    assert routed_done.wait(WAIT) and replies_done.wait(WAIT)
    assert routed == [b"zmq%d" % i for i in range(20)]
    assert replies == [b"re:zmq%d" % i for i in range(20)]
    for _ in range(100):
        if len(local_replies) == 200:
            break
        time.sleep(0.02)
    assert local_replies == [b"re:local%d" % i for i in range(200)]
    assert server.error is None and client.error is None
    client.stop()
    server.stop()


def test_a_zeromq_socket_left_undrained_is_asked_again_at_once(context, monkeypatch):
    """More than one turn's share (256 messages) waiting on a ZeroMQ socket: the rest is taken on the next turns,
    not left until something else wakes the reactor."""
    server = Reactor(context, "server")
    client = Reactor(context, "client", identity=b"client-2")
    got: list[bytes] = []
    done = threading.Event()

    def on_message(identity: bytes, frames: list) -> None:
        got.append(frames[0].bytes)
        if len(got) == 700:
            done.set()

    sid, address = server.bind_router("tcp://127.0.0.1:0", on_message)
    dealer = client.connect_dealer(address, lambda frames: None)
    client.start()

    def burst() -> None:
        for i in range(700):
            client.send_dealer(dealer, [b"m%d" % i])
    client.call_soon(burst)
    time.sleep(0.5)  # all queued before the server reads any
    server.start()
    assert done.wait(WAIT)
    assert got == [b"m%d" % i for i in range(700)]
    client.stop()
    server.stop()


def test_the_wake_pipe_wakes_a_quick_wait_and_is_closed_with_the_reactor(context):
    r = Reactor(context, "wake")
    counting = Counting(r)
    r.start()
    time.sleep(0.3)
    ran = threading.Event()
    start = time.monotonic()
    r.call_soon(ran.set)
    assert ran.wait(WAIT) and time.monotonic() - start < 0.09  # not at the next timer turn (0.1 s)
    assert counting.quick > 0
    r.stop()
    r.wake()  # after the close: nothing happens, nothing raises


def test_timers_are_passed_over_only_when_one_is_due(monkeypatch):
    """A turn before the first timer is due only computes the wait (issue 23: no pass over the timers every
    turn); a timer added later, due sooner, shortens it; a due one runs and the wait is never 0 before it."""
    from pskv.transport import waits

    now = [128.0]  # times in binary fractions: exact
    monkeypatch.setattr(waits.time, "monotonic", lambda: now[0])
    timers, ran = waits.Timers(), []
    assert timers.run_due() == 100  # none: the longest wait
    timers.add(0.5, lambda: ran.append("slow"))
    assert timers.run_due() == 100 and ran == []
    now[0] += 0.4375
    assert timers.run_due() == 63  # 62.5 ms rounded up: never a zero-timeout poll before it is due
    timers.add(0.015625, lambda: ran.append("fast"))
    assert timers.run_due() == 16 and ran == []
    now[0] += 0.015625
    assert timers.run_due() == 16 and ran == ["fast"]  # ran; due again in 15.625 ms, before the slow one
    now[0] += 0.046875
    assert timers.run_due() == 16 and ran == ["fast", "slow", "fast"]  # both due: each ran once


def test_stop_after_a_start_a_signal_handler_cut_short_does_not_raise(context, monkeypatch):
    # a role's SIGUSR1 handler ("no worker will come") may raise SystemExit inside Thread.start(): the thread
    # object exists but never started, and stop() must still end the role cleanly (exit code 0)
    import threading

    r = Reactor(context, "cut-short")

    def interrupted(self):
        raise SystemExit(0)

    monkeypatch.setattr(threading.Thread, "start", interrupted)
    with pytest.raises(SystemExit):
        r.start()
    monkeypatch.undo()
    r.stop()  # before the fix: RuntimeError("cannot join thread before it is started")
