"""Server checkpoints: one server's shard in a file, and the manifest that makes a set of them a checkpoint.

A checkpoint is a directory written by ``kv.save_checkpoint`` (collective):

* ``server-<rank>.safetensors`` — one per server, written by that server: every part's
  value (as stored: bfloat16 parts as float32) as tensor ``p<i>``, the optimizer's
  state and config (pskv's optimizer-state file, as the bytes of tensor
  ``optimizer``), and in the safetensors metadata a JSON document: format, version,
  rank, number of servers and workers, sync or async, and per part its key, offset,
  dtype, completed rounds and whether it is a ``summed`` key;
* ``manifest.json`` — written by worker 0 after every server has written its file: the
  commit point. A directory without it (a crash during the save) is not a checkpoint.

Every file is written under a temporary name, flushed to disk and renamed into place,
so a crash leaves the old file or the new one, never half of one. Nothing is
unpickled: tensors and JSON only. Files are written on the servers' hosts (use a
shared file system across hosts).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from pskv.atomic import write_atomic, write_text_atomic
from pskv.errors import CheckpointError

__all__ = [
    "FORMAT", "MANIFEST", "PartState", "ShardState", "latest_checkpoint", "read_manifest", "read_shard",
    "shard_file", "write_manifest", "write_shard",
]

FORMAT = "pskv.server-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
_NAME = re.compile(r"^ckpt-(\d+)$")


@dataclass(frozen=True)
class PartState:
    """One saved part."""

    key: int
    offset: int
    dtype: str  # the part's wire dtype ("bfloat16" parts are stored as float32)
    value: np.ndarray[Any, Any]  # 1-D, storage dtype
    round: int
    summed: bool = False
    counts: Mapping[int, int] | None = None  # worker node id -> pushes of this part so far


@dataclass(frozen=True)
class ShardState:
    """What one server saves."""

    rank: int
    num_servers: int
    num_workers: int
    sync: bool
    parts: tuple[PartState, ...]
    optimizer: bytes | None  # an optimizer-state file (pskv.optimizer.states), or None


def shard_file(directory: str | os.PathLike[str], rank: int) -> Path:
    """The file server ``rank`` writes in a checkpoint directory."""
    return Path(directory) / f"server-{rank}.safetensors"


def write_shard(directory: str | os.PathLike[str], state: ShardState) -> Path:
    """Write ``state`` atomically as ``server-<rank>.safetensors``; returns the path.

    Raises:
        CheckpointError: the file could not be written.
    """
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    parts = []
    for i, p in enumerate(state.parts):
        tensors[f"p{i}"] = np.ascontiguousarray(p.value)
        parts.append({"key": p.key, "offset": p.offset, "dtype": p.dtype, "round": p.round, "summed": p.summed,
                      "counts": {str(w): c for w, c in (p.counts or {}).items()}})
    if state.optimizer is not None:
        tensors["optimizer"] = np.frombuffer(state.optimizer, dtype=np.uint8)
    doc = {"format": FORMAT, "version": VERSION, "rank": state.rank, "num_servers": state.num_servers,
           "num_workers": state.num_workers, "sync": state.sync, "parts": parts,
           "optimizer": state.optimizer is not None}
    path = shard_file(directory, state.rank)
    try:
        write_atomic(path, lambda tmp: save_file(tensors, str(tmp), metadata={"pskv": json.dumps(doc)}))
    except OSError as exc:
        raise CheckpointError(f"server {state.rank} could not write {path}: {exc}") from exc
    return path


def read_shard(directory: str | os.PathLike[str], rank: int) -> ShardState:
    """Read server ``rank``'s file of a checkpoint directory.

    Raises:
        CheckpointError: missing, unreadable, or not a pskv server checkpoint.
    """
    path = shard_file(directory, rank)
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist (server {rank}'s part of the checkpoint)")
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
        doc = json.loads(meta["pskv"])
        tensors = load_file(str(path))
    except (SafetensorError, OSError, KeyError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a pskv server checkpoint: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise CheckpointError(f"{path} is not a pskv server checkpoint (format {doc.get('format')!r})")
    try:
        parts = tuple(PartState(int(p["key"]), int(p["offset"]), str(p["dtype"]), tensors[f"p{i}"],
                                int(p["round"]), bool(p.get("summed", False)),
                                {int(w): int(c) for w, c in dict(p.get("counts") or {}).items()})
                      for i, p in enumerate(doc["parts"]))
        optimizer = tensors["optimizer"].tobytes() if doc.get("optimizer") else None
        return ShardState(int(doc["rank"]), int(doc["num_servers"]), int(doc["num_workers"]), bool(doc["sync"]),
                          parts, optimizer)
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path} is damaged: {exc!r}") from exc


def write_manifest(directory: str | os.PathLike[str], manifest: Mapping[str, Any]) -> Path:
    """Write ``manifest.json`` (the commit point of a checkpoint) atomically."""
    doc = {"format": FORMAT, "version": VERSION, "time": time.time(), **manifest}
    path = Path(directory) / MANIFEST
    write_text_atomic(path, json.dumps(doc, indent=1, sort_keys=True))
    return path


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a checkpoint directory.

    Raises:
        CheckpointError: no manifest (not a complete checkpoint) or not a pskv one.
    """
    path = Path(directory) / MANIFEST
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{directory} is not a complete pskv checkpoint (no {MANIFEST})") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is unreadable: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a pskv checkpoint manifest")
    return doc


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The complete checkpoint ``<root>/ckpt-<n>`` with the highest ``n``, or None.

    Complete: its manifest reads, and every server's file it names is there.
    """
    base = Path(root)
    if not base.is_dir():
        return None
    found = sorted(((int(m.group(1)), d) for d in base.iterdir()
                    if (m := _NAME.match(d.name)) and (d / MANIFEST).is_file()), reverse=True)
    for _, d in found:
        try:
            servers = int(read_manifest(d).get("num_servers", -1))
        except (CheckpointError, TypeError, ValueError):
            continue
        if servers > 0 and all(shard_file(d, r).is_file() for r in range(servers)):
            return d
    return None
