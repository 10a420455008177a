"""An elastic job's commit snapshots on one shard (pskv.server.commits): rollback bit-exact, copy on write."""

from __future__ import annotations

import numpy as np
import pytest

import pskv
from pskv.optimizer import SGD, Adam, Updater
from pskv.server.commits import CommitObserver, CommitSnapshots, NoCommits
from pskv.server.gather import Refused
from pskv.server.rows import RowBatch
from pskv.server.shard import ServerShard, ShardObserver
from pskv.server.squeeze import ReplyCompression

W0, W1 = 9, 11  # the node ids of workers 0 and 1


def grad(step: int, worker: int, size: int = 6, offset: int = 0) -> np.ndarray:
    """A gradient that depends only on the step and the worker (and the element)."""
    i = np.arange(offset, offset + size)
    return (((i * 7 + step * 3 + worker) % 13) - 6).astype(np.float32) / 8


def rounds(s: ServerShard, steps: range, parts=((7, 0),)) -> None:
    """Every worker pushes every part once per step (in a shuffled order of workers)."""
    for step in steps:
        for key, offset in parts:
            p = s.part(key, offset, "test")
            for w in (W1, W0) if step % 2 else (W0, W1):
                s.push(p, w, grad(step, w, p.value.size, offset))


def state(s: ServerShard) -> tuple:
    """Everything a rollback must put back: values, rounds, present rows, optimizer states and counts."""
    parts = {pid: (p.value.copy(), p.round, None if p.present is None else p.present.copy())
             for pid, p in s.parts.items()}
    if not isinstance(s.updater, Updater):
        return parts, None
    doc = s.updater.document()
    return parts, (doc.num_update, [(ks.key, ks.count, ks.names, [a.copy() for a in ks.arrays]) for ks in doc.keys])


def same(a: tuple, b: tuple) -> bool:
    """Bit-equal states (values compared as bytes)."""
    def flat(x):
        if isinstance(x, np.ndarray):
            return (x.dtype.str, x.shape, x.tobytes())
        if isinstance(x, dict):
            return sorted((k, flat(v)) for k, v in x.items())
        if isinstance(x, (list, tuple)):
            return [flat(v) for v in x]
        return x
    return flat(a) == flat(b)


def make(updater=None, size: int = 6) -> ServerShard:
    s = ServerShard(2)
    s.init(7, 0, "float32", np.linspace(-1, 1, size).astype(np.float32))
    s.updater = updater
    return s


@pytest.mark.parametrize("updater", [None, "sgd_momentum", "adam"])
def test_a_rollback_restores_values_rounds_and_optimizer_state_bit_exact_and_the_redo_matches(updater):
    optimizers = {"sgd_momentum": lambda: Updater(SGD(learning_rate=0.1, momentum=0.9)),
                  "adam": lambda: Updater(Adam(learning_rate=0.01))}
    make_updater = optimizers.get(updater, lambda: None)
    straight, s = make(make_updater()), make(make_updater())
    rounds(straight, range(6))
    commits = CommitSnapshots(s)
    rounds(s, range(3))
    commits.take(1)
    commits.promote(1)
    at_commit = state(s)
    rounds(s, range(3, 5))  # the steps a departure voids
    assert not same(state(s), at_commit)
    commits.rollback("worker slot 1 departed")
    assert same(state(s), at_commit)
    rounds(s, range(3, 6))  # redone in the next view: the same as if nothing had happened
    assert same(state(s), state(straight))


def test_without_an_updater_nothing_is_copied_the_commits_value_array_is_rebound():
    s = make()
    commits = CommitSnapshots(s)
    rounds(s, range(2))
    commits.take(1)
    commits.promote(1)
    p = s.part(7, 0, "test")
    value = p.value
    rounds(s, range(2, 5))
    assert p.value is not value and commits.nbytes() == value.nbytes  # only the replaced array kept alive
    commits.rollback("worker slot 1 departed")
    assert p.value is value and p.round == 2 and commits.nbytes() == 0


def test_copy_on_write_copies_each_key_once_per_commit_and_counts_the_bytes():
    s = make(Updater(SGD(learning_rate=0.1, momentum=0.9)))
    commits = CommitSnapshots(s)
    rounds(s, range(1))  # the momentum state exists from here
    commits.take(1)
    commits.promote(1)
    value = s.part(7, 0, "test").value
    assert commits.nbytes() == 0
    rounds(s, range(1, 2))
    assert commits.nbytes() == 2 * value.nbytes  # the value and its momentum, copied once ...
    held = commits._committed.parts[(7, 0)].value
    rounds(s, range(2, 5))
    assert commits.nbytes() == 2 * value.nbytes and commits._committed.parts[(7, 0)].value is held  # ... not again
    assert s.part(7, 0, "test").value is value  # written in place all along
    commits.take(2)
    commits.promote(2)
    assert commits.nbytes() == 0  # a new commit: nothing copied yet
    rounds(s, range(5, 6))
    assert commits.nbytes() == 2 * value.nbytes


def test_adam_copies_both_of_its_states():
    s = make(Updater(Adam(learning_rate=0.01)))
    commits = CommitSnapshots(s)
    rounds(s, range(1))
    commits.take(1)
    commits.promote(1)
    rounds(s, range(1, 3))
    assert commits.nbytes() == 3 * s.part(7, 0, "test").value.nbytes


def test_before_the_second_meeting_a_rollback_goes_to_the_previous_commit():
    s = make(Updater(SGD(learning_rate=0.1, momentum=0.9)))
    commits = CommitSnapshots(s)
    rounds(s, range(2))
    commits.take(1)
    commits.promote(1)
    at_one = state(s)
    rounds(s, range(2, 4))
    commits.take(2)  # COMMIT 2 arrived; the view naming it never came
    assert commits.commit == 1
    rounds(s, range(4, 5))
    commits.rollback("worker slot 1 departed")
    assert same(state(s), at_one) and commits.commit == 1
    with pytest.raises(pskv.InvalidArgumentError, match="commit 2 was not taken"):
        commits.promote(2)  # dropped with the rollback


def test_commit_n_promotes_a_pending_n_minus_1_that_no_view_named():
    """Rank 0 sends COMMIT n only after every worker passed commit n - 1's release: n - 1 holds."""
    s = make(Updater(SGD(learning_rate=0.1, momentum=0.9)))
    commits = CommitSnapshots(s)
    rounds(s, range(2))
    commits.take(1)  # its release carried no view: nothing promoted it
    at_one = state(s)
    rounds(s, range(2, 4))
    commits.take(2)  # a departure now, between COMMIT 2 and its release ...
    assert commits.commit == 1
    rounds(s, range(4, 5))
    commits.rollback("worker slot 2 departed")
    assert same(state(s), at_one) and commits.commit == 1  # ... goes back to commit 1
    commits.promote(1)  # the departure's view names commit 1: no error


def test_a_second_rollback_to_the_same_commit_is_as_exact_as_the_first():
    s = make(Updater(SGD(learning_rate=0.1, momentum=0.9)))
    commits = CommitSnapshots(s)
    rounds(s, range(2))
    commits.take(1)
    commits.promote(1)
    at_commit = state(s)
    for _ in range(2):
        rounds(s, range(2, 4))
        commits.rollback("worker slot 1 departed")
        assert same(state(s), at_commit)


def test_without_a_commit_a_rollback_goes_back_to_the_state_the_snapshots_were_made_with():
    s = make(Updater(SGD(learning_rate=0.1, momentum=0.9)))
    start = state(s)
    commits = CommitSnapshots(s)
    s.init(8, 0, "float32", np.ones(3, np.float32))  # a key made after the commit ...
    rounds(s, range(3), parts=((7, 0), (8, 0)))
    commits.rollback("worker slot 1 departed")
    parts, _ = state(s)
    assert same(parts[(7, 0)], start[0][(7, 0)])
    assert parts[(8, 0)][0].tolist() == [1, 1, 1] and parts[(8, 0)][1] == 0  # ... keeps its INIT value
    assert s.updater.document().keys == ()  # no state, no count: none existed at the commit


def test_a_rollback_clears_the_rounds_and_fails_the_parked_pulls_with_membership_changed():
    s = ServerShard(3)
    s.init(7, 0, "float32", np.zeros(6, np.float32))
    commits = CommitSnapshots(s)
    p = s.part(7, 0, "test")
    failed: list[str] = []
    s.push(p, W0, grad(0, W0))
    s.push(p, W0, grad(1, W0))  # queued for the next round
    s.pull_after_push(p, W0, 2, lambda part: None, failed.append)  # parked: its round is open
    s.pull_after_push(p, W1, 1, lambda part: None, failed.append)  # parked: the push it names did not come
    s.join(13)  # worker 2 ran out of data: its joined mark is per view too
    assert commits.rollback("worker slot 1 departed", epoch=2, slot=1) == 2
    assert all(isinstance(r, Refused) and r.kind == "MembershipChangedError" for r in failed)
    assert "worker slot 1 departed" in failed[0] and "restore and redo" in failed[0]
    assert not (p.pushes or p.pushed or p.queued or p.waiting or p.early or s.joined) and p.round == 0
    assert s.push(p, W0, grad(0, W0)) == 1  # push numbers start over


def test_a_commit_with_an_open_round_or_a_parked_pull_is_refused():
    s = make()
    commits = CommitSnapshots(s)
    p = s.part(7, 0, "test")
    s.push(p, W0, grad(0, W0))
    with pytest.raises(pskv.CollectiveMismatchError, match=r"commit 1: key 7 .*open sync round 1 that worker 0 pushed"):
        commits.take(1)
    s.key_names = {7: "fc1_weight"}  # a str key: named as the user wrote it
    with pytest.raises(pskv.CollectiveMismatchError, match=r"commit 1: key 'fc1_weight' \(server key 7\) .*open"):
        commits.take(1)
    s.push(p, W1, grad(0, W1))
    s.pull(p, 2, lambda part: None)
    with pytest.raises(pskv.CollectiveMismatchError, match=r"1 pull\(s\) waiting"):
        commits.take(1)


def test_the_pieces_of_a_cut_slice_roll_back_together_and_stay_one_buffer():
    s = ServerShard(2)
    s.init(7, 0, "float32", np.linspace(-1, 1, 4).astype(np.float32))
    s.init(7, 4, "float32", np.linspace(1, 2, 4).astype(np.float32))
    s.updater = Updater(SGD(learning_rate=0.1, momentum=0.9))
    parts = ((7, 0), (7, 4))
    straight = ServerShard(2)
    straight.init(7, 0, "float32", np.linspace(-1, 1, 4).astype(np.float32))
    straight.init(7, 4, "float32", np.linspace(1, 2, 4).astype(np.float32))
    straight.updater = Updater(SGD(learning_rate=0.1, momentum=0.9))
    rounds(straight, range(5), parts)
    commits = CommitSnapshots(s)
    rounds(s, range(2), parts)
    commits.take(1)
    commits.promote(1)
    at_commit = state(s)
    rounds(s, range(2, 4), parts)
    commits.rollback("worker slot 1 departed")
    assert same(state(s), at_commit)
    rounds(s, range(2, 5), parts)
    assert same(state(s), state(straight))


def test_async_summed_adds_are_copied_before_their_first_write():
    s = ServerShard(2, sync=False)
    s.init(7, 0, "float32", np.zeros(6, np.float32), summed=True)
    commits = CommitSnapshots(s)
    p = s.part(7, 0, "test")
    s.push(p, W0, grad(0, W0))
    commits.take(1)
    commits.promote(1)
    at_commit = state(s)
    s.push(p, W1, grad(1, W1))
    s.push(p, W0, grad(2, W0))
    assert commits.nbytes() == p.value.nbytes
    commits.rollback("worker slot 1 departed")
    assert same(state(s), at_commit)


def test_row_sparse_parts_get_their_rows_and_present_rows_back():
    s = ServerShard(2)
    s.init_rows(8, 0, "float32", 5, 2, None)
    s.updater = Updater(SGD(learning_rate=0.5, momentum=0.5))
    p = s.part(8, 0, "test")

    def step(ids):
        for w in (W0, W1):
            s.push(p, w, RowBatch(np.array(ids), np.full((len(ids), 2), w / 4, np.float32)))
    commits = CommitSnapshots(s)
    step([1])
    commits.take(1)
    commits.promote(1)
    at_commit = state(s)
    step([3, 4])
    assert p.present.tolist() == [1, 3, 4]
    commits.rollback("worker slot 1 departed")
    assert same(state(s), at_commit) and p.present.tolist() == [1]


def test_a_broadcast_caller_copies_first_and_the_reply_residuals_come_back():
    s = make()
    squeezed = ReplyCompression()
    commits = CommitSnapshots(s, squeezed)
    p = s.part(7, 0, "test")
    before = p.value.copy()
    commits.before_write(p)  # the BROADCAST handler's line before ServerShard.overwrite
    s.overwrite(p, np.full(6, 3.0, np.float32))
    commits.rollback("worker slot 1 departed")
    assert p.value.tobytes() == before.tobytes()
    assert len(squeezed) == 0


def test_the_observer_is_wrapped_and_a_job_that_is_not_elastic_has_none():
    s = make()
    inner = s.observer
    CommitSnapshots(s)
    assert isinstance(s.observer, CommitObserver) and s.observer.inner is inner
    plain = make()
    assert type(plain.observer) is ShardObserver  # nothing on the hot path without elastic
    none = NoCommits()
    none.before_write(plain.part(7, 0, "test"))
    assert none.rollback("x") == 0 and none.nbytes() == 0
    with pytest.raises(pskv.NotSupportedError, match="not elastic"):
        none.take(1)
