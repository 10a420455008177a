"""``bench/bench_elastic.py``'s pure half: the jobs' lines into events, and events into the stall a change cost.

No job runs here (the benchmark's jobs take minutes); the lines are the formats the worker program, the
scheduler's log and the launcher print.
"""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def el(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(sys, "path", [str(BENCH), *sys.path])
    return importlib.import_module("bench_elastic")


def test_the_lines_of_workers_scheduler_and_launcher_become_events(el):
    events = el.parse_events([
        (5.0, "[worker 2] committed step 9 members 0,2 slot 2 t 1795925731.371665"),
        (5.0, "[worker 0] restore at step 8 slot 0 t 1795925731.326672: the workers changed under this call: ..."),
        (5.0, "[scheduler] 2026-11-29 04:15:31.294 WARNING [scheduler] pskv.scheduler: scheduler: view 2: slots 0,2 "
              "(W=2) from commit 9 (failure: slot 1 exited (the launcher's report))"),
        (7.5, "pskv launch: worker slot 1 on 127.0.0.1 was killed by SIGKILL: it left the job; 2 workers go on (MIN 2, MAX 3)"),
        (8.0, "[worker 3] ev pulled slot 3 t 1795925733.5 dt 0.016715"),
        (9.0, "[worker 0] some other line"),
    ])
    kinds = {e.kind: e for e in events}
    assert sorted(kinds) == ["commit", "left", "pulled", "restore", "view"]
    assert (kinds["commit"].slot, kinds["commit"].step, kinds["commit"].members) == (2, 9, (0, 2))
    assert kinds["commit"].t == pytest.approx(1795925731.371665)
    assert (kinds["view"].step, kinds["view"].members, kinds["view"].text) == (2, (0, 2), "failure")
    assert (kinds["left"].slot, kinds["left"].t, kinds["left"].text) == (1, 7.5, "was killed by SIGKILL")
    assert kinds["pulled"].text == "0.016715"


def _commits(el, slot, times, first_step=1):
    return [el.Event(t, "commit", slot, first_step + i, (0, 1, 2)) for i, t in enumerate(times)]


def test_a_kill_costs_the_window_from_the_last_commit_to_the_redone_one_less_one_interval(el):
    events = [*_commits(el, 0, [1.0, 1.1, 1.2]), *_commits(el, 2, [1.0, 1.1, 1.2]),
              el.Event(1.25, "kill", 1, 3), el.Event(1.28, "view", -1, 2, (0, 2), "failure"),
              el.Event(1.29, "restore", 0, 3), el.Event(1.29, "restore", 2, 3),
              *_commits(el, 0, [1.5, 1.6], first_step=4), *_commits(el, 2, [1.5, 1.6], first_step=4)]
    m = el.removal_metrics(sorted(events, key=lambda e: e.t), events[6], every=1)
    assert m["interval"] == pytest.approx(0.1)
    assert m["detect"] == pytest.approx(0.03) and m["to_restore"] == pytest.approx(0.01)
    assert m["redo"] == pytest.approx(0.21) and m["voided_before"] == pytest.approx(0.05)
    assert m["stall"] == pytest.approx((1.5 - 1.2) - 0.1)
    assert math.isnan(m["note"])  # no launcher line in this record


def test_a_stall_counts_one_interval_per_commit_of_progress_in_its_window(el):
    own = _commits(el, 0, [1.0, 1.1, 1.4, 1.5])  # steps 1..4: the change between steps 2 and 3
    assert el.stall(own, 1.2, lambda e: e.step >= 4, 1, 0.1) == pytest.approx((1.5 - 1.1) - 2 * 0.1)
    assert el.stall(own, 1.2, lambda e: e.t > 1.3, 2, 0.1) == pytest.approx((1.4 - 1.1) - 0.1)  # at least one
    assert math.isnan(el.stall(own, 0.5, lambda e: True, 1, 0.1))  # no commit before the change
    assert el.summary([{"a": 1.0}, {"a": 3.0, "b": math.nan}, {"a": 2.0}]) == {
        "a": {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}}
