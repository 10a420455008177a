"""The worker's feature owners: compression (pskv.worker.compressing) and the call observer
(pskv.worker.observe) — off by default at no cost, on with their own state, closed with the worker."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from pskv.arrays import ArrayMeta
from pskv.errors import ProtocolError
from pskv.kvstore.compressing import GradientCompression
from pskv.metrics import NodeCounters
from pskv.protocol import Command, Flag, Header
from pskv.worker.compressing import NoCompression, PushCompression
from pskv.worker.layout import KeyLayout
from pskv.worker.observe import CallObserver, TracedCalls, observer


def _layout(key: int, size: int, dtype: str = "float32") -> KeyLayout:
    meta = ArrayMeta("numpy", (size,), dtype, "cpu")
    return KeyLayout(key, key, meta, [(0, 0, size)], [0], nbytes=size * 4, itemsize=4)


def _compress_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("pskv-compress")]


def test_off_compresses_nothing_and_refuses_a_compressed_reply():
    off = NoCompression()
    recs = [_layout(0, 100)]
    off.adopt(recs, summed=False)
    assert not recs[0].compress and not off.on and off.params == {} and off.save("/nowhere", 2) is None
    assert off.decoder(_header(0, ""), 1) is None
    with pytest.raises(ProtocolError, match="which this worker did not ask for"):
        off.decoder(_header(Flag.COMPRESSED, '{"type": "2bit"}'), 1)


def _header(flags: int, body: str) -> Header:
    """A reply's header (to a pull) with these flags and body."""
    return Header(Command.PULL, 1, 0, flags=flags, body=body)


def test_push_compression_follows_the_stores_rule_and_owns_its_threads():
    settings = GradientCompression({"type": "2bit", "threshold": 0.5, "min_size": 50})
    before = _compress_threads()
    comp = PushCompression(settings, 0, 1, CallObserver(NodeCounters()))
    small, big, ints, summed = _layout(0, 10), _layout(1, 100), _layout(2, 100, "int32"), _layout(3, 100)
    comp.adopt([small, big, ints], summed=False)
    comp.adopt([summed], summed=True)
    assert [r.compress for r in (small, big, ints, summed)] == [False, True, False, False]
    assert comp.params == settings.params and comp.both_ways is False
    big.outgoing = np.ones(100, np.float32)
    payloads = comp.payloads([(big, 0)]).result(timeout=10)
    assert len(payloads) == 1 and payloads[0].dtype == np.uint8
    assert comp.decoder(_header(Flag.COMPRESSED, comp.body), 1) is comp.compressor
    with pytest.raises(ProtocolError):
        comp.decoder(_header(Flag.COMPRESSED, '{"type": "1bit"}'), 1)
    assert len(_compress_threads()) > len(before)
    comp.close()
    for t in threading.enumerate():
        if t.name.startswith("pskv-compress") and t.name not in before:
            t.join(5)
    assert _compress_threads() == before


def test_the_observer_counts_with_the_timeline_off_and_reads_no_clock():
    counters = NodeCounters()
    off = observer(counters, None)
    assert type(off) is CallObserver
    assert off.calling(10, 20, push=True) == 0.0 and off.now() == 0.0
    assert (counters.ops, counters.rounds, counters.bytes_out, counters.bytes_in) == (1, 1, 10, 20)
    off.calling(0, 5, push=False)
    assert (counters.ops, counters.rounds, counters.bytes_in) == (2, 1, 25)
    assert issubclass(TracedCalls, CallObserver)
