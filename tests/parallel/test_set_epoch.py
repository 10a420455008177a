"""fit() calls set_epoch(epoch) on a DataLoader's DistributedSampler, so each epoch is shuffled anew,
alike on every worker (torch leaves that call to the training loop)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler  # noqa: E402

import pskv  # noqa: E402
from pskv.parallel import DataParallelExecutorGroup, NDArrayIter, Trainer  # noqa: E402
from pskv.parallel.data import begin_epoch  # noqa: E402
from pskv.testing import InProcessCluster  # noqa: E402

N, BATCH, EPOCHS, SEED = 40, 4, 3, 3


class Recording(Dataset):  # type: ignore[type-arg]
    """A small classification set that records the order its samples are read in."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.y = torch.randint(0, 3, (N,), generator=g)
        self.x = torch.randn(N, 5, dtype=torch.float64, generator=g) + torch.eye(3, 5, dtype=torch.float64)[self.y]
        self.seen: list[int] = []

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.seen.append(int(i))
        return self.x[i], self.y[i]


def sampler_order(rank: int, epoch: int) -> list[int]:
    """DistributedSampler's own order for ``rank`` in ``epoch``."""
    sampler: DistributedSampler[int] = DistributedSampler(Recording(), num_replicas=2, rank=rank, shuffle=True,
                                                         seed=SEED)
    sampler.set_epoch(epoch)
    return list(sampler)


def test_dist_fit_over_a_distributed_sampler_shuffles_every_epoch_as_the_sampler_does():
    def worker(cfg):
        kv = pskv.create("dist_sync", cluster=cfg)
        try:
            data = Recording()
            loader = DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(
                data, num_replicas=kv.num_workers, rank=kv.rank, shuffle=True, seed=SEED))
            model = torch.nn.Linear(5, 3).double()
            group = DataParallelExecutorGroup(model, ["cpu"], loss=torch.nn.CrossEntropyLoss())
            with Trainer(group, "sgd", {"learning_rate": 0.1}, kvstore=kv) as trainer:
                trainer.fit(loader, num_epoch=EPOCHS, progress=False)
            per_epoch = len(data.seen) // EPOCHS
            return ([data.seen[e * per_epoch:(e + 1) * per_epoch] for e in range(EPOCHS)],
                    [p.detach().clone() for p in model.parameters()])
        finally:
            kv.close()

    with InProcessCluster(1, 2, deadline=30) as cluster:
        results = cluster.run_workers(worker)
    for rank, (orders, _) in enumerate(results):
        assert orders == [sampler_order(rank, e) for e in range(EPOCHS)]
        assert len({tuple(o) for o in orders}) == EPOCHS, f"rank {rank} saw the same order in two epochs"
    for e in range(EPOCHS):  # the shards of an epoch are disjoint: the same permutation on both workers
        assert not set(results[0][0][e]) & set(results[1][0][e])
    for p, q in zip(results[0][1], results[1][1]):
        assert torch.equal(p, q)


def test_begin_epoch_reaches_every_form_of_sampler_once_and_iterators_as_before():
    data = Recording()
    calls: list[tuple[str, int]] = []

    class Counting(DistributedSampler):  # type: ignore[type-arg]
        def set_epoch(self, epoch: int) -> None:
            calls.append(("sampler", epoch))
            super().set_epoch(epoch)

    plain = DataLoader(data, batch_size=BATCH, sampler=Counting(data, num_replicas=2, rank=0, seed=SEED))
    begin_epoch(plain, 2)  # loader.sampler is also loader.batch_sampler.sampler: called once
    assert calls == [("sampler", 2)]
    batched = DataLoader(data, batch_sampler=BatchSampler(Counting(data, num_replicas=2, rank=1, seed=SEED),
                                                          BATCH, drop_last=False))
    begin_epoch(batched, 5)
    assert calls == [("sampler", 2), ("sampler", 5)]
    assert [i for b in batched.batch_sampler for i in b] == sampler_order(1, 5)
    begin_epoch(DataLoader(data, batch_size=BATCH, shuffle=True), 1)  # a RandomSampler has no set_epoch

    it = NDArrayIter(data.x.numpy(), data.y.numpy(), batch_size=BATCH, shuffle=True, seed=SEED)
    begin_epoch(it, 3)
    assert it.epoch == 3

    class Resettable:
        resets = 0

        def reset(self) -> None:
            self.resets += 1

    r = Resettable()
    begin_epoch(r, 4)
    assert r.resets == 1
