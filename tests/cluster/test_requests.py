"""Request tracking: replies, callbacks, waits, deadlines, confirmations without a reply."""

from __future__ import annotations

import threading
import time

import pytest

import pskv
from pskv.cluster import RequestTracker
from pskv.protocol import Command, Header

WAIT = 10.0
SERVER = 8


def reply(p, command=Command.REPLY, body=""):
    return Header(command, p.request, SERVER, body=body)


def test_callbacks_run_once_whether_added_before_or_after_completion():
    tracker = RequestTracker()
    p = tracker.new(SERVER, "pull")
    seen = []
    p.add_done_callback(lambda q: seen.append(("early", q.header.request)))
    assert not p.done()
    assert tracker.complete(reply(p), [])
    p.add_done_callback(lambda q: seen.append(("late", q.header.request)))
    assert p.done() and seen == [("early", p.request), ("late", p.request)]
    assert not tracker.complete(reply(p), [])  # a duplicate reply is dropped


def test_several_threads_wait_on_one_request():
    tracker = RequestTracker()
    p = tracker.new(SERVER, "pull")
    results = []

    def wait() -> None:
        try:
            p.wait(WAIT)
        except pskv.RemoteError as exc:
            results.append(str(exc))

    threads = [threading.Thread(target=wait) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    with pytest.raises(pskv.OperationTimeoutError, match="pull to server 0 got no reply within 0.01 s"):
        p.wait(0.01)
    tracker.complete(reply(p, Command.ERROR, '{"type": "UnknownKeyError", "message": "no key 3"}'), [])
    for t in threads:
        t.join(WAIT)
    assert len(results) == 3 and all("no key 3" in r for r in results)  # every waiter got the error
    with pytest.raises(pskv.RemoteError, match="no key 3"):
        p.wait(0)


def test_requests_with_a_timeout_expire_and_run_their_callbacks():
    tracker = RequestTracker()
    short = tracker.new(SERVER, "push", timeout=0.01)
    forever = tracker.new(SERVER, "push")
    failed = []
    short.add_done_callback(lambda q: failed.append(type(q.error).__name__))
    time.sleep(0.02)
    assert tracker.expire() == 1 and failed == ["OperationTimeoutError"]
    with pytest.raises(pskv.OperationTimeoutError, match="push to server 0 got no reply within 0.01 s"):
        short.wait(0)
    assert not forever.done() and tracker.outstanding() == [forever]


def test_resolve_completes_a_request_without_its_own_reply_once():
    tracker = RequestTracker()
    quiet, failing, answered = (tracker.new(SERVER, "push") for _ in range(3))
    tracker.resolve(quiet, reply(quiet))  # confirmed by a later reply
    tracker.resolve(failing, reply(failing), pskv.OperationTimeoutError("sync timed out"))
    tracker.complete(reply(answered, Command.ERROR, '{"type": "RemoteError", "message": "refused"}'), [])
    tracker.resolve(answered, reply(answered))  # already completed: unchanged
    assert quiet.wait(0).request == quiet.request
    with pytest.raises(pskv.OperationTimeoutError):
        failing.wait(0)
    with pytest.raises(pskv.RemoteError, match="refused"):
        answered.wait(0)
    assert tracker.outstanding() == []


def test_a_barrier_that_times_out_names_the_timeout_it_was_given():
    from pskv.cluster.membership import Membership
    from pskv.protocol import SCHEDULER_ID

    tracker = RequestTracker()
    m = object.__new__(Membership)  # no reactor: the request goes nowhere, so the barrier times out
    m.info, m._epoch, m._meetings, m._calls = None, 0, 0, {}
    m._request = lambda command, body, what, *a, **k: tracker.new(SCHEDULER_ID, what)  # type: ignore[method-assign]
    # it waits a grace past the timeout for the scheduler's own answer, but names the timeout
    with pytest.raises(pskv.OperationTimeoutError, match=r"barrier \(group 7\) to scheduler got no reply within 0.01 s$"):
        m.barrier(7, 0.01)
