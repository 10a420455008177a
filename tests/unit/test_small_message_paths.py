"""The small-message fast paths of issue 23 give what the general paths give: the usual array spec checked in one
expression (``codec._usual_spec``), and local messages whose frame table is packed with a prepared ``struct``."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from pskv.errors import ProtocolError
from pskv.protocol import codec
from pskv.protocol.codec import DEFAULT_LIMITS, _spec, _usual_spec
from pskv.transport.unix import LocalConnection

FLOAT32 = codec._DTYPE_CODE["float32"]


def test_the_usual_spec_takes_the_fast_path_and_equals_the_general_checks(monkeypatch):
    buf = memoryview(bytearray(4096))
    spec = [123, FLOAT32, [1024], 2048, 7]
    fast = _usual_spec(spec, buf, DEFAULT_LIMITS, False)
    assert fast is not None  # taken
    assert fast == _spec(0, spec, buf, DEFAULT_LIMITS)
    assert fast == (123, "float32", (1024,), 2048, 7, -1)
    assert _usual_spec(spec, None, DEFAULT_LIMITS, False) == fast  # a part named without data (SHM, PULL)
    assert _usual_spec(spec, memoryview(bytearray(100)), DEFAULT_LIMITS, True) == fast  # compressed: shorter
    monkeypatch.setattr(codec, "_usual_spec", lambda *a: None)  # the general checks alone agree
    assert _spec(0, spec, buf, DEFAULT_LIMITS) == fast


@pytest.mark.parametrize("spec, buf_bytes, message", [
    ([123, FLOAT32, [1024], 0, 7], 4092, "needs 4096 bytes, frame has 4092"),
    ([123, FLOAT32, [-1], 0, 7], 0, "bad shape"),
    ([123, FLOAT32, [True], 0, 7], 4, "bad shape"),
    ([2**63, FLOAT32, [1], 0, 7], 4, "key must be a 64-bit int"),
    ([1, 999, [1], 0, 7], 4, "not in the allow-list"),
    ([1, FLOAT32, [1], -1, 7], 4, "offset must be"),
    ([1, FLOAT32, [1], 0, 2**63], 4, "round must be"),
    ([1, FLOAT32, [2**40], 0, 0], None, "exceeds the frame limit"),
    ([1, FLOAT32, [1], 0], 4, "5- or 6-field list"),
])
def test_every_other_spec_falls_back_to_the_checks_that_name_the_problem(spec, buf_bytes, message):
    buf = None if buf_bytes is None else memoryview(bytearray(buf_bytes))
    assert _usual_spec(spec, buf, DEFAULT_LIMITS, False) is None
    with pytest.raises(ProtocolError, match=message):
        _spec(0, spec, buf, DEFAULT_LIMITS)


@pytest.mark.parametrize("frames", [1, 2, 7, 8, 12])
def test_local_messages_of_any_number_of_frames_arrive_whole_and_in_order(frames):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sender, receiver = LocalConnection(a, "sender"), LocalConnection(b, "receiver", queued=True)
    try:
        for n in range(3):
            sent = [bytes([n, i]) * (i + 1) for i in range(frames - 1)] + [memoryview(np.arange(5, dtype=np.int64))]
            sender.send(sent)
            got = receiver.receive(wait=5.0)
            assert got is not None and [bytes(f) for f in got] == [bytes(memoryview(f).cast("B")) for f in sent]
    finally:
        sender.close()
        receiver.close()
