"""``ElasticSampler``: Horovod's sampler of an elastic job, which shares what is left of the epoch out again.

``hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0)`` has Horovod's surface
(``horovod/torch/elastic/sampler.py``): a ``DataLoader`` takes it as its ``sampler``, the training
loop calls :meth:`~ElasticSampler.record_batch` after each batch and
:meth:`~ElasticSampler.set_epoch` at the end of each epoch, and a
:class:`~pskv.torch.elastic.TorchState` that holds it saves, restores and broadcasts its
``state_dict`` (the epoch and the samples processed) and calls :meth:`~ElasticSampler.reset` when
the workers change, which shares the rest of the epoch out over the new set.

The rule is :func:`pskv.parallel.elastic_data.partition` (the one ``fit(elastic=True)`` uses too).
**Deliberate difference from Horovod:** no padding. Horovod pads every share to the same length
with samples from the start of the rest, so a sample can be seen twice in an epoch; here every
share has ``len(rest) // size`` samples and the last ``len(rest) % size`` of the epoch's order are
skipped at each re-partition (fewer than ``size`` samples). Equal shares keep the workers' step
counts, and so their synchronous rounds, in step; a dataset smaller than the workers gives every share
nothing (rank 0 logs a warning at each re-partition).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from pskv.errors import InvalidArgumentError
from pskv.parallel.elastic_data import advanced, partition
from pskv.torch import runtime

__all__ = ["ElasticSampler"]

log = logging.getLogger("pskv.torch")


class ElasticSampler(torch.utils.data.Sampler[int]):
    """Samples of ``dataset`` for this rank: its share of the epoch's order after ``processed_num`` samples.

    Args:
        dataset: anything with ``len()`` (its size must not change).
        shuffle: a new order each epoch, drawn from ``seed + epoch`` (the same on every rank); False: ``0..n-1``.
        seed: the shuffle's seed; every rank must pass the same.

    Raises:
        InvalidArgumentError: ``dataset`` has no ``len()``.

    Attributes:
        epoch, processed_num: what :meth:`state_dict` saves; ``processed_num`` samples of the epoch's order
            are done, by every rank together.
        rank, num_replicas: the rank and size the current share was made for (:meth:`reset`).
        indices: this rank's share (the sample indices :meth:`__iter__` yields).
    """

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        if not hasattr(dataset, "__len__"):
            raise InvalidArgumentError(f"ElasticSampler: the dataset (a {type(dataset).__name__}) has no len(): "
                                       "a sampler shares out sample indices, so it needs a map-style dataset")
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.rank = 0
        self.num_replicas = 1
        self.indices: list[int] = []
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` with nothing processed (call it at the *end* of an epoch, as in Horovod:
        then a restart within the epoch does not process its samples again)."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Batch ``batch_idx`` of ``batch_size`` samples of this share is done, on every rank alike.

        Counts the samples that batch really has (the share's last batch may be short), times the ranks.
        """
        self.processed_num = advanced(self.processed_num, len(self.get_indices(batch_idx, batch_size)),
                                      self.num_replicas)

    def record_indices(self, indices: Iterable[int]) -> None:
        """``indices`` of this share are done, and as many of every other rank's (the shares are equal)."""
        self.processed_num = advanced(self.processed_num, len(list(indices)), self.num_replicas)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """The sample indices of batch ``batch_idx`` of ``batch_size`` in this rank's share."""
        if batch_idx < 0 or batch_size < 1:
            raise InvalidArgumentError(f"ElasticSampler: batch {batch_idx} of size {batch_size}")
        start = batch_idx * batch_size
        return self.indices[start:start + batch_size]

    def state_dict(self) -> dict[str, int]:
        """``{"epoch": ..., "processed_num": ...}``: what a commit saves and a sync broadcasts (Horovod's keys)."""
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Take a :meth:`state_dict` back, and share the rest of its epoch out again (:meth:`reset`)."""
        self.epoch = int(state_dict["epoch"])
        self.processed_num = int(state_dict["processed_num"])
        self.reset()

    def reset(self) -> None:
        """Share the rest of the epoch out over the job's current workers (``hvd.size()``, ``hvd.rank()``)."""
        self.num_replicas = runtime.size()
        self.rank = runtime.rank()
        done = min(self.processed_num, len(self.dataset))
        if 0 < len(self.dataset) < self.num_replicas and self.rank == 0:
            log.warning("ElasticSampler: a dataset of %d samples over %d workers gives every worker an empty share "
                        "(shares are equal and never padded): this epoch trains on nothing", len(self.dataset),
                        self.num_replicas)
        self.indices = partition(len(self.dataset), self.seed, self.epoch, done, self.rank, self.num_replicas,
                                 self.shuffle).tolist()

    @property
    def num_samples(self) -> int:
        """The length of this rank's share (Horovod's attribute)."""
        return len(self.indices)

    def __iter__(self) -> Iterator[int]:
        return iter(list(self.indices))

    def __len__(self) -> int:
        return len(self.indices)
