"""Uneven data: workers with different numbers of batches finish an epoch together.

In a synchronous store every sync round waits for one push from each worker, so a
worker that runs out of batches one step early leaves the others waiting for a push that
never comes. :class:`UnevenSteps` implements the remedy PyTorch's ``Join`` uses for DDP,
on a store key:

* before each real step, every worker pushes ``[1, batch size]`` to a small counter key
  (``pushpull`` without waiting: it rides along with the step's gradients);
* a worker out of data instead pushes ``[0, 0]`` and waits for the sum: if some worker
  still had a batch, it takes a :meth:`~pskv.parallel.Trainer.shadow_step` — zero
  gradients into the same rounds, then the same update (``rescale_grad`` from the active
  workers' mean batch size), so parameters and optimizer state stay identical on every
  worker; if nobody had one, the epoch is over for everyone.

The sums of gradients then cover only the workers that still had data, divided by the
usual global batch (batch size x workers), as with MXNet's fixed ``rescale_grad``.
Cost: one 16-byte ``pushpull`` (two float64) per step, sent without waiting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from pskv.errors import InvalidArgumentError

if TYPE_CHECKING:  # fit() builds this for the trainer it runs
    from pskv.parallel.trainer import Trainer

__all__ = ["UnevenSteps"]


class UnevenSteps:
    """The per-step bookkeeping of one trainer for uneven data (collective: every worker).

    Args:
        trainer: a :class:`~pskv.parallel.Trainer` with a synchronous distributed store.
    """

    def __init__(self, trainer: Trainer) -> None:
        kv = trainer.kvstore
        if kv is None:
            raise InvalidArgumentError("uneven data needs a trainer with a store")
        self._trainer = trainer
        self._kv = kv
        self._key = f"__pskv_active__:{trainer.keys[0]}"  # the trainer's keys are str
        self._handle: Any = None
        self._sent = np.zeros(2, np.float64)
        self._out = np.zeros(2, np.float64)
        if not trainer.uneven_key_ready:
            if not kv.store_type.summation_only:  # byteps declares keys by their first pushpull (its servers only sum)
                # collective; summed: the servers' optimizer (update_on_kvstore) must not touch it
                kv.init(self._key, np.zeros(2, np.float64), summed=True)
            trainer.uneven_key_ready = True

    def before_step(self, batch_size: int) -> None:
        """Announce a real step of ``batch_size`` samples (call before ``trainer.step()``)."""
        self._settle()
        self._sent[:] = (1.0, float(batch_size))
        self._handle = self._kv.pushpull(self._key, self._sent, out=self._out, block=False)

    def finish(self) -> int:
        """This worker is out of data: shadow the others' steps until nobody has data.

        Returns:
            The number of shadow steps taken.
        """
        self._settle()
        steps = 0
        while True:
            self._sent[:] = 0.0
            self._kv.pushpull(self._key, self._sent, out=self._out)
            active, samples = int(round(self._out[0])), float(self._out[1])
            if active == 0:
                return steps
            self._trainer.shadow_step(max(1, int(round(samples / active))))
            steps += 1

    def _settle(self) -> None:
        if self._handle is not None:
            handle, self._handle = self._handle, None
            handle.wait()
