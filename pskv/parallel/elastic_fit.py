"""fit(..., elastic=True): training that goes on while workers join and leave the job (issue 24).

:func:`pskv.parallel.fit.fit` hands an elastic job's training to :class:`ElasticRun`, which owns the place
in the training (epoch, samples of the epoch done, steps), the epoch's metric and loss totals, and the
Trainer's commit points (:class:`~pskv.parallel.elastic.ElasticTrainer`). The rules:

* **Data.** ``train_data`` is an :class:`~pskv.parallel.data.NDArrayIter` over the *whole* data set
  (``num_parts=1``): the run shares it out. An epoch's order is drawn from rank 0's ``seed`` (every worker
  takes it at the start), and what is left of the epoch is dealt out over the current view's workers by
  :func:`pskv.parallel.elastic_data.partition`, anew after every commit. Each worker takes full batches
  only, so all make the same steps; the samples left at the end of an epoch are skipped (never padded: a
  padded sample would count twice).
* **Commits** every ``commit_steps`` steps and at each epoch's end. A commit is two-phase: a local
  snapshot (the place, the metric totals, :meth:`ElasticTrainer.snapshot`), then ``kv.commit()``; the
  snapshot is in force only once that succeeded.
* **A departure** (:class:`~pskv.errors.MembershipChangedError` from a step or a commit) voids the steps
  since the last commit on every server and worker: ``kv.restore()``, the snapshot put back, the rest of the
  epoch shared out over the new view, the voided steps redone. No gradient counts twice or not at all.
* **A join.** A worker started into the running job calls the same ``fit``; the scheduler admits it at a
  commit. Every worker of the new view then takes rank 0's place and weights (two broadcasts), commits (the
  joiner's first: from then on it is a member like the others) and takes rank 0's local optimizer state
  (``update_on_kvstore=False``; the servers hold it otherwise) before the step goes on.
* **Steps when W changes.** A step's gradient is the mean over the samples of that step's W workers: the
  global batch is ``batch x W``, ``rescale_grad = 1 / (batch x W)``, re-set at every view.
  ``elastic_lr="fixed"`` (default) keeps the learning rate; ``"linear"`` makes it ``lr0 x W / W0``, W0 the
  workers at the start. An epoch is the data set's samples, whatever W.
* **Output.** An epoch line from rank 0 (or every rank with ``log_all_ranks``), no progress bar; each
  record and batch statistic has ``workers``, the W at that point.
* **Refused** (InvalidArgumentError): ``uneven=True`` (the shares are equal by construction), a
  ``server_checkpoint_steps`` that is not a multiple of ``commit_steps`` (servers are checkpointed right after
  a commit), ``train_data`` that is not a whole-data-set NDArrayIter. NotSupportedError: ``elastic=True`` in
  a job that is not elastic.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pskv.errors import InvalidArgumentError, MembershipChangedError, NotSupportedError
from pskv.parallel.data import NDArrayIter, batch_arrays
from pskv.parallel.data import begin_epoch as start_epoch
from pskv.parallel.elastic import ElasticTrainer, TrainerSnapshot
from pskv.parallel.elastic_data import advanced, partition
from pskv.parallel.fit import _bind_from, _epoch_record, _EpochTotals, _metric, _Run

if TYPE_CHECKING:
    from pskv.kvstore.dist_job import DistJob
    from pskv.kvstore.elastic import View

__all__ = ["DEFAULT_COMMIT_STEPS", "ElasticRun"]

DEFAULT_COMMIT_STEPS = 10  # a commit is two meetings and a COMMIT per server; a departure loses up to this many steps
SEED_RANGE = 1 << 52  # the data seed travels in a float64 broadcast: exact below 2**53


@dataclass
class _Place:
    """Where the training is: the epoch, the samples of its order done, the steps taken over the run."""

    epoch: int
    processed: int = 0
    total_steps: int = 0


@dataclass
class _Committed:
    """A commit's local snapshot: what :meth:`ElasticRun._recover` puts back."""

    place: _Place
    trainer: TrainerSnapshot
    metric: Any
    totals: _EpochTotals


def _whole_data(train_data: Any) -> NDArrayIter:
    """``train_data``, checked to be an NDArrayIter over the whole data set."""
    if not isinstance(train_data, NDArrayIter) or train_data.num_parts != 1:
        raise InvalidArgumentError("fit(elastic=True) shares the data out over each view's workers itself: "
                                   "train_data must be an NDArrayIter over the whole data set (num_parts=1)")
    return train_data


class ElasticRun:
    """fit()'s epochs in an elastic job (see the module docstring).

    Args:
        run: fit()'s settings (:class:`pskv.parallel.fit._Run`).
        uneven: fit()'s ``uneven`` (refused).
        commit_steps: commit every this many steps (and at each epoch's end).
        elastic_lr: ``"fixed"`` or ``"linear"`` (:class:`~pskv.parallel.elastic.ElasticTrainer`).

    Raises:
        NotSupportedError: the job is not elastic (``pskv launch -n MIN:MAX``).
        InvalidArgumentError: ``uneven``, a ``commit_steps`` that is not an int >= 1, a
            ``server_checkpoint_steps`` that is not a multiple of it, another ``elastic_lr``.
    """

    def __init__(self, run: _Run, uneven: bool, commit_steps: int = DEFAULT_COMMIT_STEPS,
                 elastic_lr: str = "fixed") -> None:
        if uneven:
            raise InvalidArgumentError("fit(elastic=True) gives every worker an equal share of the data: "
                                       "not with uneven=True")
        if isinstance(commit_steps, bool) or not isinstance(commit_steps, int) or commit_steps < 1:
            raise InvalidArgumentError(f"commit_steps must be an int >= 1, got {commit_steps!r}")
        if run.snapshots % commit_steps:
            raise InvalidArgumentError(f"server_checkpoint_steps ({run.snapshots}) must be a multiple of commit_steps "
                                       f"({commit_steps}) with elastic=True: the servers are checkpointed at commits")
        if run.kv is None or getattr(run.kv, "view", None) is None:
            raise NotSupportedError("fit(elastic=True): this job is not elastic; start it with "
                                    "pskv launch -n MIN:MAX (workers may then join and leave)")
        self.run = run
        self.kv: DistJob = run.kv  # type: ignore[assignment]  # an elastic job's store is a dist store
        self.commit_steps = commit_steps
        self.elastic = ElasticTrainer(run.trainer, elastic_lr, self.kv.num_workers)
        self.place = _Place(run.begin_epoch)
        self.metric, self.totals = _metric(run.eval_metric), _EpochTotals()
        self.committed: _Committed | None = None
        self.finished: tuple[Any, _EpochTotals] = (self.metric, self.totals)  # the last epoch ended: its figures
        self.key = f"{run.trainer._prefix}__pskv_elastic_fit__"  # rank 0's place, broadcast to joiners
        self.size_key = f"{self.key}states"  # the length of rank 0's local optimizer state
        self.synced: set[int] = set()  # the slots that took rank 0's state with this worker (all, after a join)

    def train(self, train_data: Any) -> list[dict[str, Any]]:
        """Train up to ``num_epoch``; one record per epoch this worker took part in (a joiner's from its first)."""
        data = _whole_data(train_data)
        self._start(data)
        history = []
        while self.place.epoch < self.run.num_epoch:
            record = self._epoch(data)
            history.append(record)
            if self.run.epoch_end_callback is not None:
                self.run.epoch_end_callback(record)
        return history

    # -- the start, joins and departures ------------------------------------------------------
    def _start(self, data: NDArrayIter) -> None:
        """Bind the group, make the run's keys, and join the others in taking rank 0's state (:meth:`_adopt`).

        A worker of the job's first view does this with the others; a joiner does it with the members of the
        view that admitted it, who do the same on adopting that view.
        """
        group = self.run.group
        if not group.data_shapes:
            start_epoch(data, self.place.epoch)
            _bind_from(group, next(iter(data)))
        self.kv.init([self.key, self.size_key], [np.zeros(5), np.zeros(1, np.int64)])  # a joiner's: registered
        view = self.kv.view
        assert view is not None
        try:
            if view.cause != "start":  # a joiner: the Trainer's keys registered (no meeting), before its sync
                self.run.trainer.init_params()
            self._adopt(view, data)
        except MembershipChangedError:
            self._recover(data)

    def _adopt(self, view: View, data: NDArrayIter) -> None:
        """The store adopted ``view``. While it has workers that did not take rank 0's state yet (joiners; every
        worker at the start), everyone takes rank 0's place and weights, commits (a joiner's first commit makes
        it a member like the others), and takes rank 0's local optimizer state; again if that commit admitted
        more. Then W follows the view (:meth:`ElasticTrainer.adopt`)."""
        while set(view.members) - self.synced:
            self._sync(data)
            following = self._commit()
            if following is not None:  # more workers came (or went) at that commit: once more, with them
                view = following
                continue
            self.elastic.share_states(f"{self.key}states-", self.size_key)
            self.synced = set(view.members)
        self.elastic.adopt()

    def _sync(self, data: NDArrayIter) -> None:
        """Every worker of the view takes rank 0's place, data seed and weights (collective)."""
        place = self.place
        state = np.array([place.epoch, place.processed, place.total_steps, self.elastic.workers0,
                          data.seed % SEED_RANGE], np.float64)
        self.kv.broadcast(self.key, state, out=state)
        epoch, processed, steps, workers0, seed = (int(x) for x in state)
        self.place = _Place(epoch, processed, steps)
        self.elastic.workers0, data.seed = workers0, seed
        self.run.trainer.sync_params()

    def _commit(self) -> View | None:
        """A commit: the local snapshot, then ``kv.commit()``; the new view its release brought, if any."""
        pending = _Committed(copy.copy(self.place), self.elastic.snapshot(), copy.deepcopy(self.metric),
                             copy.copy(self.totals))
        view = self.kv.commit()
        self.committed = pending
        return view

    def _recover(self, data: NDArrayIter) -> None:
        """After MembershipChangedError: ``kv.restore()``, the last commit's state back, the new view followed.
        A worker that has not taken rank 0's state yet has nothing to put back: it takes it again."""
        while True:
            try:
                view = self.kv.restore()
                saved = self.committed
                if saved is not None and self.synced:
                    self.place, self.totals = copy.copy(saved.place), copy.copy(saved.totals)
                    self.metric = copy.deepcopy(saved.metric)
                    self.elastic.restore(saved.trainer)
                self._adopt(view, data)
                return
            except MembershipChangedError:  # another change while restoring: restore again
                continue

    # -- epochs and steps -----------------------------------------------------------------------
    def _epoch(self, data: NDArrayIter) -> dict[str, Any]:
        """Train what is left of the current epoch, commit by commit; its record."""
        epoch, start = self.place.epoch, time.perf_counter()
        while self.place.epoch == epoch:
            try:
                self._period(data)
            except MembershipChangedError:
                self._recover(data)
        metric, totals = self.finished
        return self._record(epoch, metric, totals, time.perf_counter() - start)

    def _period(self, data: NDArrayIter) -> None:
        """Up to ``commit_steps`` steps of this worker's share of the rest of the epoch, then a commit
        (the epoch's last one when the share is used up)."""
        kv, place, batch = self.kv, self.place, data.batch_size
        order = partition(data.num_samples, data.seed, place.epoch, place.processed, kv.rank, kv.num_workers,
                          data.shuffle)
        whole = len(order) // batch * batch
        todo = order[:min(whole, self.commit_steps * batch)]
        data.repartition(todo)
        steps_before = place.total_steps
        for each in data:
            self._step(each)
        place.processed = advanced(place.processed, len(todo), kv.num_workers)
        if len(todo) == whole:  # the epoch is done: its figures kept, the next one's start committed
            self.finished = (self.metric, self.totals)
            self.place = _Place(place.epoch + 1, 0, place.total_steps)
            self.metric, self.totals = _metric(self.run.eval_metric), _EpochTotals()
        view = self._commit()
        every = self.run.snapshots
        if every and steps_before // every != place.total_steps // every:
            kv.save_checkpoint(meta={"epoch": place.epoch, "step": place.total_steps})
        if view is not None:
            self._adopt(view, data)

    def _step(self, batch: Any) -> None:
        """Forward, backward and the Trainer's step on one batch; the metric and totals."""
        run, group = self.run, self.run.group
        group.forward(batch, is_train=True)
        group.backward()
        run.trainer.step()
        _, labels = batch_arrays(batch)
        group.update_metric(self.metric, labels)
        self.totals.loss_sum += group.get_loss()
        self.totals.samples += group.batch_size
        self.totals.steps += 1
        self.place.total_steps += 1
        if run.batch_end_callback is not None:
            run.batch_end_callback({"epoch": self.place.epoch, "step": self.totals.steps,
                                    "loss": self.totals.loss_sum / self.totals.samples,
                                    **dict(self.metric.get_name_value()), "workers": self.kv.num_workers})

    def _record(self, epoch: int, metric: Any, totals: _EpochTotals, seconds: float) -> dict[str, Any]:
        """The epoch's record (as fit's, plus ``workers``: W at its end); evaluation and checkpoint when due."""
        return _epoch_record(self.run, epoch, totals, seconds, metric, elastic_workers=self.kv.num_workers,
                             show=self.run.show or self.kv.rank == 0)  # rank 0 now: the oldest member
