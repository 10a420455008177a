"""A Trainer's commit points in an elastic job: what the worker holds, put back after a departure (issue 24).

In an elastic job (``pskv launch -n MIN:MAX``) a departure voids every step since the last commit: the
servers roll back to it (:mod:`pskv.kvstore.elastic`) and every survivor must put its own state back to it
too, then redo the steps. :class:`ElasticTrainer` is that state for one :class:`~pskv.parallel.Trainer`:

* :meth:`ElasticTrainer.snapshot` copies what the worker holds and the servers do not: the weights and the
  optimizer state when the optimizer runs here (``update_on_kvstore=False``). With ``update_on_kvstore=True``
  the servers hold the weights and the optimizer state (and roll them back); the worker keeps nothing.
  A snapshot is taken *before* ``kv.commit()`` and counts only once the commit succeeded (two-phase: a
  commit that fails leaves the previous one in force). Compression residuals need nothing here: the store
  keeps them as at each commit and ``kv.restore()`` puts them back (:mod:`pskv.worker.compressing`).
* :meth:`ElasticTrainer.restore` puts a snapshot back after ``kv.restore()``; with ``update_on_kvstore`` it
  pulls the servers' rolled-back weights instead.
* :meth:`ElasticTrainer.share_states` gives every worker rank 0's local optimizer state after a join (a
  joiner has none; with ``update_on_kvstore`` the servers hold it): its bytes (the state file's) travel in a
  key of their length, which rank 0's broadcast makes or overwrites.
* :meth:`ElasticTrainer.adopt` follows a new view, whether a commit's release or a restore brought it: the
  number of workers a step's gradient is averaged over becomes the view's W (``rescale_grad = 1 / (batch x
  W)``: a step's gradient is the mean over that step's samples of all its workers, the global batch is batch x
  W), the learning rate is re-set (``elastic_lr="fixed"``: unchanged; ``"linear"``: ``lr0 x W / W0``, W0 the
  workers at the start), and with ``update_on_kvstore`` the optimizer is sent to the servers again (a
  collective of the new view; the servers keep its state).

The Trainer has no elastic code: this module reads and sets its step state (``_weights``, ``_updater``,
``_worker_factor``, ``_optimizer_batch``), as :mod:`pskv.parallel.uneven` drives its steps.
"""

from __future__ import annotations

import copy
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pskv.errors import InvalidArgumentError
from pskv.parallel.torch_optim import TorchOptimizerStep

if TYPE_CHECKING:
    from pskv.kvstore.dist_job import DistJob
    from pskv.parallel.trainer import Trainer

__all__ = ["ELASTIC_LR", "ElasticTrainer", "TrainerSnapshot"]

ELASTIC_LR = ("fixed", "linear")


@dataclass
class TrainerSnapshot:
    """What a worker holds at a commit (empty parts: the servers hold them)."""

    weights: list[torch.Tensor]  # each bucket's flat weights (device 0's); [] with update_on_kvstore
    states: Any  # the local optimizer's state (bytes, or a torch optimizer's state_dict); None: none


class ElasticTrainer:
    """One Trainer's commit, restore and view changes in an elastic job (see the module docstring).

    Args:
        trainer: the trainer, over a store of an elastic job.
        elastic_lr: ``"fixed"`` (the learning rate stays when W changes) or ``"linear"`` (it scales with W).
        workers0: W0, the workers ``"linear"`` is relative to (every worker must give the same).

    Raises:
        InvalidArgumentError: another ``elastic_lr``, or ``"linear"`` with an optimizer that has an
            ``lr_scheduler``.
    """

    def __init__(self, trainer: Trainer, elastic_lr: str = "fixed", workers0: int = 1) -> None:
        if elastic_lr not in ELASTIC_LR:
            raise InvalidArgumentError(f"elastic_lr must be one of {', '.join(ELASTIC_LR)}, got {elastic_lr!r}")
        if elastic_lr == "linear" and getattr(trainer.optimizer, "lr_scheduler", None) is not None:
            raise InvalidArgumentError("elastic_lr='linear' sets the learning rate at every view: "
                                       "not with an lr_scheduler (scale it in the scheduler instead)")
        self.trainer = trainer
        self.linear = elastic_lr == "linear"
        self.workers0 = workers0
        self.lr0 = trainer.learning_rate

    @property
    def kv(self) -> DistJob:
        return self.trainer.kvstore  # type: ignore[return-value]  # fit checked it is an elastic job's

    def snapshot(self) -> TrainerSnapshot:
        """A copy of what this worker holds now (take it before ``kv.commit()``; keep it if that succeeds)."""
        t = self.trainer
        t._finish_sends()
        weights = [] if t.update_on_kvstore else [w[0].detach().clone() for w in t._weights]
        updater = t._updater
        if isinstance(updater, TorchOptimizerStep):
            states: Any = copy.deepcopy(updater.torch_optimizer.state_dict())
        else:
            states = updater.get_states() if updater is not None else None
        return TrainerSnapshot(weights, states)

    def restore(self, saved: TrainerSnapshot) -> None:
        """After ``kv.restore()``: the state of the last commit back (``saved``, or the servers' weights)."""
        t = self.trainer
        with torch.no_grad():
            for copies, weights in zip(t._weights, saved.weights, strict=False):
                for w in copies:
                    w.copy_(weights)
        updater = t._updater
        if isinstance(updater, TorchOptimizerStep):
            updater.torch_optimizer.load_state_dict(copy.deepcopy(saved.states))
        elif updater is not None and saved.states is not None:
            updater.set_states(saved.states)  # counts and states; the optimizer object stays the Trainer's
        if t.update_on_kvstore:
            self.pull_weights()

    def pull_weights(self) -> None:
        """Every device's weights from the servers (their values at the last commit after a rollback)."""
        t = self.trainer
        keys = t._store_keys
        with torch.no_grad():
            self.kv.pull(keys.keys, out=[v for b, w in enumerate(t._weights) for v in keys.views(b, w)])

    def share_states(self, prefix: str, size_key: str) -> None:
        """Rank 0's local optimizer state on every worker of the view (after a join). A collective: ``size_key``
        (an int64 key every worker made) carries its length, rank 0's broadcast of key ``prefix`` + its length in
        words its bytes. The key is made by the first join of a length and overwritten by the next ones of that
        length (a state's length stays the same once the optimizer has stepped), so joins do not pile keys up on
        the servers. Nothing with ``update_on_kvstore`` or without a local optimizer."""
        t, kv = self.trainer, self.kv
        updater = t._updater
        if t.update_on_kvstore or updater is None:
            return
        with tempfile.TemporaryDirectory(prefix="pskv-elastic-") as directory:
            path = os.path.join(directory, "states")
            updater.save_states(path)
            mine = Path(path).read_bytes()
            size = np.array([len(mine)], np.int64)
            kv.broadcast(size_key, size, out=size)
            words = -(-int(size[0]) // 8)  # the bytes travel as int64 words (the stores' dtypes have no bytes)
            ours = (np.frombuffer(mine.ljust(words * 8, b"\0"), np.int64).copy() if kv.rank == 0
                    else np.zeros(words, np.int64))
            theirs = np.empty(words, np.int64)
            kv.broadcast(f"{prefix}{words}w", ours, out=theirs)  # rank 0's value, made or overwritten
            if kv.rank == 0:
                return
            Path(path).write_bytes(theirs.tobytes()[:int(size[0])])
            updater.load_states(path)  # states and counts; the optimizer object stays the Trainer's

    def adopt(self) -> None:
        """The store adopted a new view: W, the learning rate and (``update_on_kvstore``) the servers'
        ``rescale_grad`` follow it. A collective of the new view with ``update_on_kvstore``."""
        t, kv = self.trainer, self.kv
        workers = kv.num_workers if kv.store_type.sync else 1
        t._worker_factor = workers
        if self.linear:
            t.optimizer.set_learning_rate(self.lr0 * kv.num_workers / self.workers0)
        if t.update_on_kvstore and t._optimizer_batch is not None:
            t.optimizer.rescale_grad = 1.0 / (t._optimizer_batch * workers)
            kv.set_optimizer(t.optimizer)  # type: ignore[arg-type]  # a pskv optimizer: the servers keep its state
