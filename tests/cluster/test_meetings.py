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


# -- an elastic job's views (pskv/cluster/elastic.py) --------------------------------------------
def elastic(min_workers: int = 1, slots=(0, 1)):
    """Meetings of an elastic job of worker ``slots``, and what they send, and whom the views admitted."""
    from pskv.cluster.elastic import ElasticViews
    from pskv.config import ClusterConfig

    sent: list[tuple[bytes, Header]] = []
    admitted: list[tuple[bytes, int]] = []
    send = lambda identity, frames: sent.append((identity, decode(frames)[0]))  # noqa: E731
    views = ElasticViews(ClusterConfig(num_workers=len(slots), min_workers=min_workers, max_workers=4), send,
                         lambda identity, header, slot: admitted.append((identity, slot)), clock=lambda: 0.0)
    views.start(slots)
    registered = {node_id(Role.WORKER, s) for s in slots} | {node_id(Role.WORKER, 2)}
    m = Meetings(send, lambda nid: Role.WORKER, lambda nid: views.rank(nid, -1),
                 lambda group: views.members(registered), lambda nid: False, lambda: set(), views)
    return m, views, sent, admitted


def meet(m: Meetings, nid: int, name: str, seq: int, epoch: int, request: int = 1) -> None:
    body = Barrier(int(Role.WORKER), name, seq, 300.0, epoch=epoch)
    m.arrive(b"w%d" % nid, Header(Command.BARRIER, request, nid, body=body.encode()), nid, body)


W2 = node_id(Role.WORKER, 2)


def test_a_meeting_of_another_view_fails_with_membership_changed_error_at_once():
    m, views, sent, _ = elastic()
    meet(m, W0, "barrier", 1, epoch=views.epoch() + 1)
    assert [(who, kind) for who, kind, _ in errors(sent)] == [(b"w%d" % W0, "MembershipChangedError")]
    assert "barrier#1 is of view 2, and the job is in view 1" in errors(sent)[0][2]


def test_a_departure_fails_the_open_meeting_with_the_new_view_and_meetings_are_counted_anew():
    m, views, sent, _ = elastic()
    m.mismatch(3, TEXT)  # a report about meeting 3 of view 1
    meet(m, W0, "barrier", 1, epoch=1)
    views.depart(W1, "missed heartbeats for 10 s")
    m.settle()
    [(who, kind, text)] = errors(sent)
    assert (who, kind) == (b"w%d" % W0, "MembershipChangedError")
    assert text.startswith("the workers changed under this call: barrier#1 is of view 1, and the job is in view 2: "
                           "slots 0 (W=1) from commit 0 (failure: slot 1 missed heartbeats for 10 s); the work since")
    sent.clear()
    for seq in (1, 2, 3):  # view 2 counts from 1 again; the old report is gone with its view
        meet(m, W0, "barrier", seq, epoch=2, request=seq + 1)
    assert errors(sent) == [] and [h.command for _, h in sent] == [Command.REPLY] * 3


def test_a_commits_release_admits_the_joiner_and_hands_every_member_the_same_view():
    from pskv.protocol.bodies import Met, Register, View

    m, views, sent, admitted = elastic()
    joiner = Header(Command.REGISTER, 9, 0, body=Register("worker", "", 2).encode())
    assert views.join(b"joiner", joiner, Register.parse(joiner), assembled=True) and admitted == []
    for nid in (W0, W1):
        meet(m, nid, "commit", 1, epoch=1)
    assert admitted == [] and len(sent) == 2  # the first meeting makes no commit
    for nid in (W0, W1):
        meet(m, nid, "committed", 2, epoch=1, request=2)
    released = {Met.parse(h).view for _, h in sent[2:]}
    assert released == {View(2, (0, 1, 2), 1, "grow")} and admitted == [(b"joiner", 2)]
    sent.clear()
    for nid in (W0, W1, W2):  # the three meet in view 2, the joiner at rank 2
        meet(m, nid, "barrier", 1, epoch=2, request=3)
    assert [h.command for _, h in sent] == [Command.REPLY] * 3 and views.rank(W2, -1) == 2


def test_below_min_a_meeting_is_held_until_the_job_fails():
    m, views, sent, _ = elastic(min_workers=2)
    views.depart(W1, "exited (the launcher's report)")
    m.settle()
    meet(m, W0, "barrier", 1, epoch=2)
    assert sent == []  # W0 is every member, but the view is below MIN: held
    m.fail_all("NodeFailedError", "only 1 of at least 2 workers for 600 s (PSKV_ELASTIC_TIMEOUT)")
    assert errors(sent) == [(b"w%d" % W0, "NodeFailedError",
                             "only 1 of at least 2 workers for 600 s (PSKV_ELASTIC_TIMEOUT)")]


def test_below_min_a_joiner_is_admitted_at_once_and_the_held_meeting_fails_with_the_refill_view():
    from pskv.protocol.bodies import Register

    m, views, sent, admitted = elastic(min_workers=2)
    views.depart(W1, "exited (the launcher's report)")
    m.settle()
    meet(m, W0, "barrier", 1, epoch=2)
    joiner = Header(Command.REGISTER, 9, 0, body=Register("worker", "", 2).encode())
    views.join(b"joiner", joiner, Register.parse(joiner), assembled=True)
    m.settle()
    assert admitted == [(b"joiner", 2)] and views.current().members == (0, 2) and views.current().voids
    [(_, kind, text)] = errors(sent)
    assert kind == "MembershipChangedError" and "view 3: slots 0,2 (W=2) from commit 0 (refill: slot 2)" in text


def test_a_slot_the_view_removed_cannot_meet_in_it():
    m, views, sent, _ = elastic()
    views.depart(W1, "missed heartbeats for 10 s")  # W1 was only slow: it hears of view 2 and comes
    m.settle()
    meet(m, W1, "barrier", 1, epoch=2)
    [(_, kind, text)] = errors(sent)
    assert kind == "MembershipChangedError" and "worker 1 is not a member of view 2: slots 0 (W=1)" in text


def test_rank_0_posting_a_new_name_each_time_keeps_only_the_recent_names():
    from pskv.cluster import meetings as module

    m, sent = meetings()
    for n in range(module._KEPT_POSTS * 4):  # (was: one entry per name, never dropped)
        body = Barrier(int(Role.WORKER), f"call{n}", 1, 300.0, mode="post", nth=1)
        m.arrive(b"w0", Header(Command.BARRIER, n + 1, W0, body=body.encode()), W0, body)
    assert errors(sent) == [] and len(sent) == module._KEPT_POSTS * 4
    assert len(m._posted) == module._KEPT_POSTS and len(m._posts) == module._KEPT_POSTS
    assert next(iter(m._posted)) == f"call{module._KEPT_POSTS * 3}"  # the least recent went first
    body = Barrier(int(Role.WORKER), f"call{module._KEPT_POSTS * 4 - 1}", 1, 300.0, mode="read", nth=1)
    m.arrive(b"w1", Header(Command.BARRIER, 1, W1, body=body.encode()), W1, body)
    assert errors(sent) == [] and len(sent) == module._KEPT_POSTS * 4 + 1  # a recent one is still read
