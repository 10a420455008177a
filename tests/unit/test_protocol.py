"""The wire schema and codec: round trips, validation of every field, and fuzzing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pskv.errors import ProtocolError
from pskv.protocol import (
    PROTOCOL_VERSION,
    ArraySpec,
    Command,
    Flag,
    Header,
    Limits,
    Role,
    decode,
    encode,
    frame_array,
    node_id,
    node_name,
    node_role_rank,
)
from pskv.testing import fuzz


def message(arrays, command=Command.PUSH, body=""):
    specs = tuple(ArraySpec(key=i * 7 - 3, dtype=str(a.dtype), shape=a.shape, offset=i, round=i + 1)
                  for i, a in enumerate(arrays))
    return Header(command, request=42, sender=9, arrays=specs, priority=-3, body=body), arrays


def test_round_trip_is_zero_copy_and_exact():
    arrays = [np.arange(12, dtype=np.float32).reshape(3, 4), np.array([1, -2], dtype=np.int64),
              np.zeros((0, 5), dtype=np.float64), np.float16(2.5) * np.ones(3, np.float16)]
    header, arrays = message(arrays, command=Command.REPLY, body='{"x": 1}')
    frames = encode(header, arrays)
    assert isinstance(frames[1], memoryview) and frames[1].obj is not None
    got, buffers = decode(frames)
    assert got == header
    for spec, buf, want in zip(got.arrays, buffers, arrays):
        np.testing.assert_array_equal(frame_array(spec, buf), want)


def test_non_contiguous_arrays_are_sent_contiguously():
    a = np.arange(16, dtype=np.float32).reshape(4, 4)[:, ::2]
    header = Header(Command.PUSH, 1, 9, (ArraySpec(5, "float32", a.shape),))
    got, buffers = decode(encode(header, [a]))
    np.testing.assert_array_equal(frame_array(got.arrays[0], buffers[0]), a)


def test_bfloat16_travels_as_raw_bits():
    bits = np.array([0x3F80, 0x4000], dtype=np.uint16)  # 1.0 and 2.0 in bfloat16
    header = Header(Command.PUSH, 1, 9, (ArraySpec(5, "bfloat16", (2,)),))
    got, buffers = decode(encode(header, [bits]))
    assert got.arrays[0].dtype == "bfloat16"
    np.testing.assert_array_equal(frame_array(got.arrays[0], buffers[0]), bits)


@pytest.mark.parametrize("command", list(Command))
def test_every_command_round_trips_and_headers_are_immutable(command):
    header = Header(command, 7, 9, flags=Flag.QUIET) if command is Command.PUSH else Header(command, 7, 9)
    got, buffers = decode(encode(header))
    assert got == header and got.command is command and buffers == []
    with pytest.raises(AttributeError):
        got.request = 8  # type: ignore[misc]


def test_node_ids_follow_ps_lite():
    assert node_id(Role.SCHEDULER, 0) == 1
    assert [node_id(Role.SERVER, r) for r in range(3)] == [8, 10, 12]
    assert [node_id(Role.WORKER, r) for r in range(3)] == [9, 11, 13]
    assert node_role_rank(13) == (Role.WORKER, 2) and node_role_rank(10) == (Role.SERVER, 1)
    assert node_name(11) == "worker 1" and node_name(1) == "scheduler"
    with pytest.raises(ValueError):
        node_role_rank(5)


def packed(fields):
    return [fuzz.pack(fields)]


GOOD = [PROTOCOL_VERSION, int(Command.PUSH), 1, 9, 0, "", [[3, 2, [2], 0, 0]], 0]
GOOD_FRAME = np.zeros(2, np.float32).tobytes()


@pytest.mark.parametrize("fields,match", [
    ([1, *GOOD[1:]], "protocol version 1 not supported"),
    ([PROTOCOL_VERSION, 99, *GOOD[2:]], "unknown command 99"),
    ([PROTOCOL_VERSION, int(Command.PUSH), "1", *GOOD[3:]], "request must be a 64-bit int"),
    ([PROTOCOL_VERSION, int(Command.PUSH), 2**63, *GOOD[3:]], "request must be a 64-bit int"),
    ([*GOOD[:5], 5, *GOOD[6:]], "body must be a string"),
    ([*GOOD[:6], [[3, 99, [2], 0, 0]], 0], "dtype code 99 not in the allow-list"),
    ([*GOOD[:6], [[3, 2, [-2], 0, 0]], 0], "bad shape"),
    ([*GOOD[:6], [[3, 2, [2], -1, 0]], 0], "offset must be a non-negative"),
    ([*GOOD[:6], [[3, 2, [3], 0, 0]], 0], r"shape \(3,\) float32 needs 12 bytes, frame has 8"),
    ([*GOOD[:6], [[3, 2, [2], 0]], 0], "spec is not a 5- or 6-field list"),
    ([*GOOD[:6], [[3, 2, [2], 0, 0, 2]], 0], "shared buffer index 2 is not 0 or 1"),
    ([*GOOD[:7], 256], "flags 256 are not a combination of the known flag bits"),
    ([*GOOD[:7], -1], "flags -1 are not"),
    ([*GOOD[:7], "1"], "flags '1' are not"),
    (GOOD[:7], "8-field list"),
    ({"a": 1}, "undecodable header"),
])
def test_malformed_headers_are_rejected(fields, match):
    with pytest.raises(ProtocolError, match=match):
        decode(packed(fields) + [GOOD_FRAME])


def test_frame_count_and_limits():
    with pytest.raises(ProtocolError, match="1 arrays but 0 data frames"):
        decode(packed(GOOD))
    with pytest.raises(ProtocolError, match="empty message"):
        decode([])
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        decode(packed(GOOD) + [GOOD_FRAME], Limits(max_header_bytes=4))
    with pytest.raises(ProtocolError, match="array list missing or too long"):
        decode(packed(GOOD) + [GOOD_FRAME], Limits(max_arrays=0))
    with pytest.raises(ProtocolError, match="exceeds the frame limit"):
        decode(packed(GOOD) + [GOOD_FRAME], Limits(max_frame_bytes=4))
    with pytest.raises(ProtocolError, match="undecodable header"):
        decode([b"\xc0garbage"])
    with pytest.raises(ProtocolError, match="not a head and whole specs"):  # 0xC1: the compact form's mark
        decode([b"\xc1garbage"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=4))
def test_random_frames_never_escape_as_other_errors(frames):
    try:
        decode(frames)
    except ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0), st.integers(min_value=0, max_value=255), st.data())
def test_mutated_valid_messages_are_decoded_or_rejected(position, new_byte, data):
    header, arrays = message([np.arange(6, dtype=np.float32), np.ones((2, 2), np.int32)])
    frames = [bytes(f) for f in encode(header, arrays)]
    which = data.draw(st.integers(min_value=0, max_value=len(frames) - 1))
    raw = bytearray(frames[which])
    if raw:
        raw[position % len(raw)] = new_byte
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(min_value=0, max_value=len(raw)))]
    frames[which] = bytes(raw)
    try:
        got, buffers = decode(frames)
    except ProtocolError:
        return
    for spec, buf in zip(got.arrays, buffers):  # whatever decodes is self-consistent
        assert frame_array(spec, buf).size == spec.size


def test_a_header_declaring_too_many_arrays_is_refused_before_it_is_built():
    # a hostile header listing more entries than max_arrays: msgpack stops at the length
    # prefix instead of building a huge list first
    head = fuzz.pack([*GOOD[:6], [0] * 300_000, 0])
    with pytest.raises(ProtocolError, match="undecodable header"):
        decode([head])


def test_a_deeply_nested_json_body_is_a_protocol_error():
    from pskv.protocol import Header
    from pskv.protocol.bodies import json_object as json_body

    with pytest.raises(ProtocolError, match="not JSON"):
        json_body(Header(Command.PULL, 1, 9, body="[" * 100_000))


def test_a_pull_and_a_shared_memory_message_name_their_parts_without_data_frames():
    from pskv.protocol import Flag

    pull = Header(Command.PULL, 5, 9, (ArraySpec(3, "float32", (4,), 8, 2),), 1)
    got, buffers = decode(encode(pull))
    assert got == pull and buffers == []
    shm_reply = Header(Command.REPLY, 5, 8, (ArraySpec(3, "float32", (4,), 8, 7, buffer=1),), flags=Flag.SHM)
    got, buffers = decode(encode(shm_reply))
    assert got.arrays[0].buffer == 1 and got.flags == Flag.SHM and buffers == []
    with pytest.raises(ProtocolError, match="PULL names its parts without data"):
        decode([*encode(pull), GOOD_FRAME])
    huge = Header(Command.PULL, 5, 9, (ArraySpec(3, "float32", (2**40,)),))
    with pytest.raises(ProtocolError, match="exceeds the frame limit"):
        decode(encode(huge))  # a named part is bounded like a frame, though no frame follows


def test_the_data_path_carries_no_body():  # INIT's may name its str keys (protocol.bodies.InitBody)
    for command in (Command.PUSH, Command.PULL, Command.PUSHPULL):
        with pytest.raises(ProtocolError, match="carries no body"):
            decode(encode(Header(command, 1, 9, body='{"quiet": true}')))


def test_the_rows_encoding_round_trips_and_its_frames_are_exact():
    """Flag.ROWS: a spec (n, w) names n rows of w elements; a push's frame is the n int64 ids then
    the rows, a pull's the ids alone; any other length, shape or command is refused."""
    from pskv.protocol import rows_frame, split_rows
    ids = np.array([2, 5, 9], np.int64)
    rows = np.arange(6, dtype=np.float32).reshape(3, 2)
    push = Header(Command.PUSH, 1, 9, (ArraySpec(7, "float32", (3, 2), 4, 1),), flags=Flag.ROWS)
    header, buffers = decode(encode(push, [rows_frame(ids, rows)]))
    got_ids, got_rows = split_rows(header.arrays[0], buffers[0])
    assert got_ids.tolist() == [2, 5, 9] and np.array_equal(got_rows, rows)
    pull = Header(Command.PULL, 2, 9, (ArraySpec(7, "float32", (3, 2), 4, 1),), flags=Flag.ROWS)
    assert not pull.named_parts
    header, buffers = decode(encode(pull, [rows_frame(ids)]))
    assert split_rows(header.arrays[0], buffers[0], ids_only=True)[0].tolist() == [2, 5, 9]
    with pytest.raises(ProtocolError, match="3 rows of 2 float32 need 48 bytes, frame has 24"):
        decode(encode(push, [rows_frame(ids)]))
    with pytest.raises(ProtocolError, match=r"\(ids only\) need 24 bytes, frame has 48"):
        decode(encode(pull, [rows_frame(ids, rows)]))
    with pytest.raises(ProtocolError, match="shape \\(rows, row width\\)"):
        decode(encode(push._replace(arrays=(ArraySpec(7, "float32", (6,)),)), [rows.reshape(-1)]))
    present = pull._replace(arrays=(ArraySpec(7, "float32", (0, 2), 4, 1),), flags=Flag.ROWS | Flag.PRESENT)
    assert decode(encode(present, [rows_frame(ids[:0])]))[0].flags & Flag.PRESENT
    with pytest.raises(ProtocolError, match="PULL of present rows: its specs name no rows"):
        decode(encode(pull._replace(flags=Flag.ROWS | Flag.PRESENT), [rows_frame(ids)]))
    with pytest.raises(ProtocolError, match="the PRESENT flag needs a PULL with the ROWS flag"):
        decode(encode(push._replace(flags=Flag.ROWS | Flag.PRESENT), [rows_frame(ids, rows)]))
    for command, flags in ((Command.PUSHPULL, Flag.ROWS), (Command.PUSHPULL, Flag.ROWS | Flag.SHM)):
        with pytest.raises(ProtocolError, match="the ROWS flag needs"):
            decode(encode(push._replace(command=command, flags=flags), [rows_frame(ids, rows)]))
