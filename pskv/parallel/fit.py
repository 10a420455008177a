"""fit(): the training loop — epochs of forward, backward and step, evaluation, progress, checkpoints.

Works the same with one process and several devices (``local`` / ``device`` stores)
and under ``pskv launch`` with several workers (``dist_*`` stores): each worker iterates
over its own shard of the data (e.g. ``NDArrayIter(..., num_parts=kv.num_workers,
part_index=kv.rank)``) and every worker must run the same number of steps per epoch.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pskv.errors import InvalidArgumentError
from pskv.parallel.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from pskv.parallel.data import batch_arrays
from pskv.parallel.data import begin_epoch as start_epoch  # fit() has an argument named begin_epoch
from pskv.parallel.metrics import create as create_metric
from pskv.parallel.uneven import UnevenSteps

if TYPE_CHECKING:  # the trainer calls fit(); fit only needs its type
    from pskv.kvstore import KVStoreBase
    from pskv.parallel.executor_group import DataParallelExecutorGroup
    from pskv.parallel.trainer import Trainer

__all__ = ["fit", "evaluate", "LINE_SECONDS"]

LINE_SECONDS = 10.0  # without a terminal, a progress line at most this often (plus one per epoch)


def _metric(spec: Any) -> Any:
    return create_metric(spec)


def _bind_from(group: Any, batch: Any) -> None:
    data, labels = batch_arrays(batch)
    group.bind_exec([(f"data{k}", tuple(x.shape)) for k, x in enumerate(data)],
                    [(f"label{k}", tuple(y.shape)) for k, y in enumerate(labels)] or None)


class _Progress:
    """A tqdm bar on a terminal, else a plain line at most every ``LINE_SECONDS`` (log-friendly)."""

    def __init__(self, mode: bool | str, total: int | None, desc: str, show: bool) -> None:
        self.show = show
        self.total = total
        self.desc = desc
        self.bar = None
        self.next_line = time.monotonic() + LINE_SECONDS
        if show and (mode is True or (mode == "auto" and sys.stderr.isatty())):
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="batch", leave=True, dynamic_ncols=True)

    def update(self, done: int, stats: dict[str, Any]) -> None:
        if not self.show:
            return
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in stats.items()},
                                 refresh=False)
        elif time.monotonic() >= self.next_line:
            self.next_line = time.monotonic() + LINE_SECONDS
            text = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in stats.items())
            of = f"/{self.total}" if self.total else ""
            print(f"{self.desc} [{done}{of}] {text}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def evaluate(group: Any, eval_data: Iterable[Any], eval_metric: Any = "acc") -> dict[str, float]:
    """Run ``eval_data`` through ``group`` in inference mode; returns ``{metric name: value}``."""
    metric = _metric(eval_metric)
    for batch in eval_data:
        group.forward(batch, is_train=False)
        _, labels = batch_arrays(batch)
        group.update_metric(metric, labels)
    return dict(metric.get_name_value())


def fit(trainer: Trainer, train_data: Iterable[Any], eval_data: Iterable[Any] | None = None, *, num_epoch: int = 1,
        eval_metric: Any = "acc", begin_epoch: int = 0, checkpoint_dir: str | Path | None = None,
        checkpoint_period: int = 1, resume: bool = False, progress: bool | str = "auto",
        log_all_ranks: bool = False, uneven: bool = False, server_checkpoint_steps: int = 0,
        batch_end_callback: Callable[[dict[str, Any]], None] | None = None,
        epoch_end_callback: Callable[[dict[str, Any]], None] | None = None, elastic: bool = False,
        commit_steps: int = 10, elastic_lr: str = "fixed") -> list[dict[str, Any]]:
    """Train ``trainer``'s group for epochs ``begin_epoch .. num_epoch - 1``.

    Args:
        trainer: a :class:`~pskv.parallel.Trainer` over a :class:`DataParallelExecutorGroup`
            with a loss. An unbound group is bound from the first batch's shapes.
        train_data: batches (``DataBatch``, ``(data, label)`` pairs); iterated once per
            epoch. An iterator with ``set_epoch(e)`` (or else ``reset()``) is positioned
            at each epoch's start, so shuffles are reproducible and resumable; a
            DataLoader's ``DistributedSampler`` gets ``set_epoch(e)``
            (:func:`pskv.parallel.data.begin_epoch`).
        eval_data: evaluated after every epoch with a fresh ``eval_metric``.
        num_epoch: the epoch to stop before (total epochs, counting resumed ones).
        eval_metric: a metric name, object or list (``pskv.parallel.metrics.create``).
        begin_epoch: first epoch (ignored when resuming from a checkpoint).
        checkpoint_dir: save a checkpoint every ``checkpoint_period`` epochs and after
            the last one (see :mod:`pskv.parallel.checkpoint`; embedding tables in the
            store included: a ``dist_*`` store's in a server checkpoint of its own).
        resume: continue from the newest checkpoint in ``checkpoint_dir`` if there is one.
        progress: ``'auto'`` (a bar on a terminal, periodic lines otherwise), True
            (always a bar) or False (no bar: a plain line at most every 10 s).
        log_all_ranks: print progress on every worker (default: rank 0 only).
        uneven: workers may have different numbers of batches per epoch (synchronous
            distributed stores): a worker out of data takes part in the others' last
            steps with zero gradients, so no one waits forever and every worker ends
            the epoch with the same parameters (:mod:`pskv.parallel.uneven`; costs one
            tiny ``pushpull`` per step). Without it, a worker with fewer batches leaves
            the others waiting until their timeout.
        server_checkpoint_steps: distributed stores: every this many steps (counted over
            the whole run), ``kv.save_checkpoint(meta={"epoch", "step"})`` snapshots the
            servers into ``PSKV_CHECKPOINT_DIR`` — what a replacement server loads
            (``pskv launch --restart-servers``); 0: never.
        batch_end_callback: called with a dict of statistics after each batch.
        epoch_end_callback: called with a dict of statistics after each epoch.
        elastic: train while workers join and leave (``pskv launch -n MIN:MAX``), committing every
            ``commit_steps`` steps; ``elastic_lr``: ``'fixed'``/``'linear'`` (:mod:`pskv.parallel.elastic_fit`).

    Returns:
        One dict per epoch trained: ``epoch``, ``loss``, ``train`` and ``eval`` metrics,
        ``samples_per_s`` (all workers), ``seconds``.
    """
    group = _checked_group(trainer, num_epoch, resume, checkpoint_dir)
    kv = trainer.kvstore
    workers = kv.num_workers if kv is not None else 1
    show = log_all_ranks or (kv.rank if kv is not None else 0) == 0
    if resume:
        begin_epoch = _resume(trainer, group, train_data, checkpoint_dir, begin_epoch, show)
    run = _Run(trainer, group, kv, workers, show, _snapshot_steps(kv, server_checkpoint_steps, uneven),
               _uneven_shadow(trainer, kv, workers, uneven), num_epoch, begin_epoch, progress, eval_data,
               eval_metric, checkpoint_dir, checkpoint_period, batch_end_callback, epoch_end_callback)
    if elastic:
        from pskv.parallel.elastic_fit import ElasticRun  # it builds on this module's pieces
        return ElasticRun(run, uneven, commit_steps, elastic_lr).train(train_data)
    return [_epoch(run, train_data, epoch) for epoch in range(begin_epoch, num_epoch)]


# ---------------------------------------------------------------------------- fit()'s pieces


@dataclass
class _Run:
    """The settings of one fit() call that every epoch uses, and the steps taken so far."""

    trainer: Trainer
    group: DataParallelExecutorGroup
    kv: KVStoreBase | None
    workers: int
    show: bool
    snapshots: int  # server checkpoint every this many steps; 0: never
    shadow: UnevenSteps | None
    num_epoch: int
    begin_epoch: int
    progress: bool | str
    eval_data: Iterable[Any] | None
    eval_metric: Any
    checkpoint_dir: str | Path | None
    checkpoint_period: int
    batch_end_callback: Callable[[dict[str, Any]], None] | None
    epoch_end_callback: Callable[[dict[str, Any]], None] | None
    total_steps: int = 0  # over the whole run (server_checkpoint_steps counts these)


@dataclass
class _EpochTotals:
    """What one epoch's steps add up to."""

    loss_sum: float = 0.0
    samples: int = 0
    steps: int = 0


def _checked_group(trainer: Trainer, num_epoch: int, resume: bool,
                   checkpoint_dir: str | Path | None) -> DataParallelExecutorGroup:
    """The trainer's group, after fit()'s argument checks.

    Raises:
        InvalidArgumentError: no group or no loss, ``num_epoch`` < 1, ``resume`` without a directory.
    """
    group = trainer.group
    if group is None or group.loss is None:
        raise InvalidArgumentError("fit() needs a Trainer over a DataParallelExecutorGroup that has a loss")
    if not isinstance(num_epoch, int) or num_epoch < 1:
        raise InvalidArgumentError(f"num_epoch must be an int >= 1, got {num_epoch!r}")
    if resume and checkpoint_dir is None:
        raise InvalidArgumentError("resume=True needs a checkpoint_dir")
    return group


def _resume(trainer: Trainer, group: DataParallelExecutorGroup, train_data: Iterable[Any],
            checkpoint_dir: str | Path | None, begin_epoch: int, show: bool) -> int:
    """Load the newest checkpoint in ``checkpoint_dir``, if any; returns the epoch to begin with."""
    found = latest_checkpoint(checkpoint_dir)  # type: ignore[arg-type]
    if found is None:
        return begin_epoch
    if not group.data_shapes:
        first = next(iter(train_data))
        _bind_from(group, first)
    meta = load_checkpoint(trainer, found)
    if show:
        print(f"resumed from {found} (epoch {meta['epoch'] + 1} done)", flush=True)
    return int(meta["epoch"]) + 1


def _snapshot_steps(kv: KVStoreBase | None, server_checkpoint_steps: int, uneven: bool) -> int:
    """Every how many steps the servers are checkpointed (0: never; only distributed stores).

    Raises:
        InvalidArgumentError: ``server_checkpoint_steps`` is not an int >= 0, or is used with ``uneven``.
    """
    if server_checkpoint_steps and (isinstance(server_checkpoint_steps, bool) or not isinstance(
            server_checkpoint_steps, int) or server_checkpoint_steps < 0):
        raise InvalidArgumentError(f"server_checkpoint_steps must be an int >= 0, got {server_checkpoint_steps!r}")
    snapshots = server_checkpoint_steps if kv is not None and kv.store_type.distributed else 0
    if snapshots and uneven:
        raise InvalidArgumentError("server_checkpoint_steps needs the same steps on every worker; not with uneven=True")
    return snapshots


def _uneven_shadow(trainer: Trainer, kv: KVStoreBase | None, workers: int, uneven: bool) -> UnevenSteps | None:
    """The :class:`UnevenSteps` of ``uneven=True`` where it is needed (several workers, a sync distributed store)."""
    if uneven and kv is not None and workers > 1 and kv.store_type.distributed and kv.store_type.sync:
        return UnevenSteps(trainer)
    return None


def _epoch(run: _Run, train_data: Iterable[Any], epoch: int) -> dict[str, Any]:
    """Train one epoch with a fresh metric; its record."""
    start_epoch(train_data, epoch)
    metric = _metric(run.eval_metric)
    totals, seconds = _train_epoch(run, train_data, epoch, metric)
    record = _epoch_record(run, epoch, totals, seconds, metric)
    if run.epoch_end_callback is not None:
        run.epoch_end_callback(record)
    return record


def _train_epoch(run: _Run, train_data: Iterable[Any], epoch: int, metric: Any) -> tuple[_EpochTotals, float]:
    """One pass over ``train_data`` with progress and batch callbacks; returns the totals and the seconds taken.

    Raises:
        InvalidArgumentError: ``train_data`` yielded no batches.
    """
    total = len(train_data) if hasattr(train_data, "__len__") else None  # type: ignore[arg-type]
    bar = _Progress(run.progress, total, f"epoch {epoch + 1}/{run.num_epoch}", run.show)
    start = time.perf_counter()
    totals = _EpochTotals()
    try:
        for batch in train_data:
            _train_step(run, batch, epoch, metric, totals)
            seconds = time.perf_counter() - start
            stats = {"loss": totals.loss_sum / totals.samples, **dict(metric.get_name_value()),
                     "samples/s": round(totals.samples * run.workers / max(seconds, 1e-9))}
            bar.update(totals.steps, stats)
            if run.batch_end_callback is not None:
                run.batch_end_callback({"epoch": epoch, "step": totals.steps, **stats})
        if run.shadow is not None:
            run.shadow.finish()  # the other workers' remaining steps, with zero gradients
    finally:
        bar.close()
    if totals.steps == 0:
        raise InvalidArgumentError(f"epoch {epoch}: train_data yielded no batches")
    return totals, time.perf_counter() - start


def _train_step(run: _Run, batch: Any, epoch: int, metric: Any, totals: _EpochTotals) -> None:
    """Forward, backward and step on one batch; update the metric, the totals and the server snapshots."""
    group = run.group
    if not group.data_shapes:
        _bind_from(group, batch)
    group.forward(batch, is_train=True)
    group.backward()
    if run.shadow is not None:
        run.shadow.before_step(group.batch_size)
    run.trainer.step()
    _, labels = batch_arrays(batch)
    group.update_metric(metric, labels)
    totals.loss_sum += group.get_loss()
    totals.samples += group.batch_size
    totals.steps += 1
    run.total_steps += 1
    if run.kv is not None and run.snapshots and run.total_steps % run.snapshots == 0:
        run.kv.save_checkpoint(meta={"epoch": epoch, "step": totals.steps})  # collective: every worker steps alike


def _epoch_record(run: _Run, epoch: int, totals: _EpochTotals, seconds: float, metric: Any,
                  elastic_workers: int = 0, show: bool | None = None) -> dict[str, Any]:
    """The epoch's record: training figures, then evaluation and a checkpoint when due; printed on ``show``
    (default ``run.show``). ``elastic_workers``: W at the epoch's end in an elastic fit (recorded as ``workers``)."""
    workers = elastic_workers or run.workers
    record: dict[str, Any] = {"epoch": epoch, "loss": totals.loss_sum / max(totals.samples, 1),
                              "train": dict(metric.get_name_value())}
    if elastic_workers:
        record["workers"] = elastic_workers
    record.update(samples_per_s=totals.samples * workers / max(seconds, 1e-9), seconds=seconds)
    if run.eval_data is not None:
        start_epoch(run.eval_data, 0)
        record["eval"] = evaluate(run.group, run.eval_data, run.eval_metric)
    if run.checkpoint_dir is not None and ((epoch + 1 - run.begin_epoch) % run.checkpoint_period == 0
                                           or epoch == run.num_epoch - 1):
        record["checkpoint"] = str(save_checkpoint(run.trainer, run.checkpoint_dir, epoch))
    if run.show if show is None else show:
        _print_epoch(record, run.num_epoch)
    return record


def _print_epoch(record: dict[str, Any], num_epoch: int) -> None:
    parts = [f"epoch {record['epoch'] + 1}/{num_epoch}", f"loss {record['loss']:.4f}"]
    parts += [f"train-{k} {v:.4f}" for k, v in record["train"].items()]
    parts += [f"eval-{k} {v:.4f}" for k, v in record.get("eval", {}).items()]
    parts.append(f"{record['samples_per_s']:,.0f} samples/s")
    print("  ".join(parts), flush=True)
