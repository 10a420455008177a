"""Server-side aggregation rules, without any I/O."""

from __future__ import annotations

import os

import numpy as np
import pytest

import pskv
from pskv.server.shard import ServerShard, bf16_bits_to_f32, f32_to_bf16_bits


def shard(workers=2, sync=True):
    s = ServerShard(workers, sync)
    s.init(7, 0, "float32", np.zeros(4, np.float32))
    return s, s.part(7, 0, "test")


def f(v):
    return np.full(4, v, np.float32)


def test_a_round_needs_one_push_from_each_distinct_worker():
    s, p = shard()
    assert s.push(p, 9, f(1)) == 1
    assert s.push(p, 9, f(10)) == 2  # same worker again: queued for round 2
    assert p.round == 0
    assert s.push(p, 11, f(2)) == 1  # round 1 completes: 1 + 2
    assert p.round == 1 and p.value.tolist() == [3] * 4
    assert p.pushed == {9}  # the queued push started round 2
    assert s.push(p, 11, f(5)) == 2
    assert p.round == 2 and p.value.tolist() == [15] * 4


def test_pulls_wait_for_their_round():
    s, p = shard()
    got = []
    s.pull(p, 0, lambda part: got.append(("now", part.value.tolist())))
    s.pull(p, 1, lambda part: got.append(("r1", part.value.tolist())))
    assert got == [("now", [0] * 4)]
    s.push(p, 9, f(1))
    assert len(got) == 1
    s.push(p, 11, f(1))
    assert got[1] == ("r1", [2] * 4)


def test_updater_runs_once_per_round():
    s, p = shard()
    calls = []

    def upd(key, merged, stored):
        calls.append(merged.tolist())
        stored -= 0.5 * merged

    s.updater = upd
    s.push(p, 9, f(1))
    s.push(p, 11, f(3))
    assert calls == [[4] * 4] and p.value.tolist() == [-2] * 4
    assert p.wire_value(snapshot=True) is not p.value


def test_replaced_values_are_never_written_again():
    s, p = shard()
    s.push(p, 9, f(1))
    s.push(p, 11, f(1))
    sent = p.wire_value(snapshot=False)
    s.push(p, 9, f(5))
    s.push(p, 11, f(5))
    assert sent.tolist() == [2] * 4 and p.value.tolist() == [10] * 4


def test_async_applies_each_push_and_needs_an_updater():
    s, p = shard(sync=False)
    with pytest.raises(pskv.InvalidArgumentError, match="dist_async.*set_optimizer"):
        s.push(p, 9, f(1))
    s.updater = lambda key, merged, stored: stored.__iadd__(merged)
    assert s.push(p, 9, f(1)) == 1
    assert s.push(p, 9, f(2)) == 2
    assert p.value.tolist() == [3] * 4


def test_init_and_checks():
    s, p = shard()
    with pytest.raises(pskv.DuplicateKeyError):
        s.init(7, 0, "float32", np.zeros(4, np.float32))
    with pytest.raises(pskv.UnknownKeyError, match="key 8"):
        s.check(8, 0, "float32", 4, "push")
    with pytest.raises(pskv.DTypeMismatchError):
        s.check(7, 0, "float64", 4, "push")
    with pytest.raises(pskv.ShapeMismatchError):
        s.check(7, 0, "float32", 5, "push")
    # a str key is named as the user wrote it (the names INIT brought), its size as a part's, not a shape
    s.key_names = {7: "fc1_weight", 8: "fc2_weight"}
    with pytest.raises(pskv.ShapeMismatchError) as shape:
        s.check(7, 0, "float32", 5, "push")
    assert str(shape.value) == ("push of key 'fc1_weight' (server key 7): a part of 5 elements does not match "
                                "the stored part of 4 elements")
    with pytest.raises(pskv.DTypeMismatchError, match=r"^push of key 'fc1_weight' \(server key 7\): dtype float64"):
        s.check(7, 0, "float64", 4, "push")
    with pytest.raises(pskv.UnknownKeyError) as unknown:
        s.check(8, 0, "float32", 4, "push")
    assert str(unknown.value) == ("key 'fc2_weight' (server key 8) has not been initialised; call init or "
                                  "broadcast before push")  # not init(8, value): what init takes is the name
    s.key_names = {}
    assert list(s.open_rounds()) == [] and s.parked() == 0
    s.push(p, 9, f(1))
    [(part, rnd, pushed, age)] = s.open_rounds()
    assert (part, rnd, pushed) == (p, 1, {9}) and age >= 0
    assert list(s.open_rounds(older_than=3600)) == []


def test_bfloat16_parts_are_summed_in_float32():
    s = ServerShard(2)
    one = f32_to_bf16_bits(np.ones(3, np.float32))
    s.init(1, 0, "bfloat16", one)
    p = s.part(1, 0, "t")
    assert p.value.dtype == np.float32
    s.push(p, 9, one)
    s.push(p, 11, f32_to_bf16_bits(np.full(3, 2.5, np.float32)))
    assert bf16_bits_to_f32(p.wire_value(snapshot=False)).tolist() == [3.5] * 3


def test_bfloat16_rounding_is_to_nearest_even():
    x = np.array([1.0, 1.00390625, 1.01171875, -2.0], np.float32)  # 1 + 2^-8 is a tie
    back = bf16_bits_to_f32(f32_to_bf16_bits(x))
    assert back.tolist() == [1.0, 1.0, 1.015625, -2.0]


# -- pulls that name pushes by number (pipelining) ------------------------------------------
def test_a_pull_may_overtake_the_push_it_must_see():
    s, p = shard()
    got = []
    s.pull_after_push(p, 9, 1, lambda part: got.append(part.value.tolist()))  # worker 9's push 1 is not here yet
    assert got == [] and p.early
    s.push(p, 9, f(1))
    assert got == []  # it arrived, but its round is open
    s.push(p, 11, f(2))
    assert got == [[3] * 4] and not p.early
    s.pull_after_push(p, 9, 1, lambda part: got.append(("again", part.round)))  # complete: answered at once
    assert got[-1] == ("again", 1)


def test_consecutive_pushes_of_a_worker_join_consecutive_rounds():
    s, p = shard()
    for v in (1, 2, 3):
        s.push(p, 9, f(v))  # rounds 1, 2, 3 (2 and 3 queued)
    assert [s.round_of_push(p, 9, n) for n in (0, 1, 2, 3, 4)] == [0, 1, 2, 3, None]
    assert s.round_of_push(p, 11, 0) == 0 and s.round_of_push(p, 11, 1) is None
    got = []
    for n in (3, 1, 2):  # pulls for each of them, in any order
        s.pull_after_push(p, 9, n, lambda part, n=n: got.append((n, part.round, part.value[0])))
    s.push(p, 11, f(10))
    assert got == [(1, 1, 11)]
    s.push(p, 11, f(20))
    s.push(p, 11, f(30))
    assert got == [(1, 1, 11), (2, 2, 22), (3, 3, 33)]
    assert [s.round_of_push(p, 9, n) for n in (1, 2, 3)] == [0, 0, 0]  # all complete now


def test_a_refused_push_still_counts_and_waits_like_the_previous_one():
    s, p = shard()
    s.push(p, 9, f(1))  # push 1: round 1, open
    s.skip_push(p, 9)  # push 2 was refused before reaching the shard
    assert s.round_of_push(p, 9, 2) == 1  # a pull after it sees what push 1 joined
    got = []
    s.pull_after_push(p, 9, 2, lambda part: got.append(part.value.tolist()))
    s.pull_after_push(p, 9, 3, lambda part: got.append("push 3"))  # not arrived
    assert got == []
    s.push(p, 11, f(2))
    assert got == [[3] * 4]
    s.skip_push(p, 9)  # push 3 refused too: nothing open, answered at once
    assert got == [[3] * 4, "push 3"]


def test_a_failed_push_is_counted_and_answers_early_pulls():
    s, p = shard(sync=False)  # async without an updater: every push fails
    got = []
    s.pull_after_push(p, 9, 1, lambda part: got.append(part.round))
    with pytest.raises(pskv.InvalidArgumentError):
        s.push(p, 9, f(1))
    assert got == [0] and p.pushes[9].count == 1  # answered instead of waiting forever


def test_async_pulls_wait_only_for_their_push_to_arrive():
    s, p = shard(sync=False)
    s.updater = lambda key, grad, weight: np.add(weight, grad, out=weight)
    got = []
    s.pull_after_push(p, 9, 2, lambda part: got.append(part.value[0]))
    s.push(p, 9, f(1))
    assert got == []
    s.push(p, 9, f(2))
    assert got == [3.0]


def test_fail_waiting_also_fails_early_pulls():
    s, p = shard()
    reasons = []
    s.pull_after_push(p, 9, 1, lambda part: reasons.append("answered"), reasons.append)
    s.push(p, 11, f(1))
    s.pull_after_push(p, 11, 1, lambda part: reasons.append("answered"), reasons.append)
    assert s.fail_waiting("worker 9 died") == 2
    assert reasons == ["worker 9 died", "worker 9 died"] and not p.early and not p.waiting


# -- uneven data: join ------------------------------------------------------------------------
def test_join_completes_the_open_round_and_later_rounds_skip_the_joined_worker():
    s, p = shard(workers=3)
    got = []
    s.pull(p, 1, lambda part: got.append(part.value.tolist()))
    s.push(p, 1, f(1))
    s.push(p, 2, f(2))
    assert p.round == 0 and not got  # waits for worker 3
    assert s.join(3) == [p]  # worker 3 has no more data: round 1 = 1 + 2
    assert p.round == 1 and got == [[3] * 4]
    s.push(p, 1, f(10))
    assert p.round == 1  # still needs worker 2
    s.push(p, 2, f(20))
    assert p.round == 2 and p.value.tolist() == [30] * 4


def test_a_worker_that_pushed_then_joined_still_counts_in_that_round():
    s, p = shard(workers=2)
    s.push(p, 1, f(1))
    assert s.join(1) == []  # its push is in round 1, which still needs worker 2
    s.push(p, 2, f(2))
    assert p.round == 1 and p.value.tolist() == [3] * 4
    s.push(p, 2, f(5))  # round 2: worker 2 alone
    assert p.round == 2 and p.value.tolist() == [5] * 4


def test_when_every_worker_joined_rounds_need_everyone_again():
    s, p = shard(workers=2)
    s.join(1)
    s.push(p, 2, f(2))
    assert p.round == 1
    s.join(2)
    assert s.joined == set()
    s.push(p, 1, f(1))
    assert p.round == 1  # waits for worker 2 again
    s.push(p, 2, f(2))
    assert p.round == 2 and p.value.tolist() == [3] * 4


def test_queued_pushes_of_the_remaining_worker_complete_after_a_join():
    s, p = shard(workers=2)
    s.push(p, 1, f(1))
    s.push(p, 1, f(10))  # queued for round 2
    s.push(p, 1, f(100))  # queued for round 3
    s.join(2)
    assert p.round == 3 and p.value.tolist() == [100] * 4 and not p.queued


def test_a_push_number_is_applied_at_most_once_even_out_of_order_and_across_a_replacement():
    s, p = shard()
    s.updater = lambda key, grad, weight: np.add(weight, grad, out=weight)  # the value: every push summed
    assert not s.landed(p, 9, 1)
    s.push(p, 9, f(1), 1)
    assert s.landed(p, 9, 1) and not s.landed(p, 9, 2)
    s.push(p, 9, f(4), 3)  # overtook push 2: arrives, queued for the next round
    assert s.landed(p, 9, 3) and not s.landed(p, 9, 2) and p.pushes[9].count == 1
    assert s.round_of_push(p, 9, 3) is None  # a pull naming push 3 waits for push 2 too
    s.push(p, 9, f(2), 2)
    assert p.pushes[9].count == 3 and not p.pushes[9].ahead
    assert s.replaced(9) == [(7, 0, 3)] and s.landed(p, 9, 3)  # the rank's counts outlive its process
    s.push(p, 11, f(10), 1)
    s.push(p, 11, f(20), 2)
    s.push(p, 11, f(40), 3)
    assert p.round == 3 and p.value.tolist() == [1 + 4 + 2 + 10 + 20 + 40] * 4  # each push exactly once


def test_a_push_number_far_ahead_is_refused_without_counting():
    s, p = shard()
    with pytest.raises(pskv.InvalidArgumentError, match="^push of key 7: push number 5000 is more than 1024 past"):
        s.landed(p, 9, 5000)
    s.key_names = {7: "fc1_weight"}  # a str key: named as the user wrote it
    with pytest.raises(pskv.InvalidArgumentError, match=r"^push of key 'fc1_weight' \(server key 7\): push number"):
        s.landed(p, 9, 5000)
    s.skip_push(p, 9, 5000)  # the refusal's bookkeeping records nothing either
    assert p.pushes[9].count == 0 and not p.pushes[9].ahead


def test_unnumbered_pushes_after_one_far_ahead_are_refused_not_piled_up():
    s, p = shard(sync=False)
    s.updater = lambda key, grad, weight: np.add(weight, grad, out=weight)
    assert not s.landed(p, 9, 1024)  # the farthest a number may be
    s.push(p, 9, f(1), 1024)
    with pytest.raises(pskv.InvalidArgumentError,
                       match="^push of key 7 by worker 9: push number 1025 is more than 1024 past the 0 push"):
        s.push(p, 9, f(1))  # its next: 1025, one past the bound (was: counted, and so on without end)
    assert p.pushes[9].ahead == {1024} and p.value.tolist() == [1] * 4  # nothing counted or applied
    for n in range(1, 1024):  # the gap filled: count and the running maximum agree again
        s.push(p, 9, f(0), n)
    assert p.pushes[9].count == 1024 and not p.pushes[9].ahead and p.pushes[9].next_number() == 1025
    assert s.push(p, 9, f(1)) == 1025


def test_with_an_updater_every_pull_of_a_round_shares_one_snapshot_and_a_broadcast_renews_it():
    s, p = shard()
    s.updater = lambda key, merged, stored: np.add(stored, merged, out=stored)
    s.push(p, 9, f(1))
    s.push(p, 11, f(1))
    first = p.wire_value(snapshot=True)
    assert p.wire_value(snapshot=True) is first  # one copy per round, not one per pull
    s.push(p, 9, f(1))
    s.push(p, 11, f(1))  # the next round updates the value in place: the snapshot stays as sent
    assert first.tolist() == [2] * 4 and p.wire_value(snapshot=True).tolist() == [4] * 4
    s.overwrite(p, f(7))  # a broadcast: same round, new value
    assert p.wire_value(snapshot=True).tolist() == [7] * 4


def test_the_pieces_of_a_key_are_updated_together_once_every_piece_is_full():
    s = ServerShard(2, True)
    s.init(7, 0, "float32", np.zeros(2, np.float32))
    s.init(7, 2, "float32", np.zeros(2, np.float32))
    a, b = s.part(7, 0, "test"), s.part(7, 2, "test")
    calls = []

    def upd(key, merged, stored):  # sees the whole slice, once per round
        calls.append((key, merged.tolist()))
        stored -= merged

    s.updater = upd
    pulled = []
    s.pull(a, 1, lambda part: pulled.append(part.value.tolist()))
    s.push(a, 9, np.array([1, 2], np.float32))
    s.push(a, 11, np.array([1, 2], np.float32))
    assert a.round == 0 and not calls and not pulled  # piece a is full, b is not: no update yet
    assert s.push(a, 9, np.array([5, 5], np.float32)) == 2  # a's next round queues meanwhile
    s.push(b, 9, np.array([3, 4], np.float32))
    s.push(b, 11, np.array([3, 4], np.float32))
    assert calls == [(7, [2, 4, 6, 8])]
    assert (a.round, b.round) == (1, 1) and pulled == [[-2, -4]] and b.value.tolist() == [-6, -8]
    assert a.pushed == {9}  # the queued push opened round 2


def _sgd_round(s, cuts, r):
    """Round ``r`` of two workers' pushes to a slice of 10 elements held as pieces starting at ``cuts``: its value."""
    ends = [*cuts[1:], 10]
    for worker in (9, 11):
        grad = np.arange(10, dtype=np.float32) * (r + 1) + worker
        for lo, hi in zip(cuts, ends):
            s.push(s.part(7, lo, "test"), worker, grad[lo:hi])
    return np.concatenate([s.part(7, lo, "test").value for lo in cuts])


def _sgd_rounds(allocate, cuts, rounds=3):
    """The slice of :func:`_sgd_round`, SGD with momentum on the server: the value after each round, and the shard."""
    from pskv.optimizer import SGD

    s = ServerShard(2, True, allocate=allocate, workers=(9, 11))
    start = np.linspace(-1, 1, 10, dtype=np.float32)
    for lo, hi in zip(cuts, [*cuts[1:], 10]):
        s.init(7, lo, "float32", start[lo:hi])
    s.updater = SGD(learning_rate=0.1, momentum=0.9).get_updater()
    return [_sgd_round(s, cuts, r) for r in range(rounds)], s


@pytest.mark.parametrize("shared", [False, True])
def test_a_cut_slice_is_updated_in_place_in_one_buffer_as_if_uncut(shared):
    from pskv.transport.shm import ShmDirectory

    directories = [ShmDirectory("pskv-test-shard-") for _ in range(3)] if shared else []
    allocators = [d.create for d in directories] if shared else [None] * 3
    try:
        uncut, _ = _sgd_rounds(allocators[0], [0], rounds=4)
        cut, s = _sgd_rounds(allocators[1], [0, 3, 7])
        if shared:  # the workers map the key's two value files: the whole slice, each part at its offset
            assert [os.path.getsize(directories[1].file(7, 0, name)) for name in ("v0", "v1")] == [40, 40]
        restored = ServerShard(2, True, allocate=allocators[2], workers=(9, 11))  # from a checkpoint: same bytes
        for p, value in s.snapshot():
            restored.restore(7, p.offset, "float32", value, p.round)
        assert [restored.part(7, lo, "test").value.tobytes() for lo in (0, 3, 7)] == [
            s.part(7, lo, "test").value.tobytes() for lo in (0, 3, 7)]
        restored.updater = s.updater  # its momentum, as loaded with the shard
        np.testing.assert_array_equal(_sgd_round(restored, [0, 3, 7], 3), uncut[3])
    finally:
        for directory in directories:
            directory.remove()
    for one, other in zip(uncut, cut, strict=False):  # the same values (and momentum) every round
        np.testing.assert_array_equal(one, other)
    pieces = [s.part(7, lo, "test") for lo in (0, 3, 7)]
    first = pieces[0].value
    whole = first.base if first.base is not None else first
    assert all(np.shares_memory(p.value, whole) for p in pieces)  # views of one buffer ...
    addresses = [p.value.__array_interface__["data"][0] for p in pieces]
    assert [b - a for a, b in zip(addresses, addresses[1:])] == [3 * 4, 4 * 4]  # ... one after the other
    assert not any(np.shares_memory(p.value, p.merge) for p in pieces)
    if shared:  # in shared memory: the key's two files, each part at its offset, the pair kept
        assert all(p.buffers is not None and p.value is p.buffers[0] and p.merge is p.buffers[1] for p in pieces)
    assert [p.value.tolist() for p in pieces] == [cut[-1][0:3].tolist(), cut[-1][3:7].tolist(),
                                                  cut[-1][7:].tolist()]
    assert [v.tolist() for _, v in s.snapshot()] == [cut[-1][0:3].tolist(), cut[-1][3:7].tolist(),
                                                     cut[-1][7:].tolist()]


def test_a_cut_slice_updated_after_rounds_without_an_updater_is_joined_again():
    s = ServerShard(1, True)
    s.init(7, 0, "float32", np.zeros(2, np.float32))
    s.init(7, 2, "float32", np.zeros(2, np.float32))
    a, b = s.part(7, 0, "test"), s.part(7, 2, "test")
    s.push(a, 9, np.ones(2, np.float32))
    s.push(b, 9, np.ones(2, np.float32))  # no updater: the sums replace the values
    s.updater = lambda key, merged, stored: np.subtract(stored, merged, out=stored)
    s.push(a, 9, np.array([1, 2], np.float32))
    s.push(b, 9, np.array([3, 4], np.float32))
    assert a.value.tolist() == [0, -1] and b.value.tolist() == [-2, -3]
    assert a.value.base is not None and a.value.base is b.value.base  # views of one buffer again


def test_a_part_overlapping_one_held_is_refused_with_both_ranges():
    s = ServerShard(2, True)
    s.restore(7, 0, "float32", np.zeros(4, np.float32), rounds=3)  # e.g. from a checkpoint cut otherwise
    with pytest.raises(pskv.InvalidArgumentError, match=r"key 7: .*\[2, 4\) overlaps the part \[0, 4\)"):
        s.init(7, 2, "float32", np.zeros(2, np.float32))
    s.init(7, 4, "float32", np.zeros(2, np.float32))  # adjacent: fine
