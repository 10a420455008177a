"""Collectives that change the servers' state: every worker meets, rank 0 acts, every worker meets.

The distributed store's ``set_optimizer``, ``save_optimizer_states``,
``load_optimizer_states`` and ``save_checkpoint`` are one pattern (MXNet's: rank 0 sends
a command between two barriers). Every worker calls the method at the same point, then:

1. it waits for its own outstanding operations;
2. every worker meets at a barrier — so every worker's earlier pushes reached the servers;
3. rank 0 sends the request to every server and waits until all of them answered;
4. every worker meets again — so nobody uses the servers before the change is made.

Each wait is bounded by ``PSKV_REQUEST_TIMEOUT``. A server checkpoint (the directory
layout is :mod:`pskv.checkpoints`'s) is written in step 3: each server writes its file,
then rank 0 writes the manifest, which makes the directory a checkpoint.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from pskv.checkpoints import next_server_checkpoint, read_manifest, write_manifest
from pskv.config import ClusterConfig
from pskv.errors import InvalidArgumentError, InvalidTypeError
from pskv.kvstore.engine import Engine
from pskv.optimizer import Optimizer
from pskv.worker import KVWorker

__all__ = ["ServerCollectives"]


class ServerCollectives:
    """One worker's side of the collectives on the servers' state.

    Args:
        worker: the store's connection to the servers.
        cluster: the cluster contract (request timeout, checkpoint directories).
        rank: this worker's rank.
        engine: the store's engine, whose operations step 1 waits for.

    It holds no reference to the store: a cycle would keep a closed store's key
    layouts (and their shared-memory mappings) alive until the garbage collector runs.
    """

    def __init__(self, worker: KVWorker, cluster: ClusterConfig, rank: int, engine: Engine) -> None:
        self._worker = worker
        self._cluster = cluster
        self._rank = rank
        self._engine = engine

    def run(self, send: Callable[[], Any], settle: Callable[[], None] | None = None) -> None:
        """Settle (``settle``: other than this worker's every operation), meet, ``send`` on rank 0, meet.

        Raises:
            NodeFailedError: a worker or server died.
            RemoteError: a server refused rank 0's request (raised on rank 0).
        """
        if settle is None:
            self._engine.wait_all(None, self._cluster.request_timeout)
        else:
            settle()
        self._worker.barrier(self._cluster.request_timeout)
        if self._rank == 0:
            send()
        self._worker.barrier(self._cluster.request_timeout)

    def set_optimizer(self, optimizer: Optimizer, recovery: bool) -> None:
        """Install ``optimizer`` (sent as its config) on every server; a replacement worker keeps theirs.

        Raises:
            InvalidTypeError: ``optimizer`` is not a :class:`pskv.optimizer.Optimizer`.
        """
        if not isinstance(optimizer, Optimizer):
            raise InvalidTypeError(f"set_optimizer needs a pskv.optimizer.Optimizer, got {type(optimizer).__qualname__}")
        if recovery:  # the servers run the job's optimizer already (with its state)
            return
        self.run(lambda: self._worker.set_optimizer(optimizer.to_config()))

    def save_checkpoint(self, path: str | None, meta: Any, store: str, num_servers: int) -> str:
        """Have every server write its shard into ``path``, then rank 0 the manifest; the directory.

        Raises:
            InvalidArgumentError: no ``path`` and no ``PSKV_CHECKPOINT_DIR``, or ``meta``
                is not JSON-serialisable.
        """
        try:
            meta_json = json.loads(json.dumps(meta))
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"save_checkpoint: meta must be JSON-serialisable: {exc}") from None
        if path is None:
            if not self._cluster.checkpoint_dir:
                raise InvalidArgumentError("save_checkpoint() needs a path or PSKV_CHECKPOINT_DIR "
                                           "(pskv launch --checkpoint-dir)")
            path = str(next_server_checkpoint(self._cluster.checkpoint_dir))
        directory = os.path.abspath(path)
        self.run(lambda: self._write_checkpoint(directory, meta_json, store, num_servers))
        self._worker.checkpoint_saved()  # a replacement server will load this checkpoint
        return directory

    def _write_checkpoint(self, directory: str, meta: Any, store: str, num_servers: int) -> None:
        """Rank 0: every server writes its file into ``directory``, then the manifest makes it a checkpoint."""
        os.makedirs(directory, exist_ok=True)
        bodies = self._worker.save_checkpoint(directory)
        write_manifest(directory, {
            "store": store, "num_servers": num_servers, "num_workers": self._cluster.num_workers,
            "files": [b.get("file") for b in bodies], "bytes": sum(int(b.get("bytes", 0)) for b in bodies),
            "open_rounds": sum(int(b.get("open_rounds", 0)) for b in bodies), "meta": meta,
        })

    def resumed(self) -> dict[str, Any] | None:
        """The manifest of ``PSKV_RESUME_FROM`` with its ``"path"``, or None."""
        if not self._cluster.resume_from:
            return None
        return {**read_manifest(self._cluster.resume_from), "path": self._cluster.resume_from}
