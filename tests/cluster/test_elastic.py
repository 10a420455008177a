"""Roster (pskv/cluster/elastic.py): an elastic job's views, joins at commits, departures at once, below MIN."""

from __future__ import annotations

import pytest

from pskv.cluster.elastic import Roster, describe
from pskv.protocol import MAX_SLOTS
from pskv.protocol.bodies import View


def roster(min_workers: int = 2, max_workers: int = 4, timeout: float = 600.0) -> Roster:
    r = Roster(min_workers, max_workers, timeout)
    r.start([2, 0, 1], now=0.0)
    return r


def test_the_first_view_has_the_assembled_slots_in_order_and_commit_0():
    r = roster()
    assert r.view == View(1, (0, 1, 2), 0, "start") and not r.view.voids
    assert [v for v, _ in r.history] == [r.view]


def test_a_departure_makes_a_failure_view_at_once_from_the_last_commit():
    r = roster()
    assert r.at_commit(now=1.0) is None and r.committed == 1  # nothing pending: the commit alone
    view = r.depart(1, "missed heartbeats", now=2.0)
    assert view == View(2, (0, 2), 1, "failure") and view.voids
    assert view.rank_of(2) == 1  # ranks stay dense
    assert r.depart(1, "again", now=3.0) is None and r.depart(9, "never here", now=3.0) is None
    assert describe(view, r.history[-1][1]) == (
        "view 2: slots 0,2 (W=2) from commit 1 (failure: slot 1 missed heartbeats)")


def test_a_joiner_waits_for_a_commit_and_joins_after_the_members_so_rank_0_keeps_its_state():
    r = roster()
    r.depart(0, "exited", now=1.0)  # members 1, 2
    assert r.join(0 + 3, now=2.0) is None and r.pending == [3]
    r2 = Roster(1, 4, 600.0)
    r2.start([5, 6], now=0.0)
    assert r2.join(4, now=1.0) is None  # an older slot that started late
    view = r2.at_commit(now=2.0)
    assert view == View(2, (5, 6, 4), 1, "grow")
    assert view.rank_of(5) == 0  # the oldest member, never the joiner
    grown = r.at_commit(now=3.0)
    assert grown == View(3, (1, 2, 3), 1, "grow") and not grown.voids and r.pending == []


def test_joiners_past_max_wait_for_a_later_commit_first_come_first_admitted():
    r = roster(max_workers=4)
    for slot in (5, 3, 4):
        r.join(slot, now=1.0)
    assert r.at_commit(now=2.0) == View(2, (0, 1, 2, 5), 1, "grow")  # one place: the first that came
    assert r.pending == [3, 4]
    assert r.at_commit(now=3.0) is None and r.committed == 2  # still full
    r.depart(0, "exited", now=4.0)
    assert r.at_commit(now=5.0) == View(4, (1, 2, 5, 3), 3, "grow") and r.pending == [4]


def test_drains_apply_at_the_next_commit_alone_or_with_joins():
    r = roster()
    assert r.drain(2) and not r.drain(7)
    assert r.view.members == (0, 1, 2)  # not before the commit
    assert r.at_commit(now=1.0) == View(2, (0, 1), 1, "drain")
    r.drain(1)
    r.join(3, now=2.0)
    assert r.at_commit(now=3.0) == View(3, (0, 3), 2, "mixed")
    r.join(4, now=4.0)
    assert r.drain(4) and r.pending == []  # a joiner drained before its admission is forgotten


def test_slots_are_never_reused_and_bounded():
    r = roster()
    with pytest.raises(ValueError, match="was in this job already"):
        r.join(1, now=1.0)
    r.depart(1, "exited", now=1.0)
    with pytest.raises(ValueError, match="never reused"):
        r.join(1, now=2.0)
    with pytest.raises(ValueError, match=f"slots are 0..{MAX_SLOTS - 1}"):
        r.join(MAX_SLOTS, now=2.0)


def test_below_min_holds_then_fails_and_a_joiner_is_admitted_at_once():
    r = roster(min_workers=3, timeout=5.0)
    r.depart(2, "exited", now=10.0)
    assert r.below_min and r.below_since == 10.0
    assert r.overdue(now=15.0) is None
    assert r.overdue(now=15.5) == "only 2 of at least 3 workers for 5 s (PSKV_ELASTIC_TIMEOUT; pskv launch --elastic-timeout)"
    view = r.join(3, now=12.0)  # below MIN: no waiting for a commit
    assert view == View(3, (0, 1, 3), 0, "refill") and view.voids
    assert not r.below_min and r.below_since is None and r.overdue(now=100.0) is None


def test_a_failure_between_a_commits_two_meetings_rolls_back_to_the_commit_before():
    r = roster()
    r.at_commit(now=1.0)  # commit 1 released
    # commit 2: the first meeting met and the servers took snapshot 2, then slot 0 died before the release
    view = r.depart(0, "missed heartbeats", now=2.0)
    assert view.commit == 1  # snapshot 2 never became the commit
    r.at_commit(now=3.0)
    assert r.committed == 2 and r.depart(1, "exited", now=4.0).commit == 2
