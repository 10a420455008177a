"""The operation engine and non-blocking store calls: ordering, priorities, handles, errors."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import pskv
from pskv.kvstore.engine import Engine

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
