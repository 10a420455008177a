"""Meetings.mismatch (pskv/cluster/meetings.py): a server's report that a meeting cannot complete fails it."""

from __future__ import annotations

from pskv.cluster.meetings import Meetings
from pskv.protocol import Command, Header, Role, decode, node_id
from pskv.protocol.bodies import Barrier, ErrorReply

W0, W1 = node_id(Role.WORKER, 0), node_id(Role.WORKER, 1)
TEXT = "mismatched step counts: worker 1 is ahead: ..."


def meetings():
    sent: list[tuple[bytes, Header]] = []
    m = Meetings(lambda identity, frames: sent.append((identity, decode(frames)[0])), lambda nid: Role.WORKER,
                 lambda nid: 0 if nid == W0 else 1, lambda group: {W0, W1}, lambda nid: False, lambda: set())
    return m, sent


def arrive(m: Meetings, nid: int, seq: int, request: int = 1) -> None:
    body = Barrier(int(Role.WORKER), "barrier", seq, 300.0)
    m.arrive({W0: b"w0", W1: b"w1"}[nid], Header(Command.BARRIER, request, nid, body=body.encode()), nid, body)


def errors(sent: list[tuple[bytes, Header]]) -> list[tuple[bytes, str, str]]:
    return [(who, *ErrorReply.parse(h)[:2]) for who, h in sent if h.command is Command.ERROR]


def test_a_member_waiting_at_the_meeting_fails_at_once_with_the_servers_text():
    m, sent = meetings()
    arrive(m, W0, 4)
    m.mismatch(4, TEXT)
    assert errors(sent) == [(b"w0", "CollectiveMismatchError", TEXT)]


def test_a_member_that_arrives_after_the_report_fails_too_and_other_meetings_do_not():
    m, sent = meetings()
    m.mismatch(4, TEXT)  # the server acted on worker 0's mark, sent before its BARRIER
    arrive(m, W0, 4)
    arrive(m, W1, 4)
    assert errors(sent) == [(b"w0", "CollectiveMismatchError", TEXT), (b"w1", "CollectiveMismatchError", TEXT)]
    sent.clear()
    arrive(m, W0, 5, request=2)
    arrive(m, W1, 5, request=2)
    assert errors(sent) == [] and [h.command for _, h in sent] == [Command.REPLY, Command.REPLY]
