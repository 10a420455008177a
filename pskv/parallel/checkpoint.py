"""Training checkpoints: parameters + optimizer state + progress, safe (no pickle) and atomic.

A checkpoint is a directory ``<root>/epoch-NNNN/`` holding

* ``params.safetensors`` — parameters (``arg:<name>``) and buffers (``aux:<name>``),
  averaged over devices;
* ``optimizer.safetensors`` — the optimizer state and config (pskv's state format); in
  distributed mode with ``update_on_kvstore`` rank 0 writes each server's state as
  ``optimizer.safetensors.server<rank>`` (``kv.save_optimizer_states``: the servers send it);
* ``residuals.safetensors`` — with gradient compression on a ``local`` / ``device`` store,
  the store's residuals (per key and device; the file is :mod:`pskv.compression.residuals`'s).
  A distributed store's residuals live in its workers: ``kv.save_checkpoint`` saves those
  (:mod:`pskv.worker.compressing`);
* the store's embedding tables (:class:`pskv.parallel.Embedding`; row-sparse keys that
  never live on a worker as parameters): with a ``local`` / ``device`` store,
  ``tables.safetensors`` holds each table's present rows (``ids<i>``: sorted unique
  int64 row ids, ``rows<i>``: those rows; in the metadata a JSON document with each
  table's key, shape and dtype), and their optimizer state is the store's, in
  ``optimizer.safetensors``. With a ``dist_*`` store the tables stay on the servers: the
  checkpoint holds a server checkpoint, ``servers/`` (``kv.save_checkpoint``: every
  server writes its row ranges, their present rows and their optimizer state itself, so
  no worker ever holds a table, however big), and resuming needs the job started from it
  (``PSKV_RESUME_FROM=<checkpoint>/servers``); a job started otherwise is refused, naming
  it. The servers have no operation that writes rows past their optimizer, which is why
  the rows are not pulled through a worker and pushed back;
* ``meta.json`` — epoch, format version, store type, number of workers.

It is written under a temporary name and renamed into place, so a crash leaves either
the previous checkpoint or the new one, never half of one; ``<root>/latest`` names the
newest complete checkpoint. Nothing is ever unpickled: safetensors and JSON only.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from pskv.arrays import is_torch, to_numpy
from pskv.atomic import fsync_dir, write_text_atomic
from pskv.checkpoints import TRAINING_META, latest_training_checkpoint, mark_latest_training, training_dir
from pskv.compression.residuals import read_store_file, write_store_file
from pskv.errors import CheckpointError, InvalidArgumentError
from pskv.kvstore.compressing import GradientCompression
from pskv.kvstore.local_rows import sparse_parts
from pskv.safefile import read_document, read_json, write_document

if TYPE_CHECKING:  # the trainer's fit() uses these; they only need its type
    from pskv.parallel.trainer import Trainer

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint", "save_params", "load_params", "FORMAT"]

FORMAT = "pskv-checkpoint-1"
PARAMS = "params.safetensors"
OPTIMIZER = "optimizer.safetensors"
RESIDUALS = "residuals.safetensors"
TABLES = "tables.safetensors"
TABLES_FORMAT = "pskv.store-tables"
SERVERS = "servers"  # a dist_* store's tables: the server checkpoint written with the training checkpoint
META = TRAINING_META

log = logging.getLogger("pskv.parallel")


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
    tables = _save_tables(trainer, tmp, epoch, rank)  # collective on a distributed store
    if rank == 0:
        arg, aux = group.get_params()
        save_params(tmp / PARAMS, arg, aux)
        residuals = _save_residuals(trainer, tmp / RESIDUALS)
        meta = {"format": FORMAT, "epoch": epoch, "store": kv.type if kv is not None else None,
                "num_workers": kv.num_workers if kv is not None else 1,
                "update_on_kvstore": trainer.update_on_kvstore, **({"residuals": RESIDUALS} if residuals else {}),
                **({"tables": tables} if tables else {}), **(extra or {})}
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
    optimizer state is restored, then the embedding tables' rows (a ``local`` /
    ``device`` store; a ``dist_*`` store must have been started from the checkpoint's
    ``servers/``). Returns the checkpoint's ``meta.json``.

    Raises:
        InvalidArgumentError: not a checkpoint, or written with the other
            ``update_on_kvstore`` mode (its optimizer state lives elsewhere).
        OptimizerStateError: the optimizer state does not fit.
        CheckpointError: the tables file is damaged or does not fit the model's tables
            (naming the file and the table), or a ``dist_*`` store was not started from
            the checkpoint's server checkpoint.
    """
    group = trainer.group
    if group is None:
        raise InvalidArgumentError("checkpoints need a Trainer over a DataParallelExecutorGroup")
    path = Path(path)
    try:
        meta = read_json(path / META)
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(f"{path} is not a pskv checkpoint: {exc}") from exc
    if meta.get("format") != FORMAT:
        raise InvalidArgumentError(f"{path} is not a pskv checkpoint (format {meta.get('format')!r})")
    if bool(meta.get("update_on_kvstore")) != bool(trainer.update_on_kvstore):
        raise InvalidArgumentError(
            f"{path} was saved with update_on_kvstore={meta.get('update_on_kvstore')}, "
            f"this trainer has update_on_kvstore={trainer.update_on_kvstore}"
        )
    _check_tables(trainer, path, meta)
    arg, aux = load_params(path / PARAMS)
    group.set_params(arg, aux)
    trainer.sync_params()
    trainer.load_states(str(path / OPTIMIZER))
    _load_residuals(trainer, path, meta)
    _load_tables(trainer, path, meta)
    return dict(meta)


# ---------------------------------------------------------------------------- embedding tables


def _table_entry(table: Any) -> dict[str, Any]:
    """How the checkpoint describes a table: its store key, shape and dtype."""
    return {"key": table.key, "shape": [table.num_embeddings, table.embedding_dim],
            "dtype": str(table.dtype).removeprefix("torch.")}


def _save_tables(trainer: Trainer, tmp: Path, epoch: int, rank: int) -> dict[str, Any] | None:
    """Save the trainer's embedding tables into the checkpoint directory ``tmp`` (collective on a
    distributed store); what ``meta.json`` says of them (None: no tables)."""
    tables = trainer.tables
    kv = trainer.kvstore
    if not tables or kv is None:
        return None
    entries = [_table_entry(t) for t in tables]
    if kv.store_type.distributed:  # every server writes its rows and their optimizer state itself
        kv.save_checkpoint(str(tmp / SERVERS), meta={"training_checkpoint": epoch})
        return {"servers": SERVERS, "tables": entries}
    if rank != 0:
        return None
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    for i, table in enumerate(tables):
        ids, rows = sparse_parts(kv.pull(table.key))  # the present rows (a copy of them)
        host = to_numpy(rows) if is_torch(rows) else np.asarray(rows)
        tensors[f"ids{i}"] = np.ascontiguousarray(ids, np.int64)
        tensors[f"rows{i}"] = np.ascontiguousarray(host).reshape(len(ids), table.embedding_dim)
    write_document(tmp / TABLES, TABLES_FORMAT, 1, {"tables": entries}, tensors)
    return {"file": TABLES, "tables": entries}


def _check_tables(trainer: Trainer, path: Path, meta: dict[str, Any]) -> None:
    """Refuse, before anything is loaded, a checkpoint whose tables are not the trainer's, or a
    distributed store that was not started from the checkpoint's server checkpoint.

    Raises:
        CheckpointError: naming the checkpoint and the tables (or the server checkpoint to start from).
    """
    held = meta.get("tables")
    want = [_table_entry(t) for t in trainer.tables]
    saved = held.get("tables") if isinstance(held, dict) else None
    if held is None and not want:
        return
    if saved != want:
        raise CheckpointError(f"{path} holds the embedding tables {saved if held is not None else []}, this model has "
                              f"{want}: it is not this model's checkpoint")
    kv = trainer.kvstore
    distributed = kv is not None and kv.store_type.distributed
    if distributed != ("servers" in held):  # type: ignore[operator]  # held is a dict: saved matched want
        raise CheckpointError(f"{path}: its tables were saved with a {meta.get('store')!r} store, this trainer's is "
                              f"{kv.type if kv is not None else None!r}")
    if distributed:
        servers = path / SERVERS
        resumed = getattr(kv, "resumed", None)
        started = Path(resumed["path"]).resolve() if isinstance(resumed, dict) and "path" in resumed else None
        if started != servers.resolve() or resumed.get("meta") != {"training_checkpoint": meta.get("epoch")}:  # type: ignore[union-attr]
            raise CheckpointError(
                f"{path}: the embedding tables {[e['key'] for e in want]} are in its server checkpoint {servers}, but "
                f"this job's servers started from {started or 'no checkpoint'}: start the job with "
                f"PSKV_RESUME_FROM={servers} in every process (pskv launch has no option for it: export it in the "
                "shell of `pskv launch --launcher local`, or start the processes without pskv launch)")


def _load_tables(trainer: Trainer, path: Path, meta: dict[str, Any]) -> None:
    """Give a ``local`` / ``device`` store the tables' rows back (a distributed store's servers loaded them
    when they started); prefetched rows are dropped.

    Raises:
        CheckpointError: the tables file is damaged (naming it and the tensor).
    """
    tables = trainer.tables
    kv = trainer.kvstore
    if not tables or kv is None:
        return
    if not kv.store_type.distributed:
        saved = _read_tables(path / meta["tables"]["file"], [_table_entry(t) for t in tables])
        for table, (ids, rows) in zip(tables, saved):
            kv.restore_rows(table.key, ids, rows)
    for table in tables:
        table.forget_prefetch()


def _read_tables(path: Path, want: list[dict[str, Any]]) -> list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
    """Each table's ``(ids, rows)`` from the tables file, checked: its document is ``want``, the tensors are
    exactly ``ids<i>`` / ``rows<i>``, ids int64, sorted, unique and in range, rows ``(len(ids), dim)`` of the
    table's dtype.

    Raises:
        CheckpointError: unreadable, not a pskv tables file, or damaged; naming the file and the table.
    """
    doc, tensors = read_document(path, TABLES_FORMAT, 1, what="usable pskv tables file")
    if doc.get("tables") != want:
        raise CheckpointError(f"{path} is not the tables file of this model's tables {want}")
    names = {f"{kind}{i}" for i in range(len(want)) for kind in ("ids", "rows")}
    if set(tensors) != names:
        raise CheckpointError(f"{path} holds the tensors {sorted(tensors)}, expected {sorted(names)}")
    out = []
    for i, entry in enumerate(want):
        ids, rows = tensors[f"ids{i}"], tensors[f"rows{i}"]
        (num, dim), what = entry["shape"], f"{path}: table {entry['key']!r}"
        if ids.dtype != np.int64 or ids.ndim != 1 or ids.size > num:
            raise CheckpointError(f"{what}: ids are {ids.dtype}{list(ids.shape)}, expected int64 of at most {num}")
        if ids.size and (int(ids[0]) < 0 or int(ids[-1]) >= num or not bool(np.all(ids[1:] > ids[:-1]))):
            raise CheckpointError(f"{what}: ids are not sorted, unique and within 0..{num - 1}")
        if rows.dtype != np.dtype(entry["dtype"]) or rows.shape != (ids.size, dim):
            raise CheckpointError(f"{what}: rows are {rows.dtype}{list(rows.shape)}, expected "
                                  f"{entry['dtype']}{[ids.size, dim]}")
        out.append((ids, rows))
    return out


def _compression(trainer: Trainer) -> GradientCompression | None:
    """The gradient compression of the trainer's store, if it has one."""
    found = getattr(trainer.kvstore, "_compression", None)  # the store front end's (set_gradient_compression)
    return found if isinstance(found, GradientCompression) else None


def _key_sizes(trainer: Trainer) -> dict[Any, tuple[int, int]]:
    """Each store key of the trainer: (elements, devices)."""
    return dict(trainer.key_sizes)


def _save_residuals(trainer: Trainer, path: Path) -> bool:
    """Write the ``local`` / ``device`` store's compression residuals to ``path``; whether it did."""
    compression = _compression(trainer)
    if compression is None:
        return False
    kv = trainer.kvstore
    if kv is not None and kv.store_type.distributed:
        log.warning("training checkpoint: a distributed store's compression residuals are not in it (they live "
                    "in its workers; kv.save_checkpoint saves them)")
        return False
    write_store_file(path, compression.params, compression.residual_state())
    return True


def _load_residuals(trainer: Trainer, path: Path, meta: dict[str, Any]) -> None:
    """Give the store back the residuals the checkpoint ``path`` holds; those that cannot come back start
    at zero, with a WARNING naming why.

    Raises:
        InvalidArgumentError: the residuals file is not a pskv one, or a tensor does not fit its entry.
    """
    compression = _compression(trainer)
    held = meta.get("residuals") == RESIDUALS
    if compression is None:
        if held:
            log.warning("training checkpoint %s: its compression residuals are dropped: this trainer's store does "
                        "not compress", path)
        return
    kv = trainer.kvstore
    if kv is not None and kv.store_type.distributed:
        if getattr(kv, "resumed", None) is None:
            log.warning("training checkpoint %s: a distributed store's compression residuals start at zero "
                        "(training checkpoints do not hold them; kv.save_checkpoint's do)", path)
        return
    why = "" if held else "it holds none (written before they were saved, or without compression)"
    made_by, saved = ({}, []) if why else read_store_file(path / RESIDUALS)
    if not why and made_by != compression.params:
        why = f"they were made by compression {made_by}, this store's is {compression.params}"
    sizes = _key_sizes(trainer)
    for key, device, values, _ in [] if why else saved:
        size = values.size
        have = sizes.get(key) if isinstance(key, (int, str)) else None
        if have is None or not isinstance(device, int) or not 0 <= device < have[1] or size != have[0]:
            why = (f"key {key!r} device {device!r} of {size} values does not fit this trainer's keys "
                   f"({'no such key' if have is None else f'{have[0]} values on {have[1]} devices'})")
            break
    if why:
        log.warning("training checkpoint %s: compression residuals start at zero, not restored: %s", path, why)
        return
    compression.load_residuals(saved)

