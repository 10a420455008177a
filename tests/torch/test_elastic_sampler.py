"""``hvd.elastic.ElasticSampler`` and :mod:`pskv.parallel.elastic_data` without a job: ranks simulated.

The sampler asks ``pskv.torch``'s runtime for the size and rank; here each simulated rank's
sampler is made (and re-partitioned) under a patched ``size()``/``rank()``. The property test runs
an epoch through changing worker sets and checks the promises: equal shares, no sample twice,
``processed_num`` exact (the samples processed are exactly the first ``processed_num`` of the
epoch's order) and the same state on every rank.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from pskv.errors import InvalidArgumentError  # noqa: E402
from pskv.parallel.elastic_data import advanced, epoch_order, partition  # noqa: E402
from pskv.torch import runtime  # noqa: E402
from pskv.torch.elastic_sampler import ElasticSampler  # noqa: E402


@contextlib.contextmanager
def as_rank(rank: int, size: int) -> Iterator[None]:
    with mock.patch.object(runtime, "size", lambda: size), mock.patch.object(runtime, "rank", lambda: rank):
        yield


def samplers(n: int, size: int, state: dict[str, int] | None = None, **kw: object) -> list[ElasticSampler]:
    """One sampler per rank of ``size``, each with ``state`` loaded (as a sync and a reset leave them)."""
    made = []
    for rank in range(size):
        with as_rank(rank, size):
            s = ElasticSampler(range(n), **kw)  # type: ignore[arg-type]
            if state is not None:
                s.load_state_dict(state)
        made.append(s)
    return made


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 50), seed=st.integers(0, 3), batch=st.integers(1, 4), shuffle=st.booleans(),
       phases=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 8)), min_size=1, max_size=5))
def test_an_epoch_through_changing_workers_sees_no_sample_twice_and_counts_exactly(n, seed, batch, shuffle, phases):
    state = {"epoch": 0, "processed_num": 0}
    seen: list[int] = []
    for size, batches in phases:
        ranks = samplers(n, size, state, shuffle=shuffle, seed=seed)
        share = (n - state["processed_num"]) // size
        assert [len(s) for s in ranks] == [share] * size  # equal shares: the ranks step alike
        taken = min(batches, -(-share // batch))  # the last batch may be short
        for b in range(taken):
            for s in ranks:
                seen += s.get_indices(b, batch)
                s.record_batch(b, batch)
        states = [s.state_dict() for s in ranks]
        assert all(st == states[0] for st in states)
        assert states[0]["processed_num"] == state["processed_num"] + min(taken * batch, share) * size
        state = states[0]
    assert len(seen) == len(set(seen))
    order = epoch_order(n, seed, 0, shuffle).tolist()
    assert sorted(seen) == sorted(order[:state["processed_num"]])  # exactly the first processed_num are done


def test_the_shares_are_strided_over_the_epochs_order_and_iterate_as_a_dataloader_sampler():
    r0, r1 = samplers(10, 2, seed=3)
    order = epoch_order(10, 3, 0).tolist()
    assert list(r0) == order[0::2] and list(r1) == order[1::2]
    loader = torch.utils.data.DataLoader(list(range(100, 110)), batch_size=2, sampler=r0)
    assert [b.tolist() for b in loader] == [[100 + i for i in order[0:4:2]], [100 + i for i in order[4:8:2]],
                                            [100 + order[8]]]


def test_no_padding_the_rest_is_skipped_not_repeated():
    ranks = samplers(10, 3, shuffle=False)
    assert [list(s) for s in ranks] == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]  # sample 9 is skipped this epoch


def test_set_epoch_starts_a_new_order_with_nothing_processed():
    (s,) = samplers(20, 1, seed=5)
    s.record_batch(0, 4)
    assert s.processed_num == 4
    with as_rank(0, 1):
        s.set_epoch(1)
    assert s.state_dict() == {"epoch": 1, "processed_num": 0}
    assert list(s) == epoch_order(20, 5, 1).tolist() != epoch_order(20, 5, 0).tolist()


def test_a_state_taken_back_shares_the_rest_out_over_the_new_size():
    r = samplers(12, 3, shuffle=False)
    for s in r:
        s.record_batch(0, 2)
    state = r[0].state_dict()
    assert state == {"epoch": 0, "processed_num": 6}
    two = samplers(12, 2, state, shuffle=False)
    assert [list(s) for s in two] == [[6, 8, 10], [7, 9, 11]]
    assert two[1].get_indices(1, 2) == [11] and two[1].num_samples == 3


def test_record_indices_counts_this_ranks_samples_times_the_ranks():
    r0, _ = samplers(8, 2, shuffle=False)
    r0.record_indices(r0.get_indices(0, 3))
    assert r0.processed_num == advanced(0, 3, 2) == 6


def test_bad_arguments_are_refused():
    (s,) = samplers(4, 1)
    with pytest.raises(InvalidArgumentError):
        s.get_indices(-1, 2)
    with pytest.raises(InvalidArgumentError, match="rank 2 of 2"):
        partition(4, 0, 0, 0, 2, 2)
    with pytest.raises(InvalidArgumentError, match="5 samples processed"):
        partition(4, 0, 0, 5, 0, 1)
