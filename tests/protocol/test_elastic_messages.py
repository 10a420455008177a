"""An elastic job's wire: the header's view epoch, the View / Roster / Commit / KeyTable bodies, and
MembershipChangedError (issue 24, step 1)."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings

import pskv
from pskv.errors import MembershipChangedError, ProtocolError
from pskv.protocol import MAX_EPOCH, MAX_SLOTS, ArraySpec, Command, Header, decode, encode
from pskv.protocol.bodies import (
    MAX_KEY_NAME,
    MAX_KEY_PARTS,
    Barrier,
    Commit,
    Failure,
    KeyPart,
    KeysRequest,
    KeyTable,
    Liveness,
    Met,
    NodeTable,
    Roster,
    View,
)
from pskv.protocol.codec import PEEK_BYTES, decode_arrays, decode_head
from pskv.testing import fuzz

TOKEN = "ab" * 32


def fields_of(frames) -> list:
    return msgpack.unpackb(bytes(frames[0]), raw=False)


def with_body(command: Command, body: str) -> Header:
    return decode(encode(Header(command, 1, 9, body=body)))[0]


# -- the header's epoch ------------------------------------------------------------------------
def test_epoch_0_is_not_on_the_wire_and_a_view_epoch_is_the_ninth_field():
    plain = Header(Command.PUSH, 3, 9, (ArraySpec(5, "float32", (2, 1)),))  # 2-D: a msgpack header
    frames = encode(plain, [np.zeros(2, np.float32)])
    assert len(fields_of(frames)) == 8 and decode(frames)[0].epoch == 0
    stamped = plain._replace(epoch=7)
    frames = encode(stamped, [np.zeros(2, np.float32)])
    assert fields_of(frames)[8] == 7
    assert decode(frames)[0] == stamped
    head, specs = decode_head(frames)
    assert head.epoch == 7 and decode_arrays(head, specs, frames)[0] == stamped
    compact = Header(Command.PUSH, 3, 9, (ArraySpec(5, "float32", (2,)),), epoch=7)  # the compact form's field
    frames = encode(compact, [np.zeros(2, np.float32)])
    assert bytes(frames[0][:1]) == b"\xc1" and decode(frames)[0] == compact


def test_a_long_header_read_in_two_halves_keeps_its_epoch():
    arrays = tuple(ArraySpec(k, "float32", (1, 1)) for k in range(PEEK_BYTES // 8))  # 2-D: msgpack
    header = Header(Command.PULL, 3, 9, arrays, epoch=2**40)  # a pull names its parts: no data frames
    frames = encode(header)
    head, specs = decode_head(frames)
    assert specs is None and head.sender == 9  # peeked: the sender is known before the specs are read
    assert decode_arrays(head, specs, frames)[0] == header


@pytest.mark.parametrize("epoch", [0, -1, "1", 1.0, [], 2**63, MAX_EPOCH + 1])
def test_a_bad_epoch_is_refused(epoch):
    with pytest.raises(ProtocolError, match="field epoch must be a view epoch"):
        decode([fuzz.raw_header(Command.HEARTBEAT, epoch=epoch)])


def test_a_header_of_ten_fields_is_refused_with_the_old_words():
    with pytest.raises(ProtocolError, match="8-field list"):
        decode([fuzz.pack([*fuzz.header_fields(Command.HEARTBEAT), 1, 2])])


@settings(max_examples=100, deadline=None)
@given(fuzz.message_strategy())
def test_fuzzed_messages_with_epochs_are_decoded_or_refused(frames):
    try:
        header, _ = decode(frames)
    except ProtocolError:
        return
    assert 0 <= header.epoch <= MAX_EPOCH


@pytest.mark.parametrize("command", [Command.COMMIT, Command.KEYS, Command.ROSTER])
def test_the_elastic_commands_round_trip(command):
    header = Header(command, 4, 9, body="{}", epoch=3)
    assert decode(encode(header))[0] == header


# -- bodies ------------------------------------------------------------------------------------
VIEW = View(5, (0, 2, 7), 19, "grow")


def test_views_travel_in_the_registration_reply_the_heartbeat_reply_and_a_meetings_release():
    table = NodeTable(9, 0, ("tcp://a:1",), (None,), 1, 3, token=TOKEN, view=VIEW)
    assert NodeTable.parse(with_body(Command.REPLY, table.encode())) == table
    alive = Liveness((), {9: 0.5}, view=VIEW)
    assert Liveness.parse(with_body(Command.REPLY, alive.encode())) == alive
    met = Met("r", view=VIEW)
    assert Met.parse(with_body(Command.REPLY, met.encode())) == met
    # no view: nothing on the wire, as before
    assert "view" not in Met().encode() and "view" not in Liveness((), {}).encode()
    assert NodeTable.parse(with_body(Command.REPLY, table._replace(view=None).encode())).view is None


def test_a_view_names_ranks_and_whether_it_voids():
    assert VIEW.rank_of(7) == 2 and VIEW.rank_of(1) == -1
    assert not VIEW.voids and View(6, (0,), 19, "failure").voids and View(6, (0,), 19, "refill").voids


@pytest.mark.parametrize("view", [
    {"epoch": 0, "members": [0], "commit": 0, "cause": "start"},
    {"epoch": 1, "members": [0, 0], "commit": 0, "cause": "start"},
    {"epoch": 1, "members": [MAX_SLOTS], "commit": 0, "cause": "start"},
    {"epoch": 1, "members": [-1], "commit": 0, "cause": "start"},
    {"epoch": 1, "members": list(range(MAX_SLOTS + 1)), "commit": 0, "cause": "start"},
    {"epoch": 1, "members": [0], "commit": -1, "cause": "start"},
    {"epoch": 1, "members": [0], "commit": 0, "cause": "whim"},
    {"epoch": 1, "members": "0", "commit": 0, "cause": "start"},
    [1, [0], 0, "start"],
])
def test_a_bad_view_is_refused(view):
    import json
    with pytest.raises(ProtocolError, match="a view must be"):
        Met.parse(with_body(Command.REPLY, json.dumps({"view": view})))


def test_a_barrier_carries_its_members_view_epoch():
    body = Barrier(4, "commit", 3, 10.0, epoch=6)
    assert Barrier.parse(with_body(Command.BARRIER, body.encode())) == body
    assert "epoch" not in Barrier(4, "barrier", 1).encode()
    with pytest.raises(ProtocolError, match="not a view epoch"):
        Barrier.parse(with_body(Command.BARRIER, '{"group": 4, "epoch": -1}'))


def test_roster_reports_round_trip_and_are_bounded():
    for report in (Roster("gone", 3, TOKEN), Roster("drain", MAX_SLOTS - 1, TOKEN)):
        assert Roster.parse(with_body(Command.ROSTER, report.encode())) == report
    for bad in ('{"op": "kill", "slot": 1}', f'{{"op": "gone", "slot": {MAX_SLOTS}}}', '{"op": "gone", "slot": -1}',
                '{"op": "gone", "slot": 1, "token": "xyz"}', '{"slot": 1}'):
        with pytest.raises(ProtocolError):
            Roster.parse(with_body(Command.ROSTER, bad))


def test_commit_and_key_tables_round_trip():
    assert Commit.parse(with_body(Command.COMMIT, Commit(2, 19).encode())) == Commit(2, 19)
    for bad in ('{"epoch": 0, "n": 1}', '{"epoch": 1, "n": 0}', '{"epoch": 1}', '{"epoch": true, "n": 1}'):
        with pytest.raises(ProtocolError, match="COMMIT"):
            Commit.parse(with_body(Command.COMMIT, bad))
    assert KeysRequest.parse(with_body(Command.KEYS, "")) == KeysRequest(0)
    assert KeysRequest.parse(with_body(Command.KEYS, KeysRequest(70000).encode())) == KeysRequest(70000)
    table = KeyTable((KeyPart(-3, 0, "float32", 10), KeyPart(8, 4096, "bfloat16", 100, 16, "emb")), next=2)
    assert KeyTable.parse(with_body(Command.REPLY, table.encode())) == table


@pytest.mark.parametrize("part", [
    [1, 0, "complex64", 4, 0, ""], [1, -1, "float32", 4, 0, ""], [1, 0, "float32", -4, 0, ""],
    [1, 0, "float32", 4, -1, ""], [1, 0, "float32", 4, 0, "x" * (MAX_KEY_NAME + 1)], [1, 0, "float32", 4, 0],
    [1.5, 0, "float32", 4, 0, ""], [2**63, 0, "float32", 4, 0, ""], "part",
])
def test_a_bad_key_part_is_refused(part):
    import json
    with pytest.raises(ProtocolError, match="KEYS reply: part 0"):
        KeyTable.parse(with_body(Command.REPLY, json.dumps({"parts": [part]})))


def test_a_key_table_page_is_bounded_before_its_parts_are_read():
    import json
    body = json.dumps({"parts": [0] * (MAX_KEY_PARTS + 1)})
    with pytest.raises(ProtocolError, match=f"at most {MAX_KEY_PARTS} parts"):
        KeyTable.parse(with_body(Command.REPLY, body))


# -- MembershipChangedError --------------------------------------------------------------------
def test_membership_changed_error_names_the_view_and_slot_and_travels_unchanged():
    exc = MembershipChangedError("worker slot 1 died (view 3)", epoch=3, slot=1)
    assert isinstance(exc, pskv.KVStoreError) and isinstance(exc, ConnectionError)
    assert pskv.MembershipChangedError is MembershipChangedError
    assert str(exc) == ("the workers changed under this call: worker slot 1 died (view 3); the work since the last "
                        "commit was voided: restore and redo")
    assert (exc.epoch, exc.slot) == (3, 1)
    relayed = Failure.of(exc)
    assert relayed.type == "MembershipChangedError"
    assert str(MembershipChangedError(relayed.message)) == str(exc)  # a peer's text is not wrapped twice
