"""A server's reply compression (both_ways) in its checkpoint file: written with the shard, read back
exactly, every entry checked against the part it claims; restored into the server's ReplyCompression."""

from __future__ import annotations

import numpy as np
import pytest

from pskv.compression import create
from pskv.errors import CheckpointError
from pskv.server.snapshot import PartState, ReplyState, ShardState, read_shard, write_shard

TWO_BIT = create({"type": "2bit", "threshold": 0.5})


def shard(replies) -> ShardState:
    parts = (PartState(7, 0, "float32", np.arange(10, dtype=np.float32), 3),
             PartState(9, 0, "float64", np.zeros(4), 3))
    return ShardState(0, 1, 2, True, parts, None, replies)


def reply(size: int = 10, payload: int | None = None, key: int = 7) -> ReplyState:
    residual = np.linspace(-0.4, 0.4, size, dtype=np.float32)
    return ReplyState(key, 0, 3, TWO_BIT.params, np.arange(payload or TWO_BIT.payload_bytes(10), dtype=np.uint8),
                      residual)


def test_reply_residuals_are_written_and_read_back_exactly(tmp_path):
    write_shard(tmp_path, shard((reply(),)))
    got = read_shard(tmp_path, 0).replies
    assert got is not None and len(got) == 1
    (r,) = got
    assert (r.key, r.offset, r.round, r.compression) == (7, 0, 3, TWO_BIT.params)
    assert np.array_equal(r.residual, reply().residual) and np.array_equal(r.payload, reply().payload)


def test_a_file_without_the_entry_predates_reply_residuals(tmp_path):
    write_shard(tmp_path, shard(None))
    assert read_shard(tmp_path, 0).replies == ()  # written now: an empty list, not "unknown"


@pytest.mark.parametrize(("bad", "match"), [
    (reply(size=11), r"do not fit its 10 values \(float32\[10\], uint8\[3\]\)"),
    (reply(payload=4), r"do not fit its 10 values"),
    (reply(key=8), "names key 8 offset 0, which the file does not hold"),
])
def test_a_reply_residual_that_does_not_fit_its_part_is_refused_naming_it(tmp_path, bad, match):
    write_shard(tmp_path, shard((bad,)))
    with pytest.raises(CheckpointError, match=match):
        read_shard(tmp_path, 0)
