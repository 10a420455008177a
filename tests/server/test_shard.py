"""Server-side aggregation rules, without any I/O."""

from __future__ import annotations

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
    assert s.stalled() == []
    s.push(p, 9, f(1))
    [(pid, rnd, pushed, age)] = s.stalled()
    assert (pid, rnd, pushed) == ((7, 0), 1, {9}) and age >= 0
    assert s.stalled(older_than=3600) == []


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
