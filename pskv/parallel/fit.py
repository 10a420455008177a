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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pskv.errors import InvalidArgumentError
from pskv.parallel.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from pskv.parallel.data import batch_arrays
from pskv.parallel.metrics import create as create_metric
from pskv.parallel.uneven import UnevenSteps

if TYPE_CHECKING:  # the trainer calls fit(); fit only needs its type
    from pskv.parallel.trainer import Trainer

__all__ = ["fit", "evaluate", "LINE_SECONDS"]

LINE_SECONDS = 10.0  # without a terminal, a progress line at most this often (plus one per epoch)


def _metric(spec: Any) -> Any:
    return create_metric(spec)


def _begin_epoch(data: Any, epoch: int) -> None:
    """Position an iterator at the start of ``epoch`` (``set_epoch`` if it has one, else ``reset``)."""
    if hasattr(data, "set_epoch"):
        data.set_epoch(epoch)
    elif hasattr(data, "reset"):
        data.reset()


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
        epoch_end_callback: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Train ``trainer``'s group for epochs ``begin_epoch .. num_epoch - 1``.

    Args:
        trainer: a :class:`~pskv.parallel.Trainer` over a :class:`DataParallelExecutorGroup`
            with a loss. An unbound group is bound from the first batch's shapes.
        train_data: batches (``DataBatch``, ``(data, label)`` pairs); iterated once per
            epoch. An iterator with ``set_epoch(e)`` (or else ``reset()``) is positioned
            at each epoch's start, so shuffles are reproducible and resumable.
        eval_data: evaluated after every epoch with a fresh ``eval_metric``.
        num_epoch: the epoch to stop before (total epochs, counting resumed ones).
        eval_metric: a metric name, object or list (``pskv.parallel.metrics.create``).
        begin_epoch: first epoch (ignored when resuming from a checkpoint).
        checkpoint_dir: save a checkpoint every ``checkpoint_period`` epochs and after
            the last one (see :mod:`pskv.parallel.checkpoint`).
        resume: continue from the newest checkpoint in ``checkpoint_dir`` if there is one.
        progress: ``'auto'`` (a bar on a terminal, periodic lines otherwise), True
            (always a bar) or False.
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
        batch_end_callback, epoch_end_callback: called with a dict of statistics.

    Returns:
        One dict per epoch trained: ``epoch``, ``loss``, ``train`` and ``eval`` metrics,
        ``samples_per_s`` (all workers), ``seconds``.
    """
    group = trainer.group
    if group is None or group.loss is None:
        raise InvalidArgumentError("fit() needs a Trainer over a DataParallelExecutorGroup that has a loss")
    if not isinstance(num_epoch, int) or num_epoch < 1:
        raise InvalidArgumentError(f"num_epoch must be an int >= 1, got {num_epoch!r}")
    if resume and checkpoint_dir is None:
        raise InvalidArgumentError("resume=True needs a checkpoint_dir")
    kv = trainer.kvstore
    rank = kv.rank if kv is not None else 0
    workers = kv.num_workers if kv is not None else 1
    show = log_all_ranks or rank == 0
    if resume:
        found = latest_checkpoint(checkpoint_dir)  # type: ignore[arg-type]
        if found is not None:
            if not group.data_shapes:
                first = next(iter(train_data))
                _bind_from(group, first)
            meta = load_checkpoint(trainer, found)
            begin_epoch = int(meta["epoch"]) + 1
            if show:
                print(f"resumed from {found} (epoch {meta['epoch'] + 1} done)", flush=True)
    if server_checkpoint_steps and (isinstance(server_checkpoint_steps, bool) or not isinstance(
            server_checkpoint_steps, int) or server_checkpoint_steps < 0):
        raise InvalidArgumentError(f"server_checkpoint_steps must be an int >= 0, got {server_checkpoint_steps!r}")
    snapshots = server_checkpoint_steps if kv is not None and kv.store_type.distributed else 0
    if snapshots and uneven:
        raise InvalidArgumentError("server_checkpoint_steps needs the same steps on every worker; not with uneven=True")
    total_steps = 0
    shadow = None
    if uneven and kv is not None and workers > 1 and kv.store_type.distributed and kv.store_type.sync:
        shadow = UnevenSteps(trainer)
    history = []
    for epoch in range(begin_epoch, num_epoch):
        _begin_epoch(train_data, epoch)
        metric = _metric(eval_metric)
        total = len(train_data) if hasattr(train_data, "__len__") else None  # type: ignore[arg-type]
        bar = _Progress(progress, total, f"epoch {epoch + 1}/{num_epoch}", show)
        start = time.perf_counter()
        loss_sum, samples, steps = 0.0, 0, 0
        try:
            for batch in train_data:
                if not group.data_shapes:
                    _bind_from(group, batch)
                group.forward(batch, is_train=True)
                group.backward()
                if shadow is not None:
                    shadow.before_step(group.batch_size)
                trainer.step()
                _, labels = batch_arrays(batch)
                group.update_metric(metric, labels)
                loss_sum += group.get_loss()
                samples += group.batch_size
                steps += 1
                total_steps += 1
                if kv is not None and snapshots and total_steps % snapshots == 0:
                    kv.save_checkpoint(meta={"epoch": epoch, "step": steps})  # collective: every worker steps alike
                seconds = time.perf_counter() - start
                stats = {"loss": loss_sum / samples, **dict(metric.get_name_value()),
                         "samples/s": round(samples * workers / max(seconds, 1e-9))}
                bar.update(steps, stats)
                if batch_end_callback is not None:
                    batch_end_callback({"epoch": epoch, "step": steps, **stats})
            if shadow is not None:
                shadow.finish()  # the other workers' remaining steps, with zero gradients
        finally:
            bar.close()
        if steps == 0:
            raise InvalidArgumentError(f"epoch {epoch}: train_data yielded no batches")
        seconds = time.perf_counter() - start
        record: dict[str, Any] = {"epoch": epoch, "loss": loss_sum / samples, "train": dict(metric.get_name_value()),
                                  "samples_per_s": samples * workers / seconds, "seconds": seconds}
        if eval_data is not None:
            _begin_epoch(eval_data, 0)
            record["eval"] = evaluate(group, eval_data, eval_metric)
        if checkpoint_dir is not None and ((epoch + 1 - begin_epoch) % checkpoint_period == 0
                                           or epoch == num_epoch - 1):
            record["checkpoint"] = str(save_checkpoint(trainer, checkpoint_dir, epoch))
        if show:
            parts = [f"epoch {epoch + 1}/{num_epoch}", f"loss {record['loss']:.4f}"]
            parts += [f"train-{k} {v:.4f}" for k, v in record["train"].items()]
            parts += [f"eval-{k} {v:.4f}" for k, v in record.get("eval", {}).items()]
            parts.append(f"{record['samples_per_s']:,.0f} samples/s")
            print("  ".join(parts), flush=True)
        history.append(record)
        if epoch_end_callback is not None:
            epoch_end_callback(record)
    return history
