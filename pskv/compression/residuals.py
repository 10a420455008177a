"""Compression residuals (error feedback): their state, and the files that keep them in checkpoints.

Every sender that compresses — a ``local`` / ``device`` store per key and device
(:class:`pskv.kvstore.compressing.GradientCompression`), a worker per part of each key
(:class:`pskv.worker.compressing.PushCompression`) — keeps in :class:`Residuals`, per
``(key, sender)``, what compression left out so far. This module is their one owner, and
the owner of the two files that hold them (:mod:`pskv.safefile` documents, nothing
unpickled, every entry checked — name, dtype, shape against the size it claims — before use):

* ``worker-<rank>.safetensors`` in a server checkpoint (``kv.save_checkpoint``,
  :func:`write_worker_file` / :func:`read_worker_file`): per residual tensor ``r<i>``
  (float32, 1-D); the document holds the rank, the numbers of workers and servers, the
  compression's parameters, and per residual its server key, offset and size;
* ``residuals.safetensors`` in a training checkpoint (``local`` / ``device`` stores,
  :func:`write_store_file` / :func:`read_store_file`): tensors ``r<i>`` and per residual
  its key, device, size and whether it lived on an accelerator.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pskv.checkpoints import worker_file
from pskv.errors import CheckpointError, InvalidArgumentError
from pskv.safefile import read_document, write_document

__all__ = ["STORE_FORMAT", "WORKER_FORMAT", "Residuals", "SavedResiduals", "StoreResidual", "read_store_file",
           "read_worker_file", "write_store_file", "write_worker_file"]

WORKER_FORMAT = "pskv.worker-residuals"
STORE_FORMAT = "pskv.store-residuals"
_VERSION = 1

#: One residual of a store: ``(key, device, values (float32, 1-D), on an accelerator)``.
StoreResidual = tuple[Any, int, np.ndarray[Any, Any], bool]


class Residuals:
    """Per key and sender (a device, a worker), what compression left out so far (float32, zeros at first)."""

    def __init__(self) -> None:
        self._of: dict[tuple[Any, int], np.ndarray[Any, Any]] = {}

    def get(self, key: Any, sender: int, n: int) -> np.ndarray[Any, Any]:
        """The residual of ``key`` from ``sender`` (``n`` elements; made zero on first use)."""
        res = self._of.get((key, sender))
        if res is None or res.size != n:
            res = self._of[(key, sender)] = np.zeros(n, np.float32)
        return res

    def items(self) -> list[tuple[tuple[Any, int], np.ndarray[Any, Any]]]:
        """Every residual, by (key, sender)."""
        return list(self._of.items())

    def load(self, key: Any, sender: int, values: np.ndarray[Any, Any]) -> None:
        """Set the residual of ``key`` from ``sender`` to ``values`` (a copy; from a checkpoint)."""
        np.copyto(self.get(key, sender, values.size), values)

    def clear(self) -> None:
        self._of.clear()

    def copy(self) -> dict[tuple[Any, int], np.ndarray[Any, Any]]:
        """A copy of every residual (an elastic job's commit keeps one)."""
        return {where: res.copy() for where, res in self._of.items()}

    def reset(self, kept: dict[tuple[Any, int], np.ndarray[Any, Any]]) -> None:
        """Every residual back to ``kept`` (a :meth:`copy`; one made since is zero again)."""
        self._of = {where: res.copy() for where, res in kept.items()}

    def __len__(self) -> int:
        return len(self._of)


# -- a worker's file in a server checkpoint ----------------------------------------------------
@dataclass(frozen=True)
class SavedResiduals:
    """What one worker saved."""

    rank: int
    num_workers: int
    num_servers: int
    compression: dict[str, Any]  # the compressor's parameters and both_ways / min_size (JSON)
    parts: dict[tuple[int, int], np.ndarray[Any, Any]]  # (server key, offset) -> float32 residual


def write_worker_file(directory: str | os.PathLike[str], state: SavedResiduals) -> Path:
    """Write ``state`` atomically as ``worker-<rank>.safetensors`` in ``directory``; returns the path.

    Raises:
        CheckpointError: the file could not be written.
    """
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    parts = []
    for i, ((key, offset), residual) in enumerate(sorted(state.parts.items(), key=lambda kv: kv[0])):
        tensors[f"r{i}"] = np.ascontiguousarray(residual, np.float32).reshape(-1)
        parts.append({"key": key, "offset": offset, "size": int(residual.size)})
    doc = {"rank": state.rank, "num_workers": state.num_workers, "num_servers": state.num_servers,
           "compression": state.compression, "parts": parts}
    path = worker_file(directory, state.rank)
    try:
        write_document(path, WORKER_FORMAT, _VERSION, doc, tensors)
    except OSError as exc:
        raise CheckpointError(f"worker {state.rank} could not write {path}: {exc}") from exc
    return path


def read_worker_file(directory: str | os.PathLike[str], rank: int) -> SavedResiduals | None:
    """Worker ``rank``'s residuals in a server checkpoint directory, or None if it has no file there.

    Raises:
        CheckpointError: the file is unreadable, not a pskv worker-residuals file, or an
            entry does not fit what it claims (a name, dtype or size).
    """
    path = worker_file(directory, rank)
    if not path.is_file():
        return None
    doc, tensors = read_document(path, WORKER_FORMAT, _VERSION, what="pskv worker-residuals file")
    try:
        entries = doc["parts"]
        compression = doc["compression"]
        if not isinstance(entries, list) or not isinstance(compression, dict):
            raise TypeError("parts must be a list and compression a dict")
        parts = _worker_parts(entries, tensors, path)
        saved = SavedResiduals(int(doc["rank"]), int(doc["num_workers"]), int(doc["num_servers"]), compression, parts)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{path} is damaged: {exc!r}") from exc
    if saved.rank != rank:
        raise CheckpointError(f"{path} holds worker {saved.rank}'s residuals, not worker {rank}'s")
    return saved


def _worker_parts(entries: list[Any], tensors: Mapping[str, np.ndarray[Any, Any]],
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


# -- a local store's file in a training checkpoint ----------------------------------------------
def write_store_file(path: str | os.PathLike[str], compression: Mapping[str, Any],
                     state: list[StoreResidual]) -> None:
    """Write a store's residuals ``state`` (made by ``compression``, its parameters) to ``path``, atomically.

    Raises:
        OSError: the file could not be written.
    """
    tensors = {f"r{i}": np.ascontiguousarray(values, np.float32) for i, (_, _, values, _) in enumerate(state)}
    entries = [{"key": key, "device": device, "size": int(values.size), "on_device": on_device}
               for key, device, values, on_device in state]
    write_document(path, STORE_FORMAT, _VERSION, {"compression": dict(compression), "residuals": entries}, tensors)


def read_store_file(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[StoreResidual]]:
    """The compression parameters a store's residuals file names, and its residuals, each tensor checked
    against its entry (float32, 1-D, size); keys and devices are the caller's to check.

    Raises:
        InvalidArgumentError: unreadable, not a pskv residuals file, or damaged.
    """
    try:
        doc, tensors = read_document(path, STORE_FORMAT, _VERSION, what="pskv residuals file")
        entries = doc["residuals"]
        if not isinstance(entries, list) or not isinstance(doc.get("compression"), dict):
            raise ValueError("not a pskv residuals file")
        if set(tensors) != {f"r{i}" for i in range(len(entries))}:
            raise ValueError(f"{len(tensors)} tensors for {len(entries)} entries")
        saved = []
        for i, entry in enumerate(entries):
            values = tensors[f"r{i}"]
            if not isinstance(entry, dict) or values.dtype != np.float32 or values.shape != (entry["size"],):
                raise ValueError(f"residual {i} is {values.dtype}{list(values.shape)}, its entry claims "
                                 f"float32[{entry.get('size') if isinstance(entry, dict) else '?'}]")
            saved.append((entry["key"], entry["device"], values, bool(entry["on_device"])))
    except (CheckpointError, KeyError, TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{path} is not a usable pskv residuals file: {exc}") from exc
    return doc["compression"], saved
