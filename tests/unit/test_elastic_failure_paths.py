"""hvd.elastic's failure paths: misused states and samplers, a departure that a commit returns.

A state copies its attributes at every commit and sends rank 0's pickled at a sync. An attribute that cannot
be copied (a lock) is named in an InvalidArgumentError; one rank 0 cannot pickle is told to every rank (a
length of -1), so the others raise too instead of waiting for pieces that never come. An ElasticSampler needs
a dataset with a len(), and says (rank 0, a warning) when it is smaller than the workers: every share is empty.
A departure right after a commit's release comes back from that commit on some members (a voiding view) and
as MembershipChangedError on the others, who restore and sync: the first ones must sync too.
"""

from __future__ import annotations

import threading
from unittest import mock

import pytest

torch = pytest.importorskip("torch")

from pskv.errors import InvalidArgumentError  # noqa: E402
from pskv.kvstore import StoreType  # noqa: E402
from pskv.protocol.bodies import View  # noqa: E402
from pskv.torch import elastic, runtime  # noqa: E402
from pskv.torch.elastic_sampler import ElasticSampler  # noqa: E402


def test_a_state_attribute_that_cannot_be_copied_is_named():
    with pytest.raises(InvalidArgumentError, match="attribute 'guard': a lock cannot be copied"):
        elastic.ObjectState(epoch=0, guard=threading.Lock())
    state = elastic.ObjectState(epoch=0, guard=None)
    state.guard = threading.Lock()  # type: ignore[attr-defined]
    with pytest.raises(InvalidArgumentError, match="attribute 'guard'"):
        state.save()


@pytest.mark.parametrize("rank", [0, 1])
def test_an_object_rank_0_cannot_pickle_fails_the_sync_on_every_rank(rank):
    lengths = []

    def broadcast(tensor, root_rank, name=None):  # rank 0's length, as a real broadcast delivers it
        if name.endswith(".length"):
            lengths.append(int(tensor[0]))
            if rank:
                tensor[0] = -1  # what rank 0 sends when it cannot pickle
        return tensor

    with mock.patch.object(runtime, "rank", lambda: rank), mock.patch.object(elastic.ops, "broadcast_", broadcast):
        with pytest.raises(InvalidArgumentError, match="'objects': rank 0's cannot be pickled"):
            elastic.broadcast_state_object({"gen": (i for i in range(3))}, "objects")
    assert lengths == ([-1] if rank == 0 else [0])  # rank 0 told the others before raising


def test_an_elastic_sampler_needs_a_dataset_with_a_len_and_warns_when_it_is_smaller_than_the_workers(caplog):
    with pytest.raises(InvalidArgumentError, match=r"the dataset \(a generator\) has no len\(\)"):
        ElasticSampler(i for i in range(3))
    with mock.patch.object(runtime, "size", lambda: 4), mock.patch.object(runtime, "rank", lambda: 0):
        sampler = ElasticSampler(range(3))  # type: ignore[arg-type]
    assert len(sampler) == 0
    assert "a dataset of 3 samples over 4 workers gives every worker an empty share" in caplog.text


class CommitOnce:
    """An elastic job's store whose one commit returns ``view`` (as :mod:`pskv.torch.elastic` uses a store)."""

    def __init__(self, view: View) -> None:
        self.view, self.outcome, self.rank, self.num_workers = View(1, (0, 1, 2), 0, "start"), view, 0, 3

    def commit(self) -> View:
        return self.outcome


@pytest.mark.parametrize(("cause", "skip_sync"), [("failure", False), ("drain", True)])
def test_a_view_a_commit_returns_without_joiners_syncs_unless_nothing_was_voided(cause, skip_sync):
    before = runtime._runtime
    store = CommitOnce(View(2, (0, 1), 1, cause))
    runtime._runtime = runtime.Runtime(store, StoreType.parse("dist_sync"), owned=False)  # type: ignore[arg-type]
    try:
        with pytest.raises(elastic.HostsUpdatedInterrupt) as raised:
            elastic.ObjectState(epoch=0).commit()
    finally:
        runtime._runtime = before
    assert raised.value.skip_sync is skip_sync
