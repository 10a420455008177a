"""Which compression residuals a worker takes back from a server checkpoint, and which it drops.

A worker that compresses its pushes saves its residuals (per part of each key: server
key, offset) in ``kv.save_checkpoint``'s directory, as ``worker-<rank>.safetensors``
(the file and its checks: :mod:`pskv.compression.residuals`). A resumed job reads them
back here (:meth:`RestoredResiduals.read`) and installs each key's when the key is
created again (:meth:`RestoredResiduals.take`), if its parts match. Residuals that
cannot come back start at zero, with a WARNING naming them and why: a checkpoint
without worker residuals (written before they were saved), another number of workers,
another compression, another layout of the key, or a key this job does not compress.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pskv.compression import Residuals, create
from pskv.compression.residuals import read_worker_file
from pskv.errors import KVStoreError
from pskv.worker.layout import KeyLayout

__all__ = ["RestoredResiduals"]

log = logging.getLogger("pskv.worker")


class RestoredResiduals:
    """Residuals read from a checkpoint, by server key then offset, until their keys are created again.

    Args:
        rank: this worker's rank (its file, and the warnings).
    """

    def __init__(self, rank: int) -> None:
        self._rank = rank
        self._by_key: dict[int, dict[int, np.ndarray[Any, Any]]] = {}
        self._from = ""

    def __bool__(self) -> bool:
        return bool(self._by_key)

    def read(self, directory: str | os.PathLike[str], manifest: Mapping[str, Any], num_workers: int,
             compression: Mapping[str, Any]) -> None:
        """Read this worker's residuals from the checkpoint ``directory`` (whose manifest is ``manifest``),
        if they were made by ``compression`` (the parameters of this job's) with ``num_workers`` workers.

        Raises:
            CheckpointError: this worker's file there is unreadable or damaged.
        """
        self._by_key, self._from = {}, str(directory)
        why = ""
        record = manifest.get("residuals")
        if not isinstance(record, dict):
            why = "it holds no worker residuals (written before they were saved, or without compression)"
        elif manifest.get("num_workers") != num_workers:
            why = f"it was written by {manifest.get('num_workers')} workers; this job has {num_workers}"
        saved = None if why else read_worker_file(directory, self._rank)
        if not why and saved is None:
            why = f"it has no file of worker {self._rank}"
        elif saved is not None and _compressor_params(saved.compression) != _compressor_params(compression):
            why = f"its residuals were made by compression {saved.compression}, this job's is {dict(compression)}"
        if why:
            log.warning("worker %d: compression residuals start at zero, not restored from checkpoint %s: %s",
                        self._rank, directory, why)
            return
        assert saved is not None
        for (key, offset), residual in saved.parts.items():
            self._by_key.setdefault(key, {})[offset] = residual
        log.info("worker %d: compression residuals of %d part(s) read from %s", self._rank, len(saved.parts),
                 directory)

    def take(self, layouts: Sequence[KeyLayout], residuals: Residuals) -> None:
        """Install into ``residuals`` those of ``layouts``' keys whose parts they fit; drop (warned) the others."""
        for rec in layouts:
            saved = self._by_key.pop(rec.skey, None)
            if saved is None:
                continue
            have = {offset: length for _, offset, length in rec.parts}
            claims = {offset: r.size for offset, r in saved.items()}
            if not rec.compress or claims != have:
                why = ("this job does not compress it" if not rec.compress else
                       f"they are of parts (offset: size) {claims}, this job's layout has {have}")
                log.warning("worker %d: key %r: its compression residuals from checkpoint %s dropped (they start "
                            "at zero): %s", self._rank, rec.key, self._from, why)
                continue
            for offset, residual in saved.items():
                residuals.load((rec.skey, offset), 0, residual)


def _compressor_params(params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The compressor parameters of saved compression ``params`` (without both_ways / min_size), or None if bad."""
    try:
        return create({k: v for k, v in params.items() if k not in ("both_ways", "min_size")}).params
    except KVStoreError:
        return None
