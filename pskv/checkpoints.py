"""Checkpoint directories: their names, their commit files, and which one is the newest.

pskv writes two kinds of checkpoint, each a directory that becomes a checkpoint when
its commit file appears (written last, atomically):

========  =====================================  ================  =========================
kind      directory                              commit file       written by
========  =====================================  ================  =========================
server    ``<root>/ckpt-<n>``                    ``manifest.json`` ``kv.save_checkpoint``:
                                                                   each server its
                                                                   ``server-<rank>.safetensors``
                                                                   (:mod:`pskv.server.snapshot`),
                                                                   each compressing worker its
                                                                   ``worker-<rank>.safetensors``
                                                                   (residuals,
                                                                   :mod:`pskv.compression.residuals`),
                                                                   then worker 0 the manifest
training  ``<root>/epoch-<NNNN>``                ``meta.json``     ``pskv.parallel.save_checkpoint``
                                                                   (params, optimizer state);
                                                                   ``<root>/latest`` names the
                                                                   newest
========  =====================================  ================  =========================

This module owns that layout for every reader and writer — the servers, the workers'
store, the trainer, the launcher's restarts and ``pskv checkpoint`` — so none of them
parses a directory name of its own. File contents live with their writers.
"""

from __future__ import annotations

import enum
import json
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from pskv.atomic import write_text_atomic
from pskv.errors import CheckpointError
from pskv.safefile import read_json

__all__ = [
    "Kind", "MANIFEST", "SERVER_FORMAT", "SERVER_VERSION", "TRAINING_META", "check_whole", "is_checkpoint_name",
    "kind_of", "latest_server_checkpoint", "latest_training_checkpoint", "mark_latest_training",
    "next_server_checkpoint", "read_manifest", "restart_checkpoint", "shard_file", "training_dir", "worker_file",
    "write_manifest",
]

SERVER_FORMAT = "pskv.server-checkpoint"
SERVER_VERSION = 1
MANIFEST = "manifest.json"
TRAINING_META = "meta.json"
LATEST = "latest"
_SERVER_NAME = re.compile(r"^ckpt-(\d+)$")
_TRAINING_NAME = re.compile(r"^epoch-(\d+)$")


class Kind(enum.Enum):
    """What a checkpoint directory holds."""

    SERVER = "server"  # the servers' shards (kv.save_checkpoint)
    TRAINING = "training"  # a trainer's parameters and optimizer state (fit's checkpoint_dir)


def kind_of(directory: str | os.PathLike[str]) -> Kind | None:
    """The kind of checkpoint ``directory`` is (by its commit file), or None if it is none."""
    d = Path(directory)
    if (d / MANIFEST).is_file():
        return Kind.SERVER
    if (d / TRAINING_META).is_file():
        return Kind.TRAINING
    return None


def is_checkpoint_name(name: str) -> bool:
    """Whether ``name`` is a checkpoint directory's name (``ckpt-<n>`` or ``epoch-<n>``); a writer's
    temporary directory (``.epoch-<n>.tmp``) or any other folder is not."""
    return bool(_SERVER_NAME.match(name) or _TRAINING_NAME.match(name))


def check_whole(path: str | os.PathLike[str]) -> None:
    """Check, cheaply, that ``path`` is a whole safetensors file: its header parses and the data
    its tensors claim covers exactly the rest of the file (a file cut short fails). No tensor is
    read, so this costs the same for a file of kilobytes and one of gigabytes.

    Raises:
        CheckpointError: missing, unreadable, not a safetensors file, or cut short (naming it).
    """
    try:
        with safe_open(os.fspath(path), "numpy"):
            pass
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing") from None
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is damaged: {exc}") from None


# -- server checkpoints -------------------------------------------------------------------
def shard_file(directory: str | os.PathLike[str], rank: int) -> Path:
    """The file server ``rank`` writes in a server checkpoint directory."""
    return Path(directory) / f"server-{rank}.safetensors"


def worker_file(directory: str | os.PathLike[str], rank: int) -> Path:
    """The file worker ``rank`` writes in a server checkpoint directory (its compression residuals)."""
    return Path(directory) / f"worker-{rank}.safetensors"


def next_server_checkpoint(root: str | os.PathLike[str]) -> Path:
    """``<root>/ckpt-<n>`` with ``n`` one more than the highest existing one (1 if none)."""
    base = Path(root)
    numbers = [int(m.group(1)) for d in (base.iterdir() if base.is_dir() else ()) if (m := _SERVER_NAME.match(d.name))]
    return base / f"ckpt-{max(numbers, default=0) + 1}"


def write_manifest(directory: str | os.PathLike[str], manifest: Mapping[str, Any]) -> Path:
    """Write ``manifest.json`` (the commit point of a server checkpoint) atomically."""
    doc = {"format": SERVER_FORMAT, "version": SERVER_VERSION, "time": time.time(), **manifest}
    path = Path(directory) / MANIFEST
    write_text_atomic(path, json.dumps(doc, indent=1, sort_keys=True))
    return path


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a server checkpoint directory.

    Raises:
        CheckpointError: no manifest (not a complete checkpoint) or not a pskv one.
    """
    path = Path(directory) / MANIFEST
    try:
        doc = read_json(path)
    except FileNotFoundError:
        raise CheckpointError(f"{directory} is not a complete pskv checkpoint (no {MANIFEST})") from None
    if not isinstance(doc, dict) or doc.get("format") != SERVER_FORMAT:
        raise CheckpointError(f"{path} is not a pskv checkpoint manifest")
    return doc


def latest_server_checkpoint(root: str | os.PathLike[str], note: Callable[[str], None] | None = None) -> Path | None:
    """The complete server checkpoint ``<root>/ckpt-<n>`` with the highest ``n``, or None.

    Complete: its manifest reads, and every server's file it names is there and whole
    (:func:`check_whole`: its header and its length, no tensor read). A committed one (its
    manifest is there) that is damaged is skipped, and ``note``, when given, gets one line
    saying which and why.
    """
    for d in _committed(root):
        try:
            servers = read_manifest(d).get("num_servers")
            if not isinstance(servers, int) or isinstance(servers, bool) or servers <= 0:
                raise CheckpointError(f"{d / MANIFEST} names no number of servers ({servers!r})")
            for rank in range(servers):
                check_whole(shard_file(d, rank))
        except CheckpointError as exc:
            if note is not None:
                note(f"skipping damaged checkpoint {d}: {exc}")
            continue
        return d
    return None


def restart_checkpoint(root: str | os.PathLike[str], note: Callable[[str], None]) -> Path | None:
    """The checkpoint a restart resumes from: :func:`latest_server_checkpoint`, each damaged one
    skipped with a line to ``note``; None when ``root`` holds no committed one.

    Raises:
        CheckpointError: it holds committed checkpoints and every one is damaged (one line).
    """
    found = latest_server_checkpoint(root, note)
    if found is None and _committed(root):
        raise CheckpointError(f"no usable checkpoint in {root}: every one is damaged")
    return found


def _committed(root: str | os.PathLike[str]) -> list[Path]:
    """The directories ``<root>/ckpt-<n>`` that have a manifest, highest ``n`` first."""
    base = Path(root)
    if not base.is_dir():
        return []
    found = sorted(((int(m.group(1)), d) for d in base.iterdir()
                    if (m := _SERVER_NAME.match(d.name)) and (d / MANIFEST).is_file()), reverse=True)
    return [d for _, d in found]


# -- training checkpoints -----------------------------------------------------------------
def training_dir(root: str | os.PathLike[str], epoch: int) -> Path:
    """``<root>/epoch-<NNNN>``: where the training checkpoint of ``epoch`` goes."""
    return Path(root) / f"epoch-{epoch:04d}"


def mark_latest_training(root: str | os.PathLike[str], directory: Path) -> None:
    """Point ``<root>/latest`` at ``directory`` (atomically)."""
    write_text_atomic(Path(root) / LATEST, directory.name + "\n")


def latest_training_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The newest complete training checkpoint under ``root`` (None when there is none).

    ``<root>/latest`` names it; without that pointer, the complete ``epoch-<n>`` of the highest ``n``
    (compared as numbers: ``epoch-10000`` is newer than ``epoch-9999``).
    """
    base = Path(root)
    pointer = base / LATEST
    if pointer.is_file():
        candidate = base / pointer.read_text(encoding="utf-8").strip()
        if _TRAINING_NAME.match(candidate.name) and (candidate / TRAINING_META).is_file():
            return candidate
    done = sorted((int(m.group(1)), p) for p in base.glob("epoch-[0-9]*")
                  if (m := _TRAINING_NAME.match(p.name)) and (p / TRAINING_META).is_file()) if base.is_dir() else []
    return done[-1][1] if done else None
