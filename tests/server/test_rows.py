"""pskv.server.rows: a row-sparse part's rows checked, merged and applied (no I/O)."""

from __future__ import annotations

import numpy as np
import pytest

from pskv.errors import InvalidArgumentError
from pskv.optimizer import SGD
from pskv.server.part_init import named_key
from pskv.server.rows import RowBatch, RowsWhat, apply, check_fits, checked_ids, joined, merge


def test_ids_are_checked_against_the_range_before_use():
    assert checked_ids(np.array([10, 12, 19]), 10, 10, "push").tolist() == [0, 2, 9]
    for ids, match in (([10, 20], "outside this server's range"), ([9], "outside"), ([12, 11], "sorted and unique"),
                       ([12, 12], "12 is followed by 12"), (list(range(10, 21)), "11 rows, more than the 10")):
        with pytest.raises(InvalidArgumentError, match=match):
            checked_ids(np.array(ids, np.int64), 10, 10, "push of row-sparse key 7 from worker 1")


def test_rows_errors_name_a_str_key_and_look_its_name_up_only_when_one_is_raised():
    looked: list[int] = []

    def named(key: int) -> str:
        looked.append(key)
        return named_key(key, {7: "emb"})

    what = RowsWhat("push", 7, 11, named)  # node 11: worker 1
    assert checked_ids(np.array([10, 12]), 10, 10, what).tolist() == [0, 2]
    check_fits(10, 2, 4, 0, 80, what)
    assert looked == []  # a message that passes makes no text
    with pytest.raises(InvalidArgumentError, match=r"^push of row-sparse key 'emb' \(server key 7\) from worker 1: "
                                                   r"row ids \[30\] outside"):
        checked_ids(np.array([30]), 10, 10, what)
    with pytest.raises(InvalidArgumentError, match=r"^push of row-sparse key 'emb' \(server key 7\) .*TABLE_BYTES"):
        check_fits(10, 2, 4, 8, 80, what)
    assert str(RowsWhat("pull", 8, 9, named)) == "pull of row-sparse key 8 from worker 0"  # an int key as it is


def test_a_rounds_rows_are_summed_by_id():
    a = RowBatch(np.array([1, 4]), np.ones((2, 2), np.float32))
    b = RowBatch(np.array([0, 4]), np.full((2, 2), 2, np.float32))
    m = merge([a, b], 2, np.dtype(np.float32))
    assert m.ids.tolist() == [0, 1, 4] and m.rows[:, 0].tolist() == [2, 1, 3]
    disjoint = merge([RowBatch(np.array([5]), np.ones((1, 2))), RowBatch(np.array([2]), np.zeros((1, 2)))], 2,
                     np.dtype(np.float64))
    assert disjoint.ids.tolist() == [2, 5] and disjoint.rows[:, 0].tolist() == [0, 1]
    assert merge([], 2, np.dtype(np.float32)).rows.shape == (0, 2)


def test_present_rows_grow_without_sorting_the_table_again():
    present = np.array([1, 5, 9])
    assert joined(present, np.array([0, 5, 10]), 20).tolist() == [0, 1, 5, 9, 10]
    assert joined(present, np.array([5, 9]), 20) is present  # nothing new: no copy
    every = np.arange(4)
    assert joined(every, np.array([2]), 4) is every


def test_without_an_updater_the_sum_replaces_the_value_and_with_one_only_pushed_rows_change():
    table = np.zeros((6, 2), np.float32)
    table[[1, 3]] = 7
    present = apply(table, np.array([1, 3]), RowBatch(np.array([3, 4]), np.ones((2, 2), np.float32)), 0, None, False)
    assert present.tolist() == [3, 4] and table[:, 0].tolist() == [0, 0, 0, 1, 1, 0]
    updater = SGD(learning_rate=0.5, momentum=0.9).get_updater()
    present = apply(table, present, RowBatch(np.array([0]), np.ones((1, 2), np.float32)), 0, updater, False)
    assert present.tolist() == [0, 3, 4] and table[:, 0].tolist() == [-0.5, 0, 0, 1, 1, 0]
    present = apply(table, present, RowBatch(np.array([5]), np.ones((1, 2), np.float32)), 0, None, True)  # summed
    assert present.tolist() == [0, 3, 4, 5] and table[5, 0] == 1


def test_a_summed_key_stores_a_sync_rounds_plain_sum_even_with_an_updater_and_adds_async_pushes():
    """``summed`` keys (pskv.torch's sparse gradients): a sync round's rows replace the value, as a dense summed
    key's sum does, whatever updater the servers run; a dist_async push is added."""
    table = np.zeros((6, 2), np.float32)
    updater = SGD(learning_rate=0.5).get_updater()
    present = apply(table, np.array([], np.int64), RowBatch(np.array([1, 2]), np.ones((2, 2), np.float32)), 0,
                    updater, True, sync=True)
    present = apply(table, present, RowBatch(np.array([2, 4]), np.full((2, 2), 3, np.float32)), 0, updater, True,
                    sync=True)
    assert present.tolist() == [2, 4] and table[:, 0].tolist() == [0, 0, 3, 0, 3, 0]
    present = apply(table, present, RowBatch(np.array([4]), np.ones((1, 2), np.float32)), 0, None, True)  # async
    assert present.tolist() == [2, 4] and table[:, 0].tolist() == [0, 0, 3, 0, 4, 0]
