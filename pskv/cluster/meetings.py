"""Collective meetings at the scheduler: named barriers that carry every worker's outcome.

A worker's collective (``barrier``, ``init``, ``broadcast``, ``set_optimizer``,
``save_checkpoint``, ``join``, ...) is a *meeting* of a node group (a ``BARRIER``
request, :class:`~pskv.protocol.bodies.Barrier`):

* **name and count**: each member names its collective and counts its meetings
  (``seq``; 0: not counted, as in a replacement process). Members that differ in either
  are in different collectives: every member there fails at once with
  CollectiveMismatchError naming each one's call, and a member that arrives later at
  that failed meeting gets the same error;
* **failure**: a member reports its failure in the collective so far; when all met,
  every member learns who failed (:class:`~pskv.protocol.bodies.Met`) and raises;
* **rank 0's result** (``result``) is handed to every member when all met;
* **init agreement**: members that describe keys (``agree`` / ``digest``: shape and
  dtype per key) must describe each key alike, or every member fails with
  InitMismatchError naming the key and what each worker said;
* **posts and reads**: a call rank 0 may make alone (``save_optimizer_states``) is no
  meeting: rank 0 *posts* its outcome of its ``nth`` call of a name since its meeting
  ``seq`` (answered at once), another worker that makes the call *reads* it (answered
  once posted). Rank 0 meeting instead, while others read, is a mismatch.

A meeting fails with NodeFailedError when a member is dead for good or left the job,
and with OperationTimeoutError, before the member's own timeout, naming who did not
arrive; with CollectiveMismatchError when a server reports that a worker is in a sync round
that a worker at the meeting never pushed (mismatched step counts: :meth:`Meetings.mismatch`). A released member's reply is kept, so a repeat of its request (a reset
connection) gets the same answer. :class:`Meetings` holds this state and does no I/O:
the scheduler (:mod:`pskv.cluster.scheduler`) hands it requests, node facts and a
``send`` callable, and calls :meth:`Meetings.settle` when a node dies or leaves.

In an elastic job (:mod:`pskv.cluster.elastic`) the members are the view's, rank 0 is the view's,
and meetings are counted per view: a worker's meeting of another view than the job's, and every
meeting open when the view changes, fails with MembershipChangedError naming the new view; a
commit's release carries the next view (:attr:`Met.view`); below MIN meetings are held.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Set
from dataclasses import dataclass
from typing import Any

from pskv.cluster.elastic import FIXED, FixedViews
from pskv.errors import MembershipChangedError
from pskv.protocol import SCHEDULER_ID, Header, Role, node_name
from pskv.protocol.bodies import Barrier, Failure, Met
from pskv.protocol.replies import error_frames, reply_frames

__all__ = ["Meetings", "Send"]

Send = Callable[[bytes, list[Any]], None]  # (a node's connection identity, frames)


@dataclass
class _Arrival:
    """A member waiting at a meeting (or for rank 0's posted outcome): its request and what it said."""

    identity: bytes
    header: Header
    meeting: Barrier
    deadline: float  # monotonic; inf when it gave no timeout
    posts_seen: int = 0  # a read: how many outcomes rank 0 had posted under its name when it came


class Meetings:
    """The meetings under way, the failed ones, and rank 0's posted outcomes (no I/O of its own).

    Args:
        send: delivers frames to a node's connection.
        role: a registered node's role.
        rank: a registered node's rank.
        members: the registered nodes of a group (a mask of role bits).
        lost: True for a node that is dead and will not be replaced (no recovery, or its window closed).
        left: the workers that left the job (``SHUTDOWN``).
        views: an elastic job's views (:class:`~pskv.cluster.elastic.ElasticViews`); the default, none.
    """

    def __init__(self, send: Send, role: Callable[[int], Role], rank: Callable[[int], int],
                 members: Callable[[int], set[int]], lost: Callable[[int], bool],
                 left: Callable[[], Set[int]], views: FixedViews = FIXED) -> None:
        self._views = views
        self._epoch = views.epoch()  # the view the meetings under way belong to
        self._send = send
        self._role = role
        self._rank = rank
        self._members = members
        self._lost = lost
        self._left = left
        self._barriers: dict[int, dict[int, _Arrival]] = {}  # group -> node -> its arrival
        self._broken: dict[int, tuple[str, set[int]]] = {}  # group -> mismatch message, members told
        self._posts: dict[tuple[str, int, int], Failure | None] = {}  # rank 0's outcomes of calls it may make alone
        self._posted: dict[str, tuple[int, int, int, Failure | None]] = {}  # name -> last (meeting, nth), posts, outcome
        self._readers: dict[int, _Arrival] = {}  # node -> its read of such an outcome
        self._released: dict[int, tuple[int, list[Any]]] = {}  # node -> (request id, reply) of its last meeting
        self._mismatched: dict[int, str] = {}  # meeting count -> why it cannot complete (a server's report)

    def settle(self) -> None:
        """A node died, was given up on, or left (or the view changed): the meetings and reads that need it
        fail now."""
        self._follow_view()
        for group in list(self._barriers):
            self._settle_barrier(group)

    def mismatch(self, seq: int, text: str) -> None:
        """A server found that meeting ``seq`` cannot complete: a worker is in a sync round that a
        worker at the meeting never pushed (mismatched step counts, :mod:`pskv.server.steps`).

        Every member waiting at it gets CollectiveMismatchError ``text`` now, and so does a member
        that arrives at it later (the report may come first: the server acts on the member's mark,
        sent before its request here). A meeting that completed already is left alone (the round
        fails on the servers).
        """
        self._mismatched[seq] = text
        while len(self._mismatched) > _KEPT_POSTS:
            del self._mismatched[next(iter(self._mismatched))]
        for arrived in self._barriers.values():
            for nid in [n for n, a in arrived.items() if a.meeting.seq == seq and not a.meeting.mode]:
                self._fail_mismatched(nid, arrived.pop(nid), text)

    def _fail_mismatched(self, nid: int, a: _Arrival, text: str) -> None:
        frames = error_frames(a.header, SCHEDULER_ID, "CollectiveMismatchError", text)
        self._released[nid] = (a.header.request, frames)
        self._send(a.identity, frames)

    def forget(self, nid: int) -> None:
        """A replacement process took over ``nid``: the old one may have died inside a meeting."""
        for arrived in self._barriers.values():
            arrived.pop(nid, None)

    def arrive(self, identity: bytes, header: Header, nid: int, meeting: Barrier) -> None:
        """``nid`` arrives at a meeting of ``meeting.group`` (or posts / reads rank 0's outcome of a call).

        A meeting whose members name different collectives, or different counts of their
        meetings, fails on every member at once (:meth:`_mismatch`); members that had not
        arrived get the same error when they do.
        """
        released = self._released.get(nid)
        if released is not None and released[0] == header.request:  # a repeat (reset connection) of one released
            self._send(identity, released[1])
            return
        group = meeting.group
        if not int(self._role(nid)) & group:
            self._send(identity, error_frames(header, SCHEDULER_ID, "InvalidArgumentError",
                                              f"{node_name(nid)} is not in barrier group {group}"))
            return
        arrival = _Arrival(identity, header, meeting, time.monotonic() + meeting.timeout if meeting.timeout else math.inf)
        self._follow_view()
        if self._role(nid) is Role.WORKER and (meeting.epoch != self._epoch or (  # a call of another view
                self._views.elastic and nid not in self._meeting_members(group))):  # or of a slot it removed
            self._changed(nid, arrival)
            return
        if meeting.mode:
            self._post_or_read(nid, arrival)
            return
        if meeting.seq in self._mismatched:  # a server found that this meeting cannot complete
            self._fail_mismatched(nid, arrival, self._mismatched[meeting.seq])
            return
        broken = self._broken.get(group)
        if broken is not None and nid not in broken[1]:  # the meeting it was late for failed
            broken[1].add(nid)
            self._send(identity, error_frames(header, SCHEDULER_ID, "CollectiveMismatchError", broken[0]))
            if self._meeting_members(group) <= broken[1]:
                del self._broken[group]
            return
        arrived = self._barriers.setdefault(group, {})
        arrived[nid] = arrival
        problem = self._mismatch(group, arrived)
        if problem is None and nid == self._views.rank0() and self._readers:  # rank 0 meets: it skipped a call others made
            readers, self._readers = self._readers, {}
            problem = self._mismatch_text(group, {**arrived, **readers})
            for waiting in readers.values():
                self._send(waiting.identity, error_frames(waiting.header, SCHEDULER_ID, "CollectiveMismatchError",
                                                          problem))
        if problem is not None:
            self._barriers[group] = {}
            for a in arrived.values():
                self._send(a.identity, error_frames(a.header, SCHEDULER_ID, "CollectiveMismatchError", problem))
            if not self._meeting_members(group) <= set(arrived):
                self._broken[group] = (problem, set(arrived))
            return
        self._settle_barrier(group)

    def _meeting_members(self, group: int) -> set[int]:
        return {m for m in self._members(group) if int(self._role(m)) != Role.SCHEDULER}

    def _mismatch(self, group: int, arrived: dict[int, _Arrival]) -> str | None:
        """Why the members at a meeting are not in the same collective (None: they are)."""
        named = [a.meeting for a in arrived.values() if a.meeting.name]  # nameless: an old node
        if len({m.name for m in named}) <= 1 and len({m.seq for m in named if m.seq}) <= 1:
            return None
        return self._mismatch_text(group, arrived)

    def _mismatch_text(self, group: int, arrived: dict[int, _Arrival]) -> str:
        calls = ", ".join(f"{node_name(n)} in {_call(a.meeting)}" for n, a in sorted(arrived.items()))
        missing = sorted(self._meeting_members(group) - set(arrived))
        later = f" ({', '.join(node_name(n) for n in missing)} not there yet)" if missing else ""
        return f"the workers are in different collectives: {calls}{later}. {_ADVICE}"

    def _settle_barrier(self, group: int) -> None:
        arrived = self._barriers.get(group, {})
        members = self._meeting_members(group)
        dead = sorted(m for m in members if self._lost(m))
        self._settle_readers()
        if dead and arrived:
            names = ", ".join(node_name(m) for m in dead)
            for a in arrived.values():
                self._send(a.identity, error_frames(a.header, SCHEDULER_ID, "NodeFailedError",
                                                    f"barrier cannot complete: {names} dead"))
            self._barriers[group] = {}
        elif arrived and (left := sorted(members & self._left())):
            names = ", ".join(node_name(m) for m in left)
            for a in arrived.values():  # NodeFailedError naming them: "worker 1 failed: ... left the job"
                self._send(a.identity, error_frames(a.header, SCHEDULER_ID, "NodeFailedError",
                                                    f"{_call(a.meeting)} cannot complete: {names} left the job "
                                                    "(closed its store or ended its process)", node=names))
            self._barriers[group] = {}
        elif arrived and members <= set(arrived) and not self._views.hold():
            self._barriers[group] = {}
            self._release(arrived)

    def _release(self, arrived: dict[int, _Arrival]) -> None:
        """Every member met: each gets rank 0's result and who failed, or why their inits differ."""
        ranked = sorted(arrived.items(), key=lambda item: self._rank(item[0]))
        failed = tuple((self._rank(n), a.meeting.failure) for n, a in ranked if a.meeting.failure is not None)
        problem = None if failed else _disagreement([(self._rank(n), a.meeting) for n, a in ranked])
        result = next((a.meeting.result for n, a in ranked if self._rank(n) == 0), "")
        view = self._views.at_release(ranked[0][1].meeting) if problem is None and not failed else None
        for nid, a in arrived.items():
            if problem is not None:
                frames = error_frames(a.header, SCHEDULER_ID, "InitMismatchError", problem)
            else:
                frames = reply_frames(a.header, SCHEDULER_ID, Met(result, failed, view).encode())
            self._released[nid] = (a.header.request, frames)
            self._send(a.identity, frames)

    def _post_or_read(self, nid: int, arrival: _Arrival) -> None:
        """Rank 0 posts the outcome of its ``seq``-th call of a name; another worker reads it (waiting for it)."""
        meeting = arrival.meeting
        worker0 = self._views.rank0()
        if meeting.mode == "post":
            if nid != worker0:
                self._send(arrival.identity, error_frames(arrival.header, SCHEDULER_ID, "InvalidArgumentError",
                                                          "only worker 0 posts the outcome of a call"))
                return
            self._posts[(meeting.name, meeting.seq, meeting.nth)] = meeting.failure
            count = self._posted.pop(meeting.name, (0, 0, 0, None))[2] + 1  # re-added last: least recent first
            self._posted[meeting.name] = (meeting.seq, meeting.nth, count, meeting.failure)
            while len(self._posts) > _KEPT_POSTS:
                del self._posts[next(iter(self._posts))]
            while len(self._posted) > _KEPT_POSTS:  # (a new name per post must not grow it)
                del self._posted[next(iter(self._posted))]
            self._send(arrival.identity, reply_frames(arrival.header, SCHEDULER_ID, Met().encode()))
            self._settle_readers()
            return
        arrival.posts_seen = self._posted.get(meeting.name, (0, 0, 0, None))[2]
        self._readers[nid] = arrival
        zero = self._barriers.get(meeting.group, {}).get(worker0)
        if zero is not None and (meeting.name, meeting.seq, meeting.nth) not in self._posts:  # rank 0 went on
            del self._readers[nid]
            problem = self._mismatch_text(meeting.group, {worker0: zero, nid: arrival})
            for a in (zero, arrival):
                self._send(a.identity, error_frames(a.header, SCHEDULER_ID, "CollectiveMismatchError", problem))
            self._barriers[meeting.group].pop(worker0, None)
            return
        self._settle_readers()

    def _settle_readers(self) -> None:
        """Answer the reads whose outcome rank 0 posted; fail them if rank 0 is dead or gone."""
        worker0 = self._views.rank0()
        gone = self._lost(worker0) or worker0 in self._left()
        for nid, a in list(self._readers.items()):
            key = (a.meeting.name, a.meeting.seq, a.meeting.nth)
            last = self._posted.get(a.meeting.name)
            if not a.meeting.seq or (last is not None and not last[0]):
                # a replacement process on either side (its meetings are not counted): rank 0's next call answers
                answer = last is not None and last[2] > a.posts_seen
                failure = last[3] if last is not None else None
            else:
                answer = key in self._posts or (last is not None and key[1:] <= last[:2])
                failure = self._posts.get(key)
            if answer:
                frames = reply_frames(a.header, SCHEDULER_ID, Met(failed=((0, failure),) if failure else ()).encode())
            elif gone:
                frames = error_frames(a.header, SCHEDULER_ID, "NodeFailedError",
                                      f"{_call(a.meeting)} waits for worker 0's outcome, but worker 0 is gone")
            else:
                continue
            del self._readers[nid]
            self._released[nid] = (a.header.request, frames)
            self._send(a.identity, frames)

    def fail_all(self, kind: str, text: str, node: str = "") -> None:
        """Every member waiting at a meeting or for rank 0's outcome gets error ``kind`` with ``text`` (naming
        ``node``) now: the job ends (an elastic job below MIN for too long)."""
        waiting = [(n, a) for arrived in self._barriers.values() for n, a in arrived.items()]
        waiting += list(self._readers.items())
        self._barriers, self._readers = {}, {}
        for nid, a in waiting:
            frames = error_frames(a.header, SCHEDULER_ID, kind, text, node)
            self._released[nid] = (a.header.request, frames)
            self._send(a.identity, frames)

    def _follow_view(self) -> None:
        """An elastic job's view changed: meetings are counted anew, and every worker waiting in one of the old
        view (at a meeting or for rank 0's outcome) gets MembershipChangedError."""
        epoch = self._views.epoch()
        if epoch == self._epoch:
            return
        self._epoch = epoch
        self._broken.clear()
        self._posts.clear()
        self._posted.clear()
        self._mismatched.clear()
        stale = [(n, a) for arrived in self._barriers.values() for n, a in list(arrived.items())
                 if a.meeting.epoch != epoch and self._role(n) is Role.WORKER]
        stale += [(n, a) for n, a in self._readers.items() if a.meeting.epoch != epoch]
        for nid, a in stale:
            self._barriers.get(a.meeting.group, {}).pop(nid, None)
            self._readers.pop(nid, None)
            self._changed(nid, a)

    def _changed(self, nid: int, a: _Arrival) -> None:
        """Fail ``nid``'s call of another view than the job's with MembershipChangedError naming the job's."""
        change = self._views.change() or f"view {self._epoch}"
        text = str(MembershipChangedError(
            f"{_call(a.meeting)} is of view {a.meeting.epoch}, and the job is in {change}" if a.meeting.epoch !=
            self._epoch else f"{node_name(nid)} is not a member of {change}", self._epoch))
        frames = error_frames(a.header, SCHEDULER_ID, "MembershipChangedError", text)
        self._released[nid] = (a.header.request, frames)
        self._send(a.identity, frames)

    def expire(self) -> None:
        """Timer: a member whose wait ends gets an error naming who did not arrive (before its own timeout)."""
        now = time.monotonic()
        for group, arrived in self._barriers.items():
            late = [n for n, a in arrived.items() if a.deadline <= now]
            if not late:
                continue
            missing = ", ".join(node_name(n) for n in sorted(self._meeting_members(group) - set(arrived)))
            calls = ", ".join(f"{node_name(n)} in {_call(a.meeting)}" for n, a in sorted(arrived.items()))
            for nid in late:
                a = arrived.pop(nid)
                self._send(a.identity, error_frames(a.header, SCHEDULER_ID, "OperationTimeoutError", (
                    f"{_call(a.meeting)}: {missing} did not arrive within {a.meeting.timeout:g} s (at the scheduler: "
                    f"{calls}). A worker that is not at the meeting is still in other calls (push, pull, wait, ...) "
                    f"or blocked in one. {_ADVICE}")))
        for nid, a in list(self._readers.items()):
            if a.deadline <= now:
                del self._readers[nid]
                self._send(a.identity, error_frames(a.header, SCHEDULER_ID, "OperationTimeoutError", (
                    f"{a.meeting.name}: worker 0 did not call it (call {a.meeting.nth} since meeting "
                    f"#{a.meeting.seq}) within {a.meeting.timeout:g} s. {_ADVICE}")))


_KEPT_POSTS = 64  # rank 0's posted outcomes kept for readers
_ADVICE = ("Every worker must call the same collectives (barrier, init, broadcast, set_optimizer, "
           "load_optimizer_states, save_checkpoint, join) in the same order; of the state operations rank 0 may "
           "call only save_optimizer_states alone (#n: the worker's n-th meeting)")


def _call(meeting: Barrier) -> str:
    """How a member's collective is named in errors: ``save_checkpoint#3``."""
    name = meeting.name or "a barrier (unnamed)"
    if meeting.mode:
        return f"{name} (call {meeting.nth} after meeting #{meeting.seq})"
    return f"{name}#{meeting.seq}" if meeting.seq else name


def _disagreement(meetings: list[tuple[int, Barrier]]) -> str | None:
    """Why the members' ``agree`` items differ (an init's key described differently), or None.

    Only items every member that describes them has — a key named in one worker's call
    and not in another's is not compared (workers may init keys in different orders);
    a worker's calls past ``MAX_AGREE`` keys are compared by their digest only, which
    tells nothing here.
    """
    if len({m.digest for _, m in meetings if m.digest}) <= 1:
        return None
    name = next((m.name for _, m in meetings if m.name), "init")
    tables = [(rank, dict(m.agree)) for rank, m in meetings if m.digest]
    for key in dict.fromkeys(k for _, t in tables for k in t):
        seen: dict[str, list[int]] = {}
        for rank, table in tables:
            if key in table:
                seen.setdefault(table[key], []).append(rank)
        if len(seen) > 1:
            told = "; ".join(f"{', '.join(f'worker {r}' for r in ranks)}: {what}" for what, ranks in seen.items())
            return (f"{name} of key {key} differs between workers: {told}. Every worker must {name} a key "
                    "with the same shape and dtype")
    return None
