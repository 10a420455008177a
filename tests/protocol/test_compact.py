"""The compact header (pskv.protocol.compact): the data path's usual messages, checked field by field."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from pskv.errors import ProtocolError
from pskv.protocol import PROTOCOL_VERSION, ArraySpec, Command, Flag, Header, decode, encode
from pskv.protocol.codec import Limits, decode_arrays, decode_head
from pskv.protocol.compact import HEAD, MARK, SPEC, request_of

FOUR = np.zeros(4, np.float32)


def test_the_usual_messages_travel_compact_and_round_trip():
    one = Header(Command.PUSHPULL, 7, 9, (ArraySpec(3, "float32", (4,), 2, 5),), 1, flags=Flag.QUIET, epoch=4)
    two = Header(Command.PULL, 8, 9, (ArraySpec(3, "float32", (4,), 0, 1), ArraySpec(4, "int64", (2,), 6, 2)))
    reply = Header(Command.REPLY, 8, 8, (ArraySpec(3, "float32", (4,), 0, 1, 1),), flags=Flag.SHM)
    for header, data in ((one, [FOUR]), (two, []), (reply, []), (Header(Command.SYNC, 9, 9), [])):
        frames = encode(header, data)
        assert bytes(frames[0][:1]) == bytes((MARK,)) and request_of(bytes(frames[0])) == header.request
        assert decode(frames)[0] == header
        head, specs = decode_head(frames)
        assert head.arrays == () and decode_arrays(head, specs, frames)[0] == header
    # a body, rows or a 2-D shape: msgpack
    assert bytes(encode(Header(Command.HELLO, 1, 9, body="{}"))[0][:1]) != bytes((MARK,))
    assert bytes(encode(Header(Command.PULL, 1, 9, (ArraySpec(3, "float32", (2, 2)),)))[0][:1]) != bytes((MARK,))


def _one(command=Command.PUSH, flags=0, epoch=0, key=3, code=2, n=4, offset=0, rnd=0, buffer=-1, version=None):
    return struct.pack("<BBBBqqqq", MARK, PROTOCOL_VERSION if version is None else version, command, flags, 1, 9,
                       0, epoch) + SPEC.pack(key, code, n, offset, rnd, buffer)


@pytest.mark.parametrize("head,frames,match", [
    (_one(version=2), [FOUR], "protocol version 2 not supported"),
    (_one(command=99), [FOUR], "unknown command 99"),
    (_one(flags=Flag.COMPRESSED), [FOUR], "need a body or rows"),
    (_one(flags=Flag.ROWS), [FOUR], "need a body or rows"),
    (_one(epoch=-1), [FOUR], "field epoch must be a view epoch"),
    (_one(n=-4), [FOUR], "negative size"),
    (_one(offset=-1), [FOUR], "negative size, offset or round"),
    (_one(rnd=-1), [FOUR], "negative size, offset or round"),
    (_one(code=99), [FOUR], "dtype code 99"),
    (_one(buffer=2), [FOUR], "shared buffer index 2"),
    (_one(n=5), [FOUR], r"shape \(5,\) float32 needs 20 bytes, frame has 16"),
    (_one(n=2**62), [FOUR], "exceeds the frame limit"),
    (_one(), [], "describes 1 arrays but 0 data frames"),
    (_one()[:-1], [FOUR], "not a head and whole specs"),
    (_one() + SPEC.pack(4, 2, 4, 0, 0, -1), [FOUR], "describes 2 arrays but 1 data frames"),
])
def test_a_bad_compact_header_is_refused(head, frames, match):
    with pytest.raises(ProtocolError, match=match):
        decode([head, *frames])


def test_the_number_of_specs_is_bounded_before_any_is_read():
    head = _one(command=Command.PULL)[:HEAD.size] + SPEC.pack(3, 2, 4, 0, 0, -1) * 3
    assert len(decode([head])[0].arrays) == 3
    with pytest.raises(ProtocolError, match="array list missing or too long"):
        decode([head], Limits(max_arrays=2))
