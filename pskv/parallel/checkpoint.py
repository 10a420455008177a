"""Training checkpoints: parameters + optimizer state + progress, safe (no pickle) and atomic.

A checkpoint is a directory ``<root>/epoch-NNNN/`` holding

* ``params.safetensors`` — parameters (``arg:<name>``) and buffers (``aux:<name>``),
  averaged over devices;
* ``optimizer.safetensors`` — the optimizer state and config (pskv's state format); in
  distributed mode with ``update_on_kvstore`` each server writes
  ``optimizer.safetensors.server<rank>`` (the servers must see the same directory: one
  machine, or a shared file system);
* ``meta.json`` — epoch, format version, store type, number of workers.

It is written under a temporary name and renamed into place, so a crash leaves either
the previous checkpoint or the new one, never half of one; ``<root>/latest`` names the
newest complete checkpoint. Nothing is ever unpickled: safetensors and JSON only.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from pskv.atomic import fsync_dir, write_text_atomic
from pskv.checkpoints import TRAINING_META, latest_training_checkpoint, mark_latest_training, training_dir
from pskv.errors import InvalidArgumentError

if TYPE_CHECKING:  # the trainer's fit() uses these; they only need its type
    from pskv.parallel.trainer import Trainer

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint", "save_params", "load_params", "FORMAT"]

FORMAT = "pskv-checkpoint-1"
PARAMS = "params.safetensors"
OPTIMIZER = "optimizer.safetensors"
META = TRAINING_META


def save_params(fname: str | os.PathLike[str], arg_params: dict[str, Any], aux_params: dict[str, Any]) -> None:
    """Write parameters and buffers to a safetensors file (CPU copies)."""
    tensors = {f"arg:{k}": torch.as_tensor(v).detach().cpu().contiguous() for k, v in arg_params.items()}
    tensors.update({f"aux:{k}": torch.as_tensor(v).detach().cpu().contiguous() for k, v in aux_params.items()})
    save_file(tensors, str(fname), metadata={"format": FORMAT})


def load_params(fname: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Read what :func:`save_params` wrote: ``(arg_params, aux_params)``.

    Raises:
        InvalidArgumentError: the file is missing or not a pskv parameter file.
    """
    try:
        tensors = load_file(str(fname))
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
        raise InvalidArgumentError(f"cannot read parameters from {fname}: {exc}") from exc
    arg, aux = {}, {}
    for name, value in tensors.items():
        kind, _, key = name.partition(":")
        if kind == "arg":
            arg[key] = value
        elif kind == "aux":
            aux[key] = value
        else:
            raise InvalidArgumentError(f"{fname} is not a pskv parameter file (tensor {name!r})")
    return arg, aux


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The newest complete training checkpoint under ``root`` (None when there is none)."""
    return latest_training_checkpoint(root)


def save_checkpoint(trainer: Trainer, root: str | os.PathLike[str], epoch: int, extra: dict[str, Any] | None = None) -> Path:
    """Save the trainer's parameters and optimizer state as checkpoint ``epoch`` (collective).

    Every worker calls it; rank 0 writes the parameters and commits the directory.
    Returns the checkpoint's directory.
    """
    group = trainer.group
    if group is None:
        raise InvalidArgumentError("checkpoints need a Trainer over a DataParallelExecutorGroup")
    kv = trainer.kvstore
    rank = kv.rank if kv is not None else 0
    distributed = kv is not None and kv.store_type.distributed
    root = Path(root)
    final = training_dir(root, epoch)
    tmp = root / f".epoch-{epoch:04d}.tmp"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    if kv is not None and distributed:
        kv.barrier()
    if trainer.update_on_kvstore or rank == 0:
        trainer.save_states(str(tmp / OPTIMIZER))  # collective on a distributed store
    if rank == 0:
        arg, aux = group.get_params()
        save_params(tmp / PARAMS, arg, aux)
        meta = {"format": FORMAT, "epoch": epoch, "store": kv.type if kv is not None else None,
                "num_workers": kv.num_workers if kv is not None else 1,
                "update_on_kvstore": trainer.update_on_kvstore, **(extra or {})}
        write_text_atomic(tmp / META, json.dumps(meta, indent=1))
        fsync_dir(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        mark_latest_training(root, final)
        fsync_dir(root)
    if kv is not None and distributed:
        kv.barrier()
    return final


def load_checkpoint(trainer: Trainer, path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a checkpoint directory into the trainer's group and optimizer (collective).

    Parameters go into every device, then into the store (broadcast), then the
    optimizer state is restored. Returns the checkpoint's ``meta.json``.

    Raises:
        InvalidArgumentError: not a checkpoint, or written with the other
            ``update_on_kvstore`` mode (its optimizer state lives elsewhere).
        OptimizerStateError: the optimizer state does not fit.
    """
    group = trainer.group
    if group is None:
        raise InvalidArgumentError("checkpoints need a Trainer over a DataParallelExecutorGroup")
    path = Path(path)
    try:
        meta = json.loads((path / META).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(f"{path} is not a pskv checkpoint: {exc}") from exc
    if meta.get("format") != FORMAT:
        raise InvalidArgumentError(f"{path} is not a pskv checkpoint (format {meta.get('format')!r})")
    if bool(meta.get("update_on_kvstore")) != bool(trainer.update_on_kvstore):
        raise InvalidArgumentError(
            f"{path} was saved with update_on_kvstore={meta.get('update_on_kvstore')}, "
            f"this trainer has update_on_kvstore={trainer.update_on_kvstore}"
        )
    arg, aux = load_params(path / PARAMS)
    group.set_params(arg, aux)
    trainer.sync_params()
    trainer.load_states(str(path / OPTIMIZER))
    return dict(meta)
