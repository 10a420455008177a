"""An epoch's samples shared out over an elastic job's workers: no sample twice, equal shares, exact progress.

When the workers change mid-epoch, what is left of the epoch is shared out again over the new set.
:func:`partition` is the one rule every worker (and a test's replay) applies:

* the epoch's order is a permutation drawn from ``seed + epoch`` (or ``0..n-1`` unshuffled), the
  same on every worker;
* the first ``processed`` samples of it are done; the rest is dealt out by stride, worker ``rank``
  taking ``rest[rank::size]``;
* every share has the same length ``len(rest) // size`` (the last ``len(rest) % size`` samples of
  the epoch are skipped rather than padded: a padded sample would be seen twice), so every worker
  makes the same number of steps and the synchronous rounds stay in step.

Dealt by stride, after every worker took ``k`` samples of its share the first ``k * size`` samples
of ``rest`` are done: ``processed`` after a commit is exactly ``processed + k * size``
(:func:`advanced`), whichever worker is asked.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pskv.errors import InvalidArgumentError

__all__ = ["advanced", "epoch_order", "partition"]


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The epoch's order of the sample indices ``0..num_samples-1`` (the same on every worker)."""
    if shuffle:
        return np.random.default_rng(seed + epoch).permutation(num_samples).astype(np.int64)
    return np.arange(num_samples, dtype=np.int64)


def partition(num_samples: int, seed: int, epoch: int, processed: int, rank: int, size: int,
              shuffle: bool = True) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Worker ``rank`` of ``size``'s share of what is left of the epoch after ``processed`` samples.

    Raises:
        InvalidArgumentError: ``rank`` not in ``0..size-1``, or ``processed`` not in ``0..num_samples``.
    """
    if size < 1 or not 0 <= rank < size:
        raise InvalidArgumentError(f"elastic partition: rank {rank} of {size} workers")
    if not 0 <= processed <= num_samples:
        raise InvalidArgumentError(f"elastic partition: {processed} samples processed of an epoch of {num_samples}")
    rest = epoch_order(num_samples, seed, epoch, shuffle)[processed:]
    share = len(rest) // size
    return rest[rank::size][:share]


def advanced(processed: int, taken: int, size: int) -> int:
    """``processed`` after every one of ``size`` workers took ``taken`` samples of its share."""
    return processed + taken * size
