"""Row ids at the int64 extremes (issue 28, finding 3): refused by a real server core, worker-side checks name them."""

from __future__ import annotations

import numpy as np
import pytest

from pskv import RowSparse
from pskv.config import ClusterConfig
from pskv.errors import InvalidArgumentError
from pskv.kvstore.row_ids import unique_rows
from pskv.partition import server_key
from pskv.protocol import ArraySpec, Command, Flag, Header, decode, encode, rows_frame
from pskv.protocol.bodies import Hello, InitBody, node_token
from pskv.server.core import ServerCore
from pskv.server.rows import checked_ids

W0, W1 = 9, 11  # node ids of workers 0 and 1
SECRET = "5e" * 32
KEY, ROWS, WIDTH = 5, 6, 2
TOP, BOTTOM = np.iinfo(np.int64).max, np.iinfo(np.int64).min


def _message(command: Command, request: int, spec: ArraySpec, ids, rows=None, sender: int = W0,
             body: str = "") -> list:
    frame = rows_frame(np.asarray(ids, np.int64), rows)
    return [bytes(f) for f in encode(Header(command, request, sender, (spec,), body=body, flags=Flag.ROWS), [frame])]


def _core(sent: list) -> ServerCore:
    core = ServerCore(ClusterConfig(num_servers=1, num_workers=2), lambda peer, frames: sent.append((peer, frames)),
                      lambda: 8, lambda: "server 0", lambda: 0, lambda: SECRET)
    for conn, node in ((b"w0", W0), (b"w1", W1)):
        hello = Hello(f"{node:016x}", node_token(SECRET, node)).encode()
        core.handle(conn, [bytes(f) for f in encode(Header(Command.HELLO, 10**9, node, body=hello))])
    return core


def _push(request: int, ids, number: int, sender: int) -> list:
    ids = np.asarray(ids, np.int64)
    rows = np.ones((ids.size, WIDTH), np.float32)
    return _message(Command.PUSH, request, ArraySpec(KEY, "float32", (ids.size, WIDTH), 0, number), ids, rows, sender)


def test_a_push_of_ids_at_the_int64_extremes_is_refused_and_the_key_keeps_working():
    sent: list = []
    core = _core(sent)
    init = np.arange(ROWS * WIDTH, dtype=np.float32).reshape(ROWS, WIDTH)
    body = InitBody((), ((ROWS, None),)).encode()
    core.handle(b"w0", _message(Command.INIT, 1, ArraySpec(KEY, "float32", (ROWS, WIDTH), 0, 0), np.arange(ROWS),
                                init, body=body))
    assert decode(sent[-1][1])[0].command is Command.REPLY
    [part] = core.shard.parts.values()
    before = part.value.copy()
    sent.clear()
    core.handle(b"w1", _push(2, [0, TOP, BOTTOM], 1, W1))
    [(_, frames)] = sent
    header = decode(frames)[0]
    assert header.command is Command.ERROR
    assert f"key {KEY}" in header.body and "worker 1" in header.body and str(BOTTOM) in header.body
    np.testing.assert_array_equal(part.value, before)  # refused: nothing zeroed, nothing queued
    sent.clear()
    core.handle(b"w0", _push(3, [1, 4], 1, W0))  # the honest worker's push is taken
    core.handle(b"w0", _message(Command.PULL, 4, ArraySpec(KEY, "float32", (1, WIDTH), 0, 1), [1]))
    replies = [decode(f)[0] for _, f in sent]
    assert [h.command for h in replies] == [Command.REPLY, Command.ERROR]  # round 1 fails at once, by its sender
    assert "worker 1" in replies[1].body and "InvalidArgumentError" in replies[1].body
    sent.clear()
    core.handle(b"w1", _push(5, [4], 2, W1))  # round 2: the refused push held worker 1's place in round 1 (void)
    assert [decode(f)[0].command for _, f in sent] == [Command.REPLY]
    sent.clear()
    core.handle(b"w0", _push(6, [1, 4], 2, W0))  # completes round 2: the key works again
    core.handle(b"w0", _message(Command.PULL, 7, ArraySpec(KEY, "float32", (3, WIDTH), 0, 2), [0, 1, 4]))
    [(_, ack), (_, frames)] = sent
    assert decode(ack)[0].command is Command.REPLY
    header, buffers = decode(frames)
    assert header.command is Command.REPLY
    got = np.frombuffer(bytes(buffers[0]), np.uint8)[3 * 8:].view(np.float32).reshape(3, WIDTH)
    assert got[:, 0].tolist() == [0, 1, 2]  # no updater: the round's sum replaced the value

def test_the_init_of_a_str_key_names_it_in_its_errors_not_its_server_key():
    """INIT carries the names of its str keys: its row ids and a second init name the key as the user wrote it."""
    sent: list = []
    core = _core(sent)
    key = server_key("emb")
    spec = ArraySpec(key, "float32", (2, WIDTH), 0, 0)
    rows, body = np.ones((2, WIDTH), np.float32), InitBody(("emb",), ((ROWS, None),)).encode()
    core.handle(b"w0", _message(Command.INIT, 1, spec, [1, ROWS], rows, body=body))
    header = decode(sent[-1][1])[0]
    assert header.command is Command.ERROR
    assert f"init of row-sparse key 'emb' (server key {key}) from worker 0: row ids [{ROWS}] outside" in header.body
    core.handle(b"w0", _message(Command.INIT, 2, spec, [1, 2], rows, body=body))
    assert decode(sent[-1][1])[0].command is Command.REPLY
    core.handle(b"w1", _message(Command.INIT, 3, spec, [1, 2], rows, sender=W1, body=body))
    header = decode(sent[-1][1])[0]
    assert header.command is Command.ERROR and f"duplicate init of key 'emb' (server key {key})" in header.body
    push = ArraySpec(key, "float32", (1, WIDTH), 0, 1)  # a push's row ids: named the same way
    core.handle(b"w1", _message(Command.PUSH, 4, push, [ROWS], np.ones((1, WIDTH), np.float32), sender=W1))
    header = decode(sent[-1][1])[0]
    assert header.command is Command.ERROR
    assert f"push of row-sparse key 'emb' (server key {key}) from worker 1: row ids [{ROWS}] outside" in header.body


@pytest.mark.parametrize("ids", [[0, TOP, BOTTOM], [BOTTOM, 0], [TOP, BOTTOM], [3, BOTTOM + 2]])
def test_checked_ids_compare_without_wrapping(ids):
    with pytest.raises(InvalidArgumentError, match="push of row-sparse key 7"):
        checked_ids(np.array(ids, np.int64), 0, 10, "push of row-sparse key 7 from worker 1")


def test_checked_ids_name_the_offending_value():
    with pytest.raises(InvalidArgumentError, match=f"{TOP} is followed by {BOTTOM}"):
        checked_ids(np.array([0, TOP, BOTTOM], np.int64), 0, 10, "push of row-sparse key 7 from worker 1")
    with pytest.raises(InvalidArgumentError, match=rf"row ids \[{TOP}\] outside"):
        checked_ids(np.array([1, TOP], np.int64), 0, 10, "push")
    with pytest.raises(InvalidArgumentError, match=rf"row ids \[{BOTTOM}\] outside"):
        checked_ids(np.array([BOTTOM], np.int64), 2**70, 10, "push")


def test_worker_side_row_ids_beyond_int64_are_refused_by_their_value():
    big = np.array([1, 2**63, 2**64 - 1], np.uint64)
    with pytest.raises(InvalidArgumentError, match=str(2**64 - 1)):
        unique_rows("k", big, 10)
    with pytest.raises(InvalidArgumentError, match="1e"):
        unique_rows("k", np.array([1.0, 1e19]), 10)
    with pytest.raises(InvalidArgumentError, match=str(2**63)):
        RowSparse(big, np.ones((3, 2), np.float32), (10, 2))
