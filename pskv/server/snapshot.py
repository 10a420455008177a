"""Server checkpoints: one server's shard in a file (the directory layout is :mod:`pskv.checkpoints`).

A checkpoint is a directory written by ``kv.save_checkpoint`` (collective):

* ``server-<rank>.safetensors`` — one per server, written by that server: every part's
  value (as stored: bfloat16 parts as float32) as tensor ``p<i>``, the optimizer's
  state and config (pskv's optimizer-state file, as the bytes of tensor
  ``optimizer``), and in the safetensors metadata a JSON document: format, version,
  rank, number of servers and workers, sync or async, and per part its key, offset,
  dtype, completed rounds and whether it is a ``summed`` key (a row-sparse part: its
  ``row_width`` and its present rows, local ids, as tensor ``i<i>``); and the reply compression
  (``both_ways``, :mod:`pskv.server.squeeze`) of each part that has one: its residual as
  tensor ``r<j>``, its latest round's payload as ``q<j>``, and in the JSON that round and
  the compression's parameters (a file without the ``replies`` entry predates them); and
  the placement rule the job cut its values by (:func:`pskv.partition.placement_name`; a
  file without it predates the even placement);
* ``manifest.json`` — written by worker 0 after every server has written its file: the
  commit point. A directory without it (a crash during the save) is not a checkpoint.

Every file is written under a temporary name, flushed to disk and renamed into place,
so a crash leaves the old file or the new one, never half of one. Nothing is
unpickled: tensors and JSON only. Files are written on the servers' hosts (use a
shared file system across hosts).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pskv.checkpoints import (
    MANIFEST,
    SERVER_FORMAT,
    SERVER_VERSION,
    latest_server_checkpoint,
    read_manifest,
    shard_file,
    write_manifest,
)
from pskv.compression import create
from pskv.errors import CheckpointError, KVStoreError
from pskv.safefile import read_document, write_document
from pskv.server.part import storage_dtype

__all__ = [
    "FORMAT", "MANIFEST", "PartState", "ReplyState", "ShardState", "latest_checkpoint", "read_manifest", "read_shard",
    "shard_file", "write_manifest", "write_shard",
]

FORMAT = SERVER_FORMAT
VERSION = SERVER_VERSION
latest_checkpoint = latest_server_checkpoint  # the directory layout lives in pskv.checkpoints


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
    row_width: int = 0  # > 0: a row-sparse part (rows of this many elements)
    present: np.ndarray[Any, Any] | None = None  # a row-sparse part: local ids of its present rows (int64)


@dataclass(frozen=True)
class ReplyState:
    """One part's reply compression (``both_ways``): its residual and the payload of its latest round."""

    key: int
    offset: int
    round: int
    compression: Mapping[str, Any]  # the compressor's parameters (JSON)
    payload: np.ndarray[Any, Any]  # uint8
    residual: np.ndarray[Any, Any]  # float32, the part's size


@dataclass(frozen=True)
class ShardState:
    """What one server saves."""

    rank: int
    num_servers: int
    num_workers: int
    sync: bool
    parts: tuple[PartState, ...]
    optimizer: bytes | None  # an optimizer-state file (pskv.optimizer.states), or None
    replies: tuple[ReplyState, ...] | None = None  # None: read from a file that predates them
    placement: str | None = None  # pskv.partition.placement_name; None: a file that predates it


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
        if p.row_width:
            parts[-1]["row_width"] = p.row_width
            tensors[f"i{i}"] = np.ascontiguousarray(p.present if p.present is not None else np.zeros(0), np.int64)
    if state.optimizer is not None:
        tensors["optimizer"] = np.frombuffer(state.optimizer, dtype=np.uint8)
    replies = []
    for j, r in enumerate(state.replies or ()):
        tensors[f"r{j}"] = np.ascontiguousarray(r.residual, np.float32)
        tensors[f"q{j}"] = np.ascontiguousarray(r.payload, np.uint8)
        replies.append({"key": r.key, "offset": r.offset, "round": r.round, "compression": dict(r.compression)})
    doc = {"rank": state.rank, "num_servers": state.num_servers, "num_workers": state.num_workers, "sync": state.sync,
           "parts": parts, "optimizer": state.optimizer is not None, "replies": replies}
    if state.placement is not None:
        doc["placement"] = state.placement
    path = shard_file(directory, state.rank)
    write_document(path, FORMAT, VERSION, doc, tensors, writer=f"server {state.rank}")
    return path


def read_shard(directory: str | os.PathLike[str], rank: int) -> ShardState:
    """Read server ``rank``'s file of a checkpoint directory.

    Raises:
        CheckpointError: missing, unreadable, or not a pskv server checkpoint.
    """
    path = shard_file(directory, rank)
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist (server {rank}'s part of the checkpoint)")
    doc, tensors = read_document(path, FORMAT, VERSION, what="pskv server checkpoint")
    try:
        parts = tuple(_rows_checked(PartState(int(p["key"]), int(p["offset"]), str(p["dtype"]), tensors[f"p{i}"],
                                              int(p["round"]), bool(p.get("summed", False)),
                                              {int(w): int(c) for w, c in dict(p.get("counts") or {}).items()},
                                              int(p.get("row_width", 0)), tensors.get(f"i{i}")), path)
                      for i, p in enumerate(doc["parts"]))
        optimizer = tensors["optimizer"].tobytes() if doc.get("optimizer") else None
        state = ShardState(int(doc["rank"]), int(doc["num_servers"]), int(doc["num_workers"]), bool(doc["sync"]),
                           parts, optimizer, placement=None if doc.get("placement") is None else str(doc["placement"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path} is damaged: {exc!r}") from exc
    if "replies" not in doc:
        return state
    try:
        replies = _replies(doc["replies"], tensors, parts, path)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{path}: its reply compressions are damaged: {exc!r}") from exc
    return dataclasses.replace(state, replies=replies)


def _rows_checked(part: PartState, path: Path) -> PartState:
    """A saved part checked: a flat value of its dtype's storage dtype; a row-sparse part's value
    whole rows, its present rows int64, in range, sorted and unique (checked without int64 wrap).

    Raises:
        CheckpointError: they do not fit.
    """
    where = f"{path}: key {part.key} offset {part.offset}"
    try:
        stored = storage_dtype(part.dtype)
    except (KVStoreError, TypeError, ValueError):
        raise CheckpointError(f"{where} has an unknown dtype {part.dtype!r}") from None
    if part.value.ndim != 1 or part.value.dtype != stored:
        raise CheckpointError(f"{where} holds {part.value.dtype}{list(part.value.shape)}, not a flat {stored} value "
                              f"(a {part.dtype} part)")
    if not part.row_width:
        return dataclasses.replace(part, present=None)
    present = part.present
    rows = part.value.size // part.row_width if part.row_width > 0 else -1
    bad = (part.row_width < 0 or part.value.size % part.row_width or present is None or present.dtype != np.int64
           or present.ndim != 1)
    if not bad and present is not None and present.size:  # in range first: then the differences cannot wrap
        bad = int(present.min()) < 0 or int(present.max()) >= rows or not bool((np.diff(present) > 0).all())
    if bad:
        raise CheckpointError(f"{path}: the row-sparse part of key {part.key} offset {part.offset} is damaged (rows of "
                              f"{part.row_width}, {part.value.size} values, its present rows do not fit)")
    return part


def _replies(entries: Any, tensors: Mapping[str, np.ndarray[Any, Any]], parts: tuple[PartState, ...],
             path: Path) -> tuple[ReplyState, ...]:
    """The file's reply compressions, each checked against the part it claims (size, dtype, payload length).

    Raises:
        CheckpointError: an entry names no saved part, or a tensor does not fit it.
    """
    sizes = {(p.key, p.offset): p.value.size for p in parts}
    if not isinstance(entries, list) or len(entries) > len(parts):
        raise CheckpointError(f"{path}: its reply compressions are not a list of at most one per part")
    out = []
    for j, r in enumerate(entries):
        where = (int(r["key"]), int(r["offset"]))
        size = sizes.get(where)
        if size is None:
            raise CheckpointError(f"{path}: a reply compression names key {where[0]} offset {where[1]}, "
                                  "which the file does not hold")
        residual, payload = tensors[f"r{j}"], tensors[f"q{j}"]
        compression = r["compression"]
        if not isinstance(compression, dict):
            raise CheckpointError(f"{path}: the reply compression of key {where[0]} has no parameters")
        try:
            expected = create(compression).payload_bytes(size)
        except (KVStoreError, TypeError) as exc:
            raise CheckpointError(f"{path}: the reply compression of key {where[0]}: {exc}") from None
        if residual.dtype != np.float32 or residual.shape != (size,) or payload.dtype != np.uint8 \
                or payload.shape != (expected,):
            raise CheckpointError(f"{path}: the reply residual / payload of key {where[0]} offset {where[1]} "
                                  f"({residual.dtype}{list(residual.shape)}, {payload.dtype}{list(payload.shape)}) "
                                  f"do not fit its {size} values (float32[{size}], uint8[{expected}])")
        out.append(ReplyState(where[0], where[1], int(r["round"]), compression, payload, residual))
    return tuple(out)
