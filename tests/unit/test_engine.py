"""The operation engine and non-blocking store calls: ordering, priorities, handles, errors."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

import pskv
from pskv.kvstore.engine import Deferred, Engine

WAIT = 10.0  # generous bound for anything that should finish at once


def gate_op(engine: Engine, key: str, started: threading.Event, release: threading.Event):
    """Submit an operation that holds ``key`` until ``release`` is set."""
    def hold() -> str:
        started.set()
        assert release.wait(WAIT)
        return "held"
    return engine.submit("hold", [key], 0, hold, block=False, timeout=None)


def test_ready_operations_start_in_priority_order():
    engine = Engine(threads=1)
    started, release = threading.Event(), threading.Event()
    gate = gate_op(engine, "gate", started, release)
    assert started.wait(WAIT)  # the only worker is now busy
    order: list[int] = []
    handles = [engine.submit("op", [f"k{p}"], p, lambda p=p: order.append(p), block=False, timeout=None)
               for p in (0, 5, -3, 2, 5)]
    release.set()
    for h in handles:
        h.wait(WAIT)
    assert gate.wait(WAIT) == "held"
    assert order == [5, 5, 2, 0, -3]
    engine.close(WAIT)


def test_operations_on_one_key_run_in_issue_order_whatever_their_priority():
    engine = Engine(threads=2)
    order: list[int] = []
    handles = [engine.submit("op", ["k"], priority, lambda i=i: order.append(i), block=False, timeout=None)
               for i, priority in enumerate([0, 10, -10, 3, 7, 1])]
    for h in handles:
        h.wait(WAIT)
    assert order == list(range(6))
    engine.close(WAIT)


def test_multi_key_operation_waits_for_all_its_keys():
    engine = Engine(threads=2)
    started, release = threading.Event(), threading.Event()
    gate_op(engine, "a", started, release)
    assert started.wait(WAIT)
    ran = threading.Event()
    both = engine.submit("both", ["a", "b"], 100, ran.set, block=False, timeout=None)
    other = engine.submit("other", ["b"], 0, lambda: "b-done", block=False, timeout=None)
    assert not ran.wait(0.2) and not both.done()
    assert not other.done()  # queued behind "both" on key b
    release.set()
    assert both.wait(WAIT) is None and other.wait(WAIT) == "b-done"
    engine.close(WAIT)


def test_blocking_submit_waits_behind_queued_work_and_times_out():
    engine = Engine(threads=1)
    started, release = threading.Event(), threading.Event()
    gate_op(engine, "k", started, release)
    assert started.wait(WAIT)
    with pytest.raises(TimeoutError, match=r"push on key\(s\) \['k'\] did not finish within 0.1 s") as info:
        engine.submit("push", ["k"], 0, lambda: 1, block=True, timeout=0.1)
    assert isinstance(info.value, pskv.OperationTimeoutError)
    with pytest.raises(pskv.OperationTimeoutError, match="still pending"):
        engine.wait_all(timeout=0.1)
    release.set()
    engine.wait_all(timeout=WAIT)  # the timed-out operation still ran
    assert engine.pending() == 0
    engine.close(WAIT)


def test_errors_reach_the_handle_or_the_next_wait_all():
    engine = Engine(threads=1)

    def fail() -> None:
        raise RuntimeError("lost?")

    h = engine.submit("op", ["k"], 0, fail, block=False, timeout=None)
    with pytest.raises(RuntimeError, match="lost"):
        h.wait(WAIT)
    engine.wait_all(timeout=WAIT)  # already observed through the handle: not raised again
    engine.submit("op", ["k"], 0, fail, block=False, timeout=None)
    with pytest.raises(RuntimeError, match="lost"):
        engine.wait_all(timeout=WAIT)
    engine.wait_all(timeout=WAIT)  # reported once
    engine.submit("op", ["k"], 0, fail, block=False, timeout=None)
    with pytest.raises(RuntimeError, match="lost"):
        engine.close(WAIT)  # close reports it too
    with pytest.raises(pskv.StoreClosedError):
        engine.submit("op", ["k"], 0, fail, block=False, timeout=None)


# -- deferred operations (network calls that finish when their replies are in) ---------------
class Reply:
    """A stand-in for a pending request: completed by ``arrive``, on the calling thread."""

    def __init__(self) -> None:
        self._done = False
        self._callbacks: list = []
        self._lock = threading.Lock()

    def done(self) -> bool:
        return self._done

    def add_done_callback(self, fn) -> None:
        with self._lock:
            if not self._done:
                self._callbacks.append(fn)
                return
        fn(self)

    def arrive(self) -> None:
        with self._lock:
            self._done = True
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn(self)


def test_a_released_deferred_op_lets_the_next_op_start_and_completes_on_its_reply():
    engine = Engine(threads=1)
    reply = Reply()
    order: list[str] = []
    first = engine.submit("push", ["k"], 0, lambda: Deferred([reply], lambda: order.append("acked") or "push",
                                                             release=True, inline=True),
                          block=False, timeout=None, inline=True)
    second = engine.submit("pull", ["k"], 0, lambda: order.append("pull started") or "pull",
                           block=False, timeout=None)
    assert second.wait(WAIT) == "pull" and not first.done()  # the pull did not wait for the push's reply
    with pytest.raises(pskv.OperationTimeoutError):
        engine.wait_all(timeout=0.05)  # the push is still pending
    reply.arrive()
    assert first.done() and first.wait(WAIT) == "push"
    assert order == ["pull started", "acked"]
    engine.close(WAIT)


def test_start_now_starts_on_an_idle_key_only_and_behaves_as_an_inline_submit():
    engine = Engine(threads=1)
    reply = Reply()
    order: list[str] = []
    first = engine.start_now("push", "k", 0, lambda: Deferred([reply], lambda: order.append("acked") or "push",
                                                              release=True, inline=True))
    assert first is not None and not first.done()
    second = engine.start_now("push", "k", 0, lambda: order.append("second") or 2)  # released: the key is idle
    assert second is not None and second.wait(WAIT) == 2
    pulled = Reply()
    held = engine.submit("pull", ["k"], 0, lambda: Deferred([pulled], lambda: 1, inline=True),
                         block=False, timeout=None, inline=True)
    assert engine.start_now("push", "k", 0, lambda: order.append("never")) is None  # held: submit it instead
    assert engine.start_now("push", "other", 0, lambda: 3).wait(WAIT) == 3  # type: ignore[union-attr]
    with pytest.raises(pskv.OperationTimeoutError):
        engine.wait_all(["k"], timeout=0.05)  # the first push and the pull are pending
    reply.arrive()
    assert first.wait(WAIT) == "push" and order == ["second", "acked"] and not held.done()
    pulled.arrive()
    assert held.wait(WAIT) == 1
    engine.close(WAIT)
    assert engine.start_now("push", "new", 0, lambda: 4) is None  # closed


def test_an_unreleased_deferred_op_holds_its_keys_until_finished():
    engine = Engine(threads=1)
    reply = Reply()
    first = engine.submit("pull", ["k"], 0, lambda: Deferred([reply], lambda: 1, inline=True),
                          block=False, timeout=None, inline=True)
    second = engine.submit("push", ["k"], 0, lambda: 2, block=False, timeout=None, inline=True)
    assert not second.done()  # queued behind the pull
    reply.arrive()
    assert first.wait(WAIT) == 1 and second.wait(WAIT) == 2
    engine.close(WAIT)


def test_who_runs_the_finish_of_a_deferred_op():
    engine = Engine(threads=1)
    here = threading.current_thread().name
    ran: dict[str, str] = {}

    def op(name: str, reply: Reply, inline: bool):
        def finish() -> str:
            ran[name] = threading.current_thread().name
            return name
        return engine.submit(name, [name], 0, lambda: Deferred([reply], finish, inline=inline),
                             block=False, timeout=None, inline=True)

    started: dict[str, str] = {}

    def start_thread(name: str) -> Any:
        started[name] = threading.current_thread().name
        return Deferred([], lambda: name)
    assert engine.submit("idle", ["i"], 0, lambda: start_thread("idle"), block=False, timeout=None,
                         inline=True).wait(WAIT) == "idle"
    assert started["idle"] == here  # an inline submit on idle keys starts in the caller's thread

    cheap, heavy, waited = Reply(), Reply(), Reply()
    h_cheap, h_heavy, h_waited = op("cheap", cheap, True), op("heavy", heavy, False), op("waited", waited, False)
    arrival = threading.Thread(target=cheap.arrive, name="network")
    arrival.start()
    arrival.join()
    assert h_cheap.wait(WAIT) == "cheap" and ran["cheap"] == "network"  # inline: where the reply arrived
    heavy.arrive()
    deadline = time.monotonic() + WAIT
    while not h_heavy.done() and time.monotonic() < deadline:  # not waiting on it: a worker finishes it
        time.sleep(0.01)
    assert h_heavy.wait(WAIT) == "heavy" and ran["heavy"].startswith("pskv-engine")
    threading.Timer(0.1, waited.arrive).start()
    assert h_waited.wait(WAIT) == "waited" and ran["waited"] == here  # the waiter finishes it itself
    engine.close(WAIT)


def test_a_blocking_deferred_op_on_idle_keys_finishes_in_the_caller():
    engine = Engine(threads=1)
    seen: list[str] = []

    def finish() -> str:
        seen.append(threading.current_thread().name)
        return "done"
    assert engine.submit("pull", ["k"], 0, lambda: Deferred([Reply()], finish), block=True, timeout=WAIT) == "done"
    assert seen == [threading.current_thread().name]  # no reply callback involved: the caller waits itself
    engine.close(WAIT)


def test_deferred_errors_reach_the_handle_or_the_next_wait_all():
    engine = Engine(threads=1)

    def fail() -> None:
        raise RuntimeError("refused")

    r1, r2 = Reply(), Reply()
    h = engine.submit("push", ["a"], 0, lambda: Deferred([r1], fail, release=True, inline=True),
                      block=False, timeout=None, inline=True)
    r1.arrive()
    with pytest.raises(RuntimeError, match="refused"):
        h.wait(WAIT)
    engine.submit("push", ["b"], 0, lambda: Deferred([r2], fail, release=True, inline=True),
                  block=False, timeout=None, inline=True)
    r2.arrive()
    with pytest.raises(RuntimeError, match="refused"):
        engine.wait_all(timeout=WAIT)
    engine.wait_all(timeout=WAIT)  # reported once
    engine.close(WAIT)


def test_waiting_pokes_deferred_ops_that_complete_only_when_asked():
    engine = Engine(threads=1)
    replies = [Reply(), Reply(), Reply()]
    pokes: list[int] = []

    def deferred(i: int) -> Deferred:
        def poke() -> None:
            pokes.append(i)
            replies[i].arrive()  # e.g. a SYNC whose reply confirms the quiet request
        return Deferred([replies[i]], lambda: i, release=True, inline=True, poke=poke)

    h0 = engine.submit("push", ["k"], 0, lambda: deferred(0), block=False, timeout=None, inline=True)
    assert not h0.done() and pokes == []
    assert h0.wait(WAIT) == 0 and pokes == [0]
    engine.submit("push", ["k"], 0, lambda: deferred(1), block=False, timeout=None, inline=True)
    engine.wait_all(timeout=WAIT)
    assert pokes == [0, 1]
    # a waiter that came before the op started is poked when it starts
    started, release = threading.Event(), threading.Event()
    gate_op(engine, "g", started, release)
    assert started.wait(WAIT)
    h2 = engine.submit("push", ["g"], 0, lambda: deferred(2), block=False, timeout=None, inline=True)
    threading.Timer(0.1, release.set).start()
    assert h2.wait(WAIT) == 2 and pokes == [0, 1, 2]
    engine.close(WAIT)


# -- through the store --------------------------------------------------------------------

def test_non_blocking_store_calls(make_store):
    kv = make_store("local")
    kv.init("w", np.zeros(3, np.float32))
    kv.set_updater(lambda key, merged, stored: stored.__iadd__(merged))
    handles = [kv.push("w", np.full(3, i, np.float32), priority=i, block=False) for i in range(1, 6)]
    pulled = kv.pull("w", block=False)
    assert isinstance(pulled, pskv.OpHandle)
    np.testing.assert_array_equal(pulled.wait(WAIT), np.full(3, 15))  # sees every earlier push
    assert all(h.done() for h in handles) and handles[0].exception() is None
    out = np.zeros(3, np.float32)
    h = kv.pushpull("w", np.ones(3, np.float32), out=out, block=False)
    assert h.wait(WAIT) is None
    assert out[0] == 16
    kv.wait(timeout=WAIT)
    kv.wait(keys="w", timeout=WAIT)


def test_store_wait_reports_unobserved_errors(make_store):
    kv = make_store("local")
    kv.init(1, np.zeros(3))

    def update(key, merged, stored):
        raise ArithmeticError("updater failed")

    kv.set_updater(update)
    h = kv.push(1, np.ones(3), block=False)
    with pytest.raises(ArithmeticError):
        kv.wait(timeout=WAIT)
    assert isinstance(h.exception(), ArithmeticError)
    np.testing.assert_array_equal(kv.pull(1), np.zeros(3))


def test_validation_errors_are_raised_at_call_time_even_when_non_blocking(make_store):
    kv = make_store("local")
    kv.init(1, np.zeros(3))
    with pytest.raises(pskv.ShapeMismatchError):
        kv.push(1, np.ones(4), block=False)
    with pytest.raises(pskv.UnknownKeyError):
        kv.pull(2, block=False)


def test_priority_must_be_int(make_store):
    kv = make_store("local")
    kv.init(1, np.zeros(3))
    with pytest.raises(pskv.InvalidTypeError, match="priority"):
        kv.push(1, np.ones(3), priority=1.5)


def test_a_handle_waited_on_without_a_timeout_waits_the_store_default_not_forever():
    from pskv.errors import OperationTimeoutError

    release = threading.Event()
    with pskv.create("local", default_timeout=0.2) as kv:
        kv.init(0, np.zeros(2))
        kv.set_updater(lambda key, grad, weight: release.wait(5))
        handle = kv.push(0, np.ones(2), block=False)
        with pytest.raises(OperationTimeoutError, match="did not finish within 0.2 s"):
            handle.wait()
        release.set()
        handle.wait(5)


def test_settle_waits_for_pending_work_without_taking_its_errors():
    # DistJob.barrier settles first (pskv.server.steps): a failure stays for the next wait_all
    engine = Engine(threads=1)
    started, release = threading.Event(), threading.Event()
    gate_op(engine, "gate", started, release)
    assert started.wait(WAIT)
    assert engine.settle(0.05) is False  # still held

    def fail() -> None:
        raise ValueError("boom")

    engine.submit("fail", ["k"], 0, fail, block=False, timeout=None)
    release.set()
    assert engine.settle(WAIT) is True
    with pytest.raises(ValueError, match="boom"):
        engine.wait_all(timeout=WAIT)
    engine.close(WAIT)
