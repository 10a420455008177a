"""An elastic job's membership at the scheduler: views, pending joiners, drains (issue 24).

In an elastic job (``pskv launch -n MIN:MAX``; :attr:`ClusterConfig.elastic`) a worker's
``DMLC_WORKER_ID`` is its *slot*, a fixed identity never reused (its node id is
``node_id(WORKER, slot)``), and the scheduler hands out **views**
(:class:`~pskv.protocol.bodies.View`: an epoch, the member slots in rank order, the last
commit, a cause). A slot's rank is its index in the view, so ranks are dense and rank 0 is the
oldest member. Views change in two ways only:

* **at once**, when a member departs (it missed heartbeats, the launcher reports its exit,
  or it left without being drained): a ``failure`` view, which voids everything since the
  view's commit on every node; and when joiners arrive while the job is below MIN (a
  ``refill`` view, voiding too);
* **at a commit's release** (the second meeting of ``kv.commit()``, named
  :data:`COMMITTED_MEETING`): the pending joiners are admitted (up to MAX) and the drained
  slots removed, and every member (in the release) and joiner (in its registration reply)
  gets the same new view: ``grow``, ``drain`` or ``mixed``. Nothing is voided.

:class:`Roster` holds that state and decides, with no I/O and no clock of its own (like
:class:`~pskv.cluster.meetings.Meetings`). :class:`ElasticViews` is the scheduler's owner
object around it: the joiners' waiting registrations, the launcher's ``ROSTER`` reports
(checked against ``PSKV_LAUNCH_TOKEN``), the log of views. :class:`FixedViews` stands in for
it in every other job and does nothing, so a fixed job pays nothing for elastic ones.

While a view is below MIN, its meetings are held (not released); after
``PSKV_ELASTIC_TIMEOUT`` the scheduler fails them and the job (:meth:`Roster.overdue`).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from pskv.config import ClusterConfig
from pskv.errors import ProtocolError
from pskv.protocol import MAX_SLOTS, SCHEDULER_ID, Header, Role, node_id, node_role_rank
from pskv.protocol.bodies import Barrier, Register, View
from pskv.protocol.bodies import Roster as RosterReport
from pskv.protocol.replies import error_frames, reply_frames

__all__ = ["COMMIT_MEETING", "COMMITTED_MEETING", "ElasticViews", "FixedViews", "Roster", "describe", "views_for"]

log = logging.getLogger("pskv.scheduler")

#: The meetings of ``kv.commit()``: every member settled (then rank 0 sends COMMIT to every server),
#: and every server took its snapshot; the second one's release makes the commit, and may carry a view.
COMMIT_MEETING = "commit"
COMMITTED_MEETING = "committed"

Send = Callable[[bytes, list[Any]], None]


def describe(view: View, detail: str) -> str:
    """A view as the scheduler logs it (the record tests read):
    ``view 3: slots 0,2,3 (W=3) from commit 19 (grow: slot 3)``."""
    slots = ",".join(str(s) for s in view.members) or "none"
    return f"view {view.epoch}: slots {slots} (W={len(view.members)}) from commit {view.commit} ({view.cause}: {detail})"


class Roster:
    """The views of an elastic job, its pending joiners and drains, and how long it has been below MIN.

    Pure: no I/O; the caller passes the time (``now``, monotonic seconds). Every method that makes a
    view returns it (None: no change) and records it in :attr:`history` with why.

    Args:
        min_workers: the fewest members the job may run with (meetings are held below it).
        max_workers: the most members; joiners past it stay pending.
        elastic_timeout: seconds the job may stay below ``min_workers`` (:meth:`overdue`).
    """

    def __init__(self, min_workers: int, max_workers: int, elastic_timeout: float) -> None:
        self.min_workers = min_workers
        self.max_workers = max_workers
        self.elastic_timeout = elastic_timeout
        self.view = View(0, (), 0, "start")  # epoch 0: not started
        self.history: list[tuple[View, str]] = []  # every view made, and why
        self.pending: list[int] = []  # joiners waiting for a commit, in arrival order
        self.drains: set[int] = set()  # members to remove at the next commit
        self.committed = 0  # the last commit every member passed (0: the stores' creation)
        self.below_since: float | None = None  # when the job went below min_workers
        self._seen: set[int] = set()  # every slot ever a member or pending: a slot is never reused

    def start(self, slots: Iterable[int], now: float) -> View:
        """The first view (epoch 1): the workers that assembled, by slot."""
        members = sorted(slots)
        self._seen.update(members)
        return self._make(tuple(members), "start", f"{len(members)} workers assembled", now)

    def join(self, slot: int, now: float) -> View | None:
        """A new slot registered: it waits for the next commit, or, below MIN, is admitted at once
        (a ``refill`` view: the members' work since the commit is void).

        Raises:
            ValueError: ``slot`` is out of range or was already in the job (slots are never reused).
        """
        if not 0 <= slot < MAX_SLOTS or slot in self._seen:
            raise ValueError(f"worker slot {slot} cannot join: " + (
                "it was in this job already (a slot is never reused)" if slot in self._seen else
                f"slots are 0..{MAX_SLOTS - 1}"))
        self._seen.add(slot)
        self.pending.append(slot)
        if self.view.epoch and len(self.view.members) < self.min_workers:
            return self._admit(self.view.members, "refill", now)
        return None

    def depart(self, slot: int, why: str, now: float) -> View | None:
        """``slot`` left the job (``why``: died, exited, left undrained): a ``failure`` view now if it
        was a member (its work and everyone's since the last commit is void); a pending joiner is
        just forgotten."""
        if slot in self.pending:
            self.pending.remove(slot)
            return None
        self.drains.discard(slot)
        if slot not in self.view.members:
            return None
        members = tuple(m for m in self.view.members if m != slot)
        return self._make(members, "failure", f"slot {slot} {why}", now)

    def drain(self, slot: int) -> bool:
        """Remove member ``slot`` at the next commit (a pending joiner: at once). False if it is neither."""
        if slot in self.pending:
            self.pending.remove(slot)
            return True
        if slot in self.view.members:
            self.drains.add(slot)
            return True
        return False

    def at_commit(self, now: float) -> View | None:
        """A commit's second meeting was released: it is the commit now; the drains are applied and the
        pending joiners admitted (up to MAX) in one view (None when nothing changes)."""
        self.committed += 1
        kept = tuple(m for m in self.view.members if m not in self.drains)
        drained = len(kept) < len(self.view.members)
        self.drains.clear()
        if not self.pending or len(kept) >= self.max_workers:
            return self._make(kept, "drain", "removed at a commit", now) if drained else None
        return self._admit(kept, "mixed" if drained else "grow", now)

    def overdue(self, now: float) -> str | None:
        """Why the job fails, once it has been below MIN for longer than the elastic timeout (else None)."""
        if self.below_since is None or now - self.below_since <= self.elastic_timeout:
            return None
        return (f"only {len(self.view.members)} of at least {self.min_workers} workers for "
                f"{self.elastic_timeout:g} s (PSKV_ELASTIC_TIMEOUT; pskv launch --elastic-timeout)")

    @property
    def below_min(self) -> bool:
        """True while the view has fewer members than MIN (its meetings are held)."""
        return len(self.view.members) < self.min_workers

    def _admit(self, kept: tuple[int, ...], cause: str, now: float) -> View:
        """A view of ``kept`` and the first pending joiners, by slot, up to MAX."""
        joining = sorted(self.pending[:max(0, self.max_workers - len(kept))])
        self.pending = [s for s in self.pending if s not in joining]
        removed = [m for m in self.view.members if m not in kept]
        detail = "; ".join(part for part in (
            f"slot{'s' if len(joining) > 1 else ''} {','.join(map(str, joining))}" if joining else "",
            f"removed {','.join(map(str, removed))}" if removed else "") if part)
        return self._make(kept + tuple(joining), cause, detail, now)

    def _make(self, members: tuple[int, ...], cause: str, detail: str, now: float) -> View:
        self.view = View(self.view.epoch + 1, members, self.committed, cause)
        self.history.append((self.view, detail))
        if len(members) >= self.min_workers:
            self.below_since = None
        elif self.below_since is None:
            self.below_since = now
        return self.view


class FixedViews:
    """The views of a job that is not elastic: none. Every call is a no-op (the fixed job's path).

    Args:
        send: delivers frames to a connection (a ROSTER report is refused through it).
    """

    elastic = False

    def __init__(self, send: Send | None = None) -> None:
        self._send = send

    def epoch(self) -> int:
        return 0

    def current(self) -> View | None:
        return None

    def members(self, nodes: set[int]) -> set[int]:
        return nodes

    def rank(self, nid: int, registered: int) -> int:
        return registered

    def rank0(self) -> int:
        return _WORKER0

    def hold(self) -> bool:
        return False

    def change(self) -> str:
        return ""

    def at_release(self, meeting: Barrier) -> View | None:
        return None

    def view_for(self, epoch: int) -> View | None:
        return None

    def start(self, slots: Iterable[int]) -> None:
        pass

    def join(self, identity: bytes, header: Header, body: Register, assembled: bool) -> bool:
        return False

    def depart(self, nid: int, why: str) -> None:
        pass

    def overdue(self) -> str | None:
        return None

    def report(self, identity: bytes, header: Header) -> int | None:
        """A ROSTER report: refused, this job is not elastic."""
        if self._send is not None:
            self._send(identity, error_frames(header, SCHEDULER_ID, "ProtocolError",
                                              "ROSTER refused: this job is not elastic"))
        return None


FIXED = FixedViews()
_WORKER0 = node_id(Role.WORKER, 0)


class ElasticViews(FixedViews):
    """The scheduler's owner of an elastic job's views (one line from each place the job's size mattered).

    Args:
        cluster: the scheduler's contract (MIN, MAX, the elastic timeout, the launch token).
        send: delivers frames to a connection.
        admit: registers a joiner the view admits and answers its REGISTER with its table
            (``identity``, its REGISTER request, its slot).
        clock: monotonic seconds (tests pass their own).
    """

    elastic = True

    def __init__(self, cluster: ClusterConfig, send: Send, admit: Callable[[bytes, Header, int], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(send)
        self._send: Send = send
        self.roster = Roster(cluster.min_workers, cluster.max_workers, cluster.elastic_timeout)
        self._initial = cluster.num_workers  # W0: slots 0..W0-1 assemble; higher ones join
        self._token = cluster.launch_token
        self._admit = admit
        self._clock = clock
        self._joiners: dict[int, tuple[bytes, Header]] = {}  # slot -> its waiting REGISTER
        self._change = ""  # how the last view came (MembershipChangedError's detail)

    # -- what meetings and the scheduler read ------------------------------------------------
    def epoch(self) -> int:
        return self.roster.view.epoch

    def current(self) -> View | None:
        return self.roster.view if self.roster.view.epoch else None

    def members(self, nodes: set[int]) -> set[int]:
        """The nodes of a group that count: servers, and the workers of the view."""
        members = self.roster.view.members
        return {n for n in nodes if node_role_rank(n)[0] is not Role.WORKER or node_role_rank(n)[1] in members}

    def rank(self, nid: int, registered: int) -> int:
        rank = self.roster.view.rank_of(node_role_rank(nid)[1])
        return registered if rank < 0 else rank

    def rank0(self) -> int:
        members = self.roster.view.members
        return node_id(Role.WORKER, members[0]) if members else -1

    def hold(self) -> bool:
        return self.roster.below_min

    def change(self) -> str:
        return self._change

    def view_for(self, epoch: int) -> View | None:
        """The view a node at ``epoch`` must hear of (None: it has it)."""
        return self.roster.view if epoch < self.roster.view.epoch else None

    # -- events --------------------------------------------------------------------------------
    def start(self, slots: Iterable[int]) -> None:
        """The cluster assembled: the first view."""
        self._log(self.roster.start(slots, self._clock()))

    def join(self, identity: bytes, header: Header, body: Register, assembled: bool) -> bool:
        """A worker's REGISTER that is a join (after assembly, or a slot past the first W0): it waits for
        its admission, answered then (True: taken here, answered or refused)."""
        if body.role != "worker" or not (assembled or body.rank >= self._initial):
            return False
        try:
            view = self.roster.join(body.rank, self._clock())
        except ValueError as exc:
            self._send(identity, error_frames(header, SCHEDULER_ID, "ProtocolError", str(exc)))
            return True
        self._joiners[body.rank] = (identity, header)
        log.info("scheduler: worker slot %d waits to join at the next commit", body.rank)
        if view is not None:
            self._made(view)
        return True

    def depart(self, nid: int, why: str) -> None:
        """Worker ``nid`` died, exited or left: a failure view if it was a member."""
        role, slot = node_role_rank(nid)
        if role is Role.WORKER:
            self._joiners.pop(slot, None)
            view = self.roster.depart(slot, why, self._clock())
            if view is not None:
                self._made(view)

    def report(self, identity: bytes, header: Header) -> int | None:
        """The launcher's ROSTER report (its token checked): the departed worker's node id, if one departed."""
        try:
            report = RosterReport.parse(header)
        except ProtocolError as exc:
            self._send(identity, error_frames(header, SCHEDULER_ID, "ProtocolError", str(exc)))
            return None
        if not self._token or not hmac.compare_digest(report.token, self._token):
            log.error("scheduler: a ROSTER report without the launch token was refused")
            self._send(identity, error_frames(header, SCHEDULER_ID, "ProtocolError",
                                              "ROSTER refused: it needs the job's launch token"))
            return None
        self._send(identity, reply_frames(header, SCHEDULER_ID))
        nid = node_id(Role.WORKER, report.slot)
        if report.op == "drain":
            waiting = self._joiners.pop(report.slot, None)
            if waiting is not None:  # not admitted yet: it is told now
                self._send(waiting[0], error_frames(waiting[1], SCHEDULER_ID, "NodeFailedError",
                                                    f"worker slot {report.slot} was drained before it was admitted"))
            log.info("scheduler: worker slot %d is drained at the next commit", report.slot)
            self.roster.drain(report.slot)
            return None
        self.depart(nid, "exited (the launcher's report)")
        return nid

    def at_release(self, meeting: Barrier) -> View | None:
        """A meeting is released: a commit's second one makes the commit and may carry a new view."""
        if meeting.name != COMMITTED_MEETING:
            return None
        view = self.roster.at_commit(self._clock())
        if view is not None:
            self._made(view)
        return view

    def overdue(self) -> str | None:
        """Why the job fails now (below MIN too long), else None."""
        return self.roster.overdue(self._clock())

    def _made(self, view: View) -> None:
        """A new view: logged, and the joiners it admits answered with it."""
        self._log(view)
        for slot in view.members:
            waiting = self._joiners.pop(slot, None)
            if waiting is not None:
                self._admit(waiting[0], waiting[1], slot)

    def _log(self, view: View) -> None:
        detail = self.roster.history[-1][1]
        self._change = describe(view, detail)
        quiet = not view.voids or detail.endswith(" left the job")  # a member that closed its store: the job's end
        log.log(logging.INFO if quiet else logging.WARNING, "scheduler: %s", self._change)


def views_for(cluster: ClusterConfig, send: Send, admit: Callable[[bytes, Header, int], None]) -> FixedViews:
    """The scheduler's views: :class:`ElasticViews` in an elastic job, else the no-op :class:`FixedViews`."""
    return ElasticViews(cluster, send, admit) if cluster.elastic else FixedViews(send)
