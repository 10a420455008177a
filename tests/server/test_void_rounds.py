"""Void rounds (pskv/server/void.py): a refused sync push holds its worker's place in the round it would
have joined; that round completes changing nothing, its pulls fail, and the workers' rounds stay in step."""

from __future__ import annotations

from typing import Any

import numpy as np

from pskv.server.rows import RowBatch
from pskv.server.shard import Part, ServerShard

W0, W1 = 9, 11


def shard(workers: int = 2) -> tuple[ServerShard, Part]:
    s = ServerShard(workers, True)
    s.init(7, 0, "float32", np.zeros(4, np.float32))
    return s, s.part(7, 0, "test")


def f(v: float) -> np.ndarray[Any, Any]:
    return np.full(4, v, np.float32)


class Pulls:
    """Pull callbacks that record what happened."""

    def __init__(self) -> None:
        self.got: list[Any] = []

    def ready(self, name: str) -> Any:
        return lambda part: self.got.append((name, part.value.tolist()[0]))

    def fail(self, name: str) -> Any:
        return lambda reason: self.got.append((name, "failed: " + reason))


def test_a_refused_push_after_the_others_completes_the_round_void_and_fails_its_pulls() -> None:
    s, p = shard()
    pulls = Pulls()
    s.push(p, W0, f(1))
    s.pull_after_push(p, W0, 1, pulls.ready("w0"), pulls.fail("w0"))
    assert s.void_push(p, W1, 1, "worker 11 refused") == 1
    assert p.round == 1 and p.value.tolist() == [0] * 4 and not p.pushed  # complete, nothing applied
    assert pulls.got == [("w0", "failed: worker 11 refused")]
    s.pull_after_push(p, W0, 1, pulls.ready("late"), pulls.fail("late"))  # a pull of it after it completed
    s.pull(p, 1, pulls.ready("round"), pulls.fail("round"))
    assert pulls.got[1:] == [("late", "failed: worker 11 refused"), ("round", "failed: worker 11 refused")]
    s.push(p, W1, f(2))  # every worker's next push joins round 2
    assert s.push(p, W0, f(5)) == 2 and p.value.tolist() == [7] * 4


def test_a_refused_push_first_makes_the_round_void_for_the_push_that_completes_it() -> None:
    s, p = shard()
    pulls = Pulls()
    s.void_push(p, W1, 0, "refused")
    assert p.round == 0 and p.pushed == {W1}  # its place held
    assert s.push(p, W0, f(1)) == 1 and p.round == 1 and p.value.tolist() == [0] * 4
    s.pull_after_push(p, W0, 1, pulls.ready("w0"), pulls.fail("w0"))  # W0's pull of the push that completed it
    assert pulls.got == [("w0", "failed: refused")]
    s.push(p, W0, f(1))
    s.push(p, W1, f(1))
    s.pull_after_push(p, W0, 2, pulls.ready("next"), pulls.fail("next"))
    assert pulls.got[1:] == [("next", 2.0)]


def test_a_refused_push_for_a_later_round_holds_its_place_there() -> None:
    s, p = shard()
    s.push(p, W1, f(1))  # round 1
    assert s.void_push(p, W1, 2, "refused") == 2  # queued, as a push would be
    s.push(p, W0, f(2))  # round 1 completes; round 2 starts with W1's held place
    assert p.round == 1 and p.value.tolist() == [3] * 4 and p.pushed == {W1}
    s.push(p, W0, f(10))  # round 2: void
    assert p.round == 2 and p.value.tolist() == [3] * 4
    s.push(p, W0, f(1))
    s.push(p, W1, f(1))
    assert p.round == 3 and p.value.tolist() == [2] * 4


def test_the_updater_does_not_run_for_a_void_round() -> None:
    s, p = shard()
    calls = []
    s.updater = lambda key, merged, stored: calls.append(merged.tolist())
    s.push(p, W0, f(1))
    s.void_push(p, W1, 0, "refused")
    assert calls == [] and p.round == 1
    s.push(p, W0, f(1))
    s.push(p, W1, f(2))
    assert calls == [[3] * 4]


def test_a_row_sparse_part_drops_a_void_rounds_rows() -> None:
    s = ServerShard(2, True)
    s.init_rows(8, 0, "float32", 4, 2, None)
    p = s.part(8, 0, "test")
    s.push(p, W0, RowBatch(np.array([1]), np.ones((1, 2), np.float32)))
    s.void_push(p, W1, 0, "refused")
    assert p.round == 1 and not p.value.any() and p.rows_merge == []
    s.push(p, W0, RowBatch(np.array([2]), np.ones((1, 2), np.float32)))
    s.push(p, W1, RowBatch(np.array([2]), np.ones((1, 2), np.float32)))
    assert p.value.reshape(4, 2)[:, 0].tolist() == [0, 0, 2, 0]
