"""``hvd.elastic``'s loop and states without a job: a scripted store stands in for an elastic job's.

The store's ``commit()`` returns (or raises) what each test scripts, so :func:`~pskv.torch.elastic.run`'s
rules can be checked one by one: restore after MembershipChangedError, no restore after a
HostsUpdatedInterrupt, sync skipped only after removals, the reset callbacks, the two-phase commit
(a failed commit leaves the previous one as the restore point), and the refusals of stores that
cannot be elastic. tests/torch/test_elastic_torch.py runs the same API in a real job.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import pskv.torch as hvd  # noqa: E402
from pskv.errors import MembershipChangedError, NotSupportedError  # noqa: E402
from pskv.kvstore import StoreType  # noqa: E402
from pskv.protocol.bodies import View  # noqa: E402
from pskv.torch import elastic, runtime  # noqa: E402


class ScriptedStore:
    """An elastic job's store, as :mod:`pskv.torch.elastic` uses it; ``commits``: what each commit gives."""

    def __init__(self) -> None:
        self.view: View | None = View(1, (0, 1, 2))
        self.commits: list[Any] = []
        self.restores = 0
        self.num_workers = 3
        self.rank = 0

    def commit(self) -> View | None:
        outcome = self.commits.pop(0) if self.commits else None
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome is not None:
            self.view, self.num_workers = outcome, len(outcome.members)
        return outcome

    def restore(self) -> View | None:
        self.restores += 1
        return self.view


@pytest.fixture
def store() -> Iterator[ScriptedStore]:
    made, before = ScriptedStore(), runtime._runtime
    runtime._runtime = runtime.Runtime(made, StoreType.parse("dist_sync"), owned=False)  # type: ignore[arg-type]
    try:
        yield made
    finally:
        runtime._runtime = before


class Counted(elastic.ObjectState):
    """An ObjectState whose sync is counted (a real sync broadcasts: tests/torch/test_elastic_torch.py)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[str] = []

    def sync(self) -> None:
        self.calls.append("sync")

    def restore(self) -> None:
        self.calls.append("restore")
        super().restore()


def departure() -> MembershipChangedError:
    return MembershipChangedError("slot 2 died", epoch=2, slot=2)


def test_hvd_elastic_has_horovods_names():
    assert hvd.elastic.HorovodInternalError is MembershipChangedError
    assert issubclass(hvd.elastic.WorkersAvailableException, hvd.elastic.HostsUpdatedInterrupt)
    assert not hvd.elastic.WorkersAvailableException().skip_sync
    assert hvd.elastic.ElasticSampler is hvd.elastic.ElasticSampler and callable(hvd.elastic.run)


def test_a_departure_restores_the_last_commit_syncs_and_redoes(store):
    state = Counted(step=0)
    store.commits = [None, departure()]
    resets: list[int] = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    @hvd.elastic.run
    def train(state: Counted) -> int:
        while state.step < 3:
            state.step += 1
            state.commit()
        return state.step

    assert train(state) == 3
    assert store.restores == 1
    assert state.calls == ["sync", "restore", "sync"]  # step 2's commit failed: redone from step 1
    assert resets == [3]


def test_a_failed_commit_leaves_the_previous_one_as_the_restore_point(store):
    state = elastic.ObjectState(step=0, log=[])
    state.step, state.log = 1, ["a"]
    state.commit()
    state.step = 2
    state.log.append("b")
    store.commits = [departure()]
    with pytest.raises(MembershipChangedError):
        state.commit()  # saved into the pending copy, never promoted
    state.restore()
    assert (state.step, state.log) == (1, ["a"])
    state.log.append("c")
    state.restore()
    assert state.log == ["a"]  # the restore point is a copy


def test_workers_joining_interrupt_with_a_sync_and_removals_without(store):
    state = Counted(step=0)
    store.commits = [View(2, (0, 1, 2, 3), 1, "grow"), View(3, (0, 1), 2, "drain")]
    seen: list[type] = []

    @hvd.elastic.run
    def train(state: Counted) -> None:
        while state.step < 3:
            state.step += 1
            try:
                state.commit()
            except hvd.elastic.HostsUpdatedInterrupt as exc:
                seen.append(type(exc))
                raise

    train(state)
    assert seen == [hvd.elastic.WorkersAvailableException, hvd.elastic.HostsUpdatedInterrupt]
    assert state.calls == ["sync", "sync"]  # synced after the join, not after the drain; never restored
    assert store.restores == 0 and state.step == 3


def test_check_host_updates_is_a_commit(store):
    state = elastic.ObjectState(step=0)
    state.step = 5
    store.commits = [View(2, (0, 1, 2, 3), 1, "grow")]
    with pytest.raises(hvd.elastic.WorkersAvailableException):
        state.check_host_updates()
    state.step = 6
    state.restore()
    assert state.step == 5


def test_torch_state_restores_the_model_and_optimizer_of_the_last_commit(store):
    model = torch.nn.Linear(2, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.5)
    state = hvd.elastic.TorchState(model, opt, epoch=0)

    def step() -> None:
        opt.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
    step()
    state.epoch = 1
    state.commit()
    committed = (model.weight.detach().clone(), opt.state_dict()["state"][0]["momentum_buffer"].clone())
    step()
    state.epoch = 2
    state.restore()
    assert torch.equal(model.weight, committed[0]) and state.epoch == 1
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], committed[1])
    other = torch.nn.Linear(2, 1, bias=False)
    state.model = other  # the new model is the one saved from now on
    state.commit()
    saved = other.weight.detach().clone()
    with torch.no_grad():
        other.weight.add_(1.0)
    state.restore()
    assert torch.equal(other.weight, saved)


def test_stores_that_cannot_be_elastic_are_refused_with_the_reason(store):
    @hvd.elastic.run
    def train(state: Any) -> None:
        raise AssertionError("not reached")

    store.view = None
    with pytest.raises(NotSupportedError, match="not elastic: start it with pskv launch -n MIN:MAX"):
        train(elastic.ObjectState())
    with pytest.raises(NotSupportedError, match="not elastic"):
        elastic.ObjectState(x=1).commit()
    runtime._runtime = runtime.Runtime(store, StoreType.parse("horovod"), owned=False)  # type: ignore[arg-type]
    with pytest.raises(NotSupportedError, match="'horovod' store: elastic training needs servers"):
        train(elastic.ObjectState())


def test_an_object_sync_is_bounded_before_anything_is_received(store, monkeypatch):
    # a non-root rank learns the pickled size first: past the limit it raises, receiving (and unpickling) nothing
    from pskv.errors import InvalidArgumentError

    store.rank = 1
    monkeypatch.setattr(runtime, "rank", lambda: 1)
    sent = []

    def broadcast_(tensor, root, name):
        sent.append(name)
        if name.endswith(".length"):
            tensor[0] = elastic.MAX_BYTES + 1  # what a hostile or broken rank 0 would say

    monkeypatch.setattr(elastic.ops, "broadcast_", broadcast_)
    with pytest.raises(InvalidArgumentError, match="over the 1073741824-byte limit"):
        elastic.broadcast_state_object({"a": 1}, "objects")
    assert sent == ["elastic.objects.length"]
