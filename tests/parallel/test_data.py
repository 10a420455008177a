"""NDArrayIter: batch contents, last-batch handling, sharding across parts, shuffling, tensors, errors."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from pskv.errors import InvalidArgumentError, InvalidTypeError
from pskv.parallel.data import DataBatch, DataDesc, NDArrayIter

try:
    import torch
except ImportError:  # pragma: no cover - torch is an optional extra
    torch = None  # type: ignore[assignment]


def samples(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Data whose row i is filled with i, and labels i."""
    data = np.repeat(np.arange(n, dtype=np.float32)[:, None, None], 6, axis=2).reshape(n, 2, 3)
    return data, np.arange(n, dtype=np.int64)


def epoch(it: NDArrayIter) -> list[DataBatch]:
    return list(it)


def ids(batches: list[DataBatch]) -> list[list[int]]:
    return [b.index.tolist() for b in batches if b.index is not None]


# ------------------------------------------------------------------ batches


def test_batches_hold_the_rows_of_their_index() -> None:
    data, label = samples(10)
    it = NDArrayIter(data, label, batch_size=4)
    batches = epoch(it)
    assert len(batches) == len(it) == 3
    for b in batches:
        assert b.label is not None and b.index is not None
        assert b.data[0].shape == (4, 2, 3) and b.label[0].shape == (4,)
        np.testing.assert_array_equal(b.data[0], data[b.index])
        np.testing.assert_array_equal(b.label[0], label[b.index])
    assert it.num_data == 10 and it.batch_size == 4


def test_provide_data_and_label() -> None:
    data, label = samples(5)
    it = NDArrayIter({"x": data, "mask": data[:, 0]}, label, batch_size=2)
    assert it.provide_data == [DataDesc("x", (2, 2, 3), "float32"), DataDesc("mask", (2, 3), "float32")]
    assert it.provide_label == [DataDesc("softmax_label", (2,), "int64")]
    name, shape = it.provide_data[0]
    assert (name, shape) == ("x", (2, 2, 3))
    batch = it.next()
    assert batch.provide_data == it.provide_data
    assert [d.shape for d in batch.data] == [(2, 2, 3), (2, 3)]


def test_list_inputs_are_named_by_position_and_labels_are_optional() -> None:
    data, _ = samples(4)
    it = NDArrayIter([data, data[:, 0]], batch_size=4, data_name="in")
    assert [d.name for d in it.provide_data] == ["_0_in", "_1_in"]
    assert it.provide_label == []
    assert it.next().label is None


def test_batch_axis_of_layouts() -> None:
    assert DataDesc.get_batch_axis(None) == 0
    assert DataDesc.get_batch_axis("NCHW") == 0
    assert DataDesc.get_batch_axis("TNC") == 1
    with pytest.raises(InvalidArgumentError, match="'CHW'"):
        DataDesc.get_batch_axis("CHW")
    assert DataDesc.get_list([("a", (1, 2))], [("a", np.float16)]) == [DataDesc("a", (1, 2), "float16")]


# ------------------------------------------------------------------ last batch


def test_pad_wraps_to_the_start() -> None:
    it = NDArrayIter(samples(10)[0], batch_size=4, last_batch_handle="pad")
    batches = epoch(it)
    assert ids(batches) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]
    assert [b.pad for b in batches] == [0, 0, 2]


def test_pad_wraps_more_than_once_when_the_batch_exceeds_the_data() -> None:
    it = NDArrayIter(samples(3)[0], batch_size=7)
    (batch,) = epoch(it)
    assert batch.index is not None and batch.index.tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert batch.pad == 4


def test_discard_drops_the_partial_batch() -> None:
    it = NDArrayIter(samples(10)[0], batch_size=4, last_batch_handle="discard")
    assert len(it) == 2
    assert ids(epoch(it)) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_roll_over_carries_left_overs_into_the_next_epoch() -> None:
    it = NDArrayIter(samples(10)[0], batch_size=4, last_batch_handle="roll_over")
    assert ids(epoch(it)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    it.reset()
    assert len(it) == 3
    assert ids(epoch(it)) == [[8, 9, 0, 1], [2, 3, 4, 5], [6, 7, 8, 9]]
    it.reset()
    assert len(it) == 2
    it.hard_reset()  # mid-epoch: nothing carried
    assert ids(epoch(it)) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_the_epoch_ends_until_reset() -> None:
    it = NDArrayIter(samples(4)[0], batch_size=2)
    assert iter(it) is it
    assert len(epoch(it)) == 2
    assert epoch(it) == []
    with pytest.raises(StopIteration):
        it.next()
    it.reset()
    assert len(epoch(it)) == 2


# ------------------------------------------------------------------ sharding and shuffling


@pytest.mark.parametrize("num_parts", [2, 3])
@pytest.mark.parametrize("n", [10, 11, 12, 13])
@pytest.mark.parametrize("shuffle", [False, True])
def test_parts_are_equal_disjoint_and_cover_the_data(num_parts: int, n: int, shuffle: bool) -> None:
    data, label = samples(n)
    parts = [
        NDArrayIter(data, label, batch_size=2, shuffle=shuffle, num_parts=num_parts, part_index=p, seed=7)
        for p in range(num_parts)
    ]
    shards = [[i for batch in ids(epoch(it)) for i in batch] for it in parts]
    per_part = -(-n // num_parts)
    assert {it.num_data for it in parts} == {per_part}
    assert {len(it) for it in parts} == {-(-per_part // 2)}
    flat = [i for s in shards for i in s[:per_part]]  # without the last batch's pad filler
    assert set(flat) == set(range(n))
    repeated = sorted(i for i, count in Counter(flat).items() if count > 1)
    assert all(count <= 2 for count in Counter(flat).values())
    assert len(repeated) == per_part * num_parts - n  # only the wrap-around samples repeat
    if not shuffle:
        assert repeated == list(range(per_part * num_parts - n))  # the epoch's first samples


def test_parts_see_one_shared_permutation() -> None:
    data, _ = samples(12)
    whole = NDArrayIter(data, batch_size=12, shuffle=True, seed=3)
    parts = [NDArrayIter(data, batch_size=4, shuffle=True, num_parts=3, part_index=p, seed=3) for p in range(3)]
    for _ in range(2):  # two epochs: seed + epoch on every part
        order = whole.next().index
        assert order is not None
        for p, it in enumerate(parts):
            assert [i for b in ids(epoch(it)) for i in b] == order[p::3].tolist()
            it.reset()
        whole.reset()


def test_shuffle_changes_per_epoch_and_repeats_per_seed() -> None:
    data, _ = samples(20)
    a, b = (
        NDArrayIter(data, batch_size=20, shuffle=True, seed=1),
        NDArrayIter(data, batch_size=20, shuffle=True, seed=1),
    )
    first = ids(epoch(a))
    assert first == ids(epoch(b)) and first != [list(range(20))]
    a.reset()
    assert ids(epoch(a)) != first
    assert sorted(ids(epoch(NDArrayIter(data, batch_size=20, shuffle=True)))[0]) == list(range(20))


def test_set_epoch_reproduces_any_epoch() -> None:
    data, _ = samples(9)
    run = NDArrayIter(data, batch_size=4, shuffle=True, seed=5, last_batch_handle="roll_over")
    seen = []
    for e in range(3):
        run.set_epoch(e)  # what fit() calls; e == epoch + 1 behaves like reset()
        seen.append(ids(epoch(run)))
    (left_over,) = set(range(9)) - {i for b in seen[0] for i in b}
    assert seen[1][0][0] == left_over  # epoch 0's left-over sample leads epoch 1
    resumed = NDArrayIter(data, batch_size=4, shuffle=True, seed=5, last_batch_handle="discard")
    resumed.set_epoch(2)
    plain = NDArrayIter(data, batch_size=4, shuffle=True, seed=5, last_batch_handle="discard")
    plain.reset()
    plain.reset()
    assert ids(epoch(resumed)) == ids(epoch(plain))
    with pytest.raises(InvalidArgumentError, match="epoch must be an int >= 0, got -1"):
        resumed.set_epoch(-1)


# ------------------------------------------------------------------ tensors


@pytest.mark.skipif(torch is None, reason="needs torch")
def test_torch_inputs_give_torch_batches() -> None:
    data, label = samples(5)
    it = NDArrayIter(torch.from_numpy(data), torch.from_numpy(label), batch_size=2, shuffle=True, seed=0)
    assert it.provide_data[0].dtype == "float32" and it.provide_label[0].dtype == "int64"
    for batch in it:
        assert batch.label is not None and batch.index is not None
        assert isinstance(batch.data[0], torch.Tensor) and isinstance(batch.label[0], torch.Tensor)
        np.testing.assert_array_equal(batch.data[0].numpy(), data[batch.index])
        np.testing.assert_array_equal(batch.label[0].numpy(), label[batch.index])


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"label": np.zeros(3)}, r"numbers of samples.*'data': 4.*'softmax_label': 3"),
        ({"batch_size": 0}, "batch_size must be an int >= 1, got 0"),
        ({"num_parts": 0}, "num_parts must be an int >= 1, got 0"),
        ({"num_parts": 2, "part_index": 2}, "part_index 2 is out of range for num_parts 2"),
        ({"part_index": -1}, "part_index -1"),
        ({"last_batch_handle": "keep"}, "last_batch_handle must be one of pad, discard, roll_over, got 'keep'"),
        ({"last_batch_handle": "discard", "batch_size": 5}, "batch_size 5 exceeds the 4 samples"),
        ({"shuffle": True, "num_parts": 2}, "needs a seed"),
        ({"label": {"data": np.zeros(4)}}, "duplicate"),
        ({"seed": 1.5}, "seed must be an int"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        NDArrayIter(np.zeros((4, 2)), **kwargs)


def test_bad_data() -> None:
    with pytest.raises(InvalidArgumentError, match="scalar"):
        NDArrayIter(np.float32(1.0))
    with pytest.raises(InvalidArgumentError, match="no samples"):
        NDArrayIter(np.zeros((0, 2)))
    with pytest.raises(InvalidTypeError, match="not a numeric array"):
        NDArrayIter({"x": [object(), object()]})
