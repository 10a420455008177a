"""A worker's compression residuals in a server checkpoint: ``worker-<rank>.safetensors``.

A worker that compresses its pushes (``set_gradient_compression``) keeps, per part of
each key (server key, offset), what compression left out so far. ``kv.save_checkpoint``
has every such worker write them next to the servers' shards, before worker 0's manifest
commits the checkpoint (the directory layout is :mod:`pskv.checkpoints`'s): each residual
as tensor ``r<i>`` (float32, 1-D), and in the safetensors metadata a JSON document —
format, version, rank, numbers of workers and servers, the compression's parameters, and
per residual its server key, offset and size. Nothing is unpickled; a file is read whole
and every entry checked (names, dtype, shape against the size it claims) before use; the
sizes are checked against the job's key layout when the keys are created again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save_file

from pskv.atomic import write_atomic
from pskv.checkpoints import worker_file
from pskv.errors import CheckpointError

__all__ = ["FORMAT", "SavedResiduals", "read_residuals", "write_residuals"]

FORMAT = "pskv.worker-residuals"
VERSION = 1


@dataclass(frozen=True)
class SavedResiduals:
    """What one worker saved."""

    rank: int
    num_workers: int
    num_servers: int
    compression: dict[str, Any]  # the compressor's parameters and both_ways / min_size (JSON)
    parts: dict[tuple[int, int], np.ndarray[Any, Any]]  # (server key, offset) -> float32 residual


def write_residuals(directory: str | os.PathLike[str], state: SavedResiduals) -> Path:
    """Write ``state`` atomically as ``worker-<rank>.safetensors``; returns the path.

    Raises:
        CheckpointError: the file could not be written.
    """
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    parts = []
    for i, ((key, offset), residual) in enumerate(sorted(state.parts.items(), key=lambda kv: kv[0])):
        tensors[f"r{i}"] = np.ascontiguousarray(residual, np.float32).reshape(-1)
        parts.append({"key": key, "offset": offset, "size": int(residual.size)})
    doc = {"format": FORMAT, "version": VERSION, "rank": state.rank, "num_workers": state.num_workers,
           "num_servers": state.num_servers, "compression": state.compression, "parts": parts}
    path = worker_file(directory, state.rank)
    try:
        write_atomic(path, lambda tmp: save_file(tensors, str(tmp), metadata={"pskv": json.dumps(doc)}))
    except OSError as exc:
        raise CheckpointError(f"worker {state.rank} could not write {path}: {exc}") from exc
    return path


def read_residuals(directory: str | os.PathLike[str], rank: int) -> SavedResiduals | None:
    """Worker ``rank``'s residuals in a checkpoint directory, or None if it has no file there.

    Raises:
        CheckpointError: the file is unreadable, not a pskv worker-residuals file, or an
            entry does not fit what it claims (a name, dtype or size).
    """
    path = worker_file(directory, rank)
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
        doc = json.loads(meta["pskv"])
        tensors = load_file(str(path))
    except (SafetensorError, OSError, KeyError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a pskv worker-residuals file: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise CheckpointError(f"{path} is not a pskv worker-residuals file")
    try:
        entries = doc["parts"]
        compression = doc["compression"]
        if not isinstance(entries, list) or not isinstance(compression, dict):
            raise TypeError("parts must be a list and compression a dict")
        parts = _parts(entries, tensors, path)
        saved = SavedResiduals(int(doc["rank"]), int(doc["num_workers"]), int(doc["num_servers"]), compression, parts)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{path} is damaged: {exc!r}") from exc
    if saved.rank != rank:
        raise CheckpointError(f"{path} holds worker {saved.rank}'s residuals, not worker {rank}'s")
    return saved


def _parts(entries: list[Any], tensors: Mapping[str, np.ndarray[Any, Any]],
           path: Path) -> dict[tuple[int, int], np.ndarray[Any, Any]]:
    """Each entry's residual, checked: one tensor per entry, float32, 1-D, of the size it claims."""
    if set(tensors) != {f"r{i}" for i in range(len(entries))}:
        raise CheckpointError(f"{path}: its tensors {sorted(tensors)[:8]} do not match its {len(entries)} entries")
    parts: dict[tuple[int, int], np.ndarray[Any, Any]] = {}
    for i, entry in enumerate(entries):
        key, offset, size = int(entry["key"]), int(entry["offset"]), int(entry["size"])
        residual = tensors[f"r{i}"]
        if key < 0 or offset < 0 or (key, offset) in parts:
            raise CheckpointError(f"{path}: entry {i} names key {key} offset {offset} (negative or twice)")
        if residual.dtype != np.float32 or residual.shape != (size,):
            raise CheckpointError(f"{path}: the residual of key {key} offset {offset} is {residual.dtype}"
                                  f"{list(residual.shape)}; its entry claims float32[{size}]")
        parts[(key, offset)] = residual
    return parts
