"""The reactor: ROUTER/DEALER round trips over inproc and loopback TCP, calls, timers, stop."""

from __future__ import annotations

import threading

import pytest
import zmq

from pskv.errors import TransportError
from pskv.transport import Reactor

WAIT = 10.0


@pytest.fixture
def context():
    ctx = zmq.Context()
    yield ctx
    ctx.term()


@pytest.mark.parametrize("address", ["inproc://pskv-test-echo", "tcp://127.0.0.1:0"])
def test_request_reply_round_trip(context, address):
    server = Reactor(context, "server")
    client = Reactor(context, "client", identity=b"client-9")
    seen: list[bytes] = []

    def echo(identity: bytes, frames: list[zmq.Frame]) -> None:
        seen.append(identity)
        server.send_router(sid, identity, [b"re:" + frames[0].bytes, frames[1]])

    sid, bound = server.bind_router(address, echo)
    assert bound.startswith(address.rsplit(":", 1)[0]) and not bound.endswith(":0")
    got: list[list[bytes]] = []
    done = threading.Event()

    def on_reply(frames: list[zmq.Frame]) -> None:
        got.append([f.bytes for f in frames])
        if len(got) == 3:
            done.set()

    dealer = client.connect_dealer(bound, on_reply)
    server.start()
    client.start()
    for i in range(3):
        client.call_soon(lambda i=i: client.send_dealer(dealer, [b"ping%d" % i, memoryview(b"x" * i)]))
    assert done.wait(WAIT)
    assert got == [[b"re:ping%d" % i, b"x" * i] for i in range(3)]
    assert seen == [b"client-9"] * 3
    client.stop()
    server.stop()
    client.stop()  # idempotent


def test_timers_and_call_soon_run_on_the_reactor_thread(context):
    r = Reactor(context, "timers")
    ticks: list[str] = []
    fired = threading.Event()

    def tick() -> None:
        ticks.append(threading.current_thread().name)
        if len(ticks) >= 3:
            fired.set()

    r.add_timer(0.01, tick)
    r.start()
    assert fired.wait(WAIT)
    ran = threading.Event()
    r.call_soon(lambda: ran.set() if r.on_reactor_thread() else None)
    assert ran.wait(WAIT)
    assert set(ticks) == {"timers"}
    r.stop()
    with pytest.raises(TransportError, match="stopped"):
        r.call_soon(lambda: None)


def test_handler_failure_reaches_the_owner(context):
    failures: list[BaseException] = []
    failed = threading.Event()

    def on_failure(exc: BaseException) -> None:
        failures.append(exc)
        failed.set()

    r = Reactor(context, "failing", on_failure=on_failure)
    r.start()
    r.call_soon(lambda: 1 / 0)
    assert failed.wait(WAIT)
    assert isinstance(failures[0], ZeroDivisionError) and isinstance(r.error, ZeroDivisionError)
    r.stop()


def test_bind_errors_are_typed(context):
    r = Reactor(context, "binder")
    r.bind_router("inproc://pskv-test-dup", lambda i, f: None)
    with pytest.raises(TransportError, match="cannot bind inproc://pskv-test-dup"):
        r.bind_router("inproc://pskv-test-dup", lambda i, f: None)
    r.stop()


def test_reply_to_vanished_peer_is_dropped_not_fatal(context):
    r = Reactor(context, "lonely")
    sid, _ = r.bind_router("inproc://pskv-test-lonely", lambda i, f: None)
    result: list[bool] = []
    done = threading.Event()
    r.start()
    r.call_soon(lambda: (result.append(r.send_router(sid, b"nobody", [b"x"])), done.set()))
    assert done.wait(WAIT)
    assert result == [False] and r.error is None
    r.stop()
