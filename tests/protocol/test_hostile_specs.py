"""A stranger's header, refused by the codec as a ProtocolError with a short text: dimensions NumPy cannot hold
(beyond int64, or a huge shape with a zero dimension) and values of any length repeated in the error."""

from __future__ import annotations

import pytest

from pskv.errors import ProtocolError
from pskv.protocol import PROTOCOL_VERSION, Command, Flag, decode, frame_array, split_rows
from pskv.testing import fuzz

FLOAT32 = fuzz.dtype_code("float32")
GOOD = [PROTOCOL_VERSION, int(Command.REPLY), 1, 9, 0, "", [[3, FLOAT32, [0, 5], 0, 0]], 0]
LONG = 65_000  # a header this long is within every limit


def _with(spec, flags=0):
    return [*GOOD[:6], [spec], flags]


@pytest.mark.parametrize("spec,flags,match", [
    ([3, FLOAT32, [0, 2**64 - 1], 0, 0], 0, "bad shape"),  # beyond int64: numpy raised a ValueError
    ([3, FLOAT32, [2**63, 0], 0, 0], 0, "bad shape"),
    ([3, FLOAT32, [0, 2**62, 2**62], 0, 0], 0, r"shape \(0, \d+, \d+\) float32 exceeds the frame limit"),
    ([3, FLOAT32, [0, 2**63 - 1], 0, 0], 0, "exceeds the frame limit"),
    ([3, FLOAT32, [0, 2**63 - 1], 0, 0], Flag.ROWS, "exceeds the frame limit"),  # rows of an impossible width
])
def test_a_shape_numpy_cannot_hold_is_refused_even_without_elements(spec, flags, match):
    with pytest.raises(ProtocolError, match=match):
        decode([fuzz.pack(_with(spec, flags)), b""])


def test_shapes_with_a_zero_dimension_within_the_limit_still_pass():
    header, buffers = decode([fuzz.pack(GOOD), b""])
    assert frame_array(header.arrays[0], buffers[0]).shape == (0, 5)
    header, buffers = decode([fuzz.pack(_with([3, FLOAT32, [0, 1 << 20], 0, 0], Flag.ROWS)), b""])
    ids, rows = split_rows(header.arrays[0], buffers[0])
    assert ids.size == 0 and rows.shape == (0, 1 << 20)


@pytest.mark.parametrize("fields,frames,start", [
    (["A" * LONG, *GOOD[1:]], 1, "protocol version 'AAA"),
    ([PROTOCOL_VERSION, "B" * LONG, *GOOD[2:]], 1, "unknown command 'BBB"),
    ([PROTOCOL_VERSION, int(Command.PUSH), "1" * LONG, *GOOD[3:]], 1, "field request must be a 64-bit int"),
    ([*GOOD[:7], "f" * LONG], 1, "flags 'fff"),
    ([*GOOD, "e" * LONG], 1, "field epoch must be a view epoch"),
    ([*GOOD[:6], [[3, "c" * LONG, [2], 0, 0]], 0], 1, "array 0 (key 3): dtype code 'ccc"),
    ([*GOOD[:6], [[3, FLOAT32, [2], 0, 0, "b" * LONG]], 0], 1, "array 0: shared buffer index 'bbb"),
    ([*GOOD[:6], [[3, FLOAT32, [-1] * 10_000, 0, 0]], 0], 1, "array 0 (key 3): bad shape [-1, -1"),
    ([*GOOD[:6], [[3, FLOAT32, ["s" * LONG], 0, 0]], 0], 1, "array 0 (key 3): bad shape ['sss"),
    ([*GOOD[:2], 1, 9, 0, "", [[3, FLOAT32, [1, 2], 0, 0, "o" * LONG]], Flag.ROWS | Flag.SHM], 0,
     "array 0: shared rows offset 'ooo"),
])
def test_a_peers_long_value_is_cut_short_in_the_error(fields, frames, start):
    """The receiver logs each refusal: a 65 kB value used to be repeated whole, per message."""
    with pytest.raises(ProtocolError) as refused:
        decode([fuzz.pack(fields), *[b""] * frames])
    text = str(refused.value)
    assert text.startswith(start) and len(text) < 200, text[:300]


def test_a_long_value_that_fits_is_shown_whole():
    with pytest.raises(ProtocolError, match=r"protocol version 'AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA' not"):
        decode([fuzz.pack(["A" * 38, *GOOD[1:]]), b""])
