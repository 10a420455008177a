"""Collectives: every worker meets at the scheduler, rank 0 acts, every worker meets — and learns the outcome.

The distributed store's ``set_optimizer``, ``load_optimizer_states``, ``save_checkpoint``,
``broadcast`` (of existing keys), ``init`` and the store's creation are one pattern
(MXNet's: rank 0 sends a command between two barriers). Every worker calls the method
at the same point, then:

1. it waits for its own outstanding operations;
2. every worker meets (``init``: carrying its keys' shapes and dtypes, which must agree);
3. rank 0 sends the request to every server and waits until all of them answered;
4. every worker meets again, rank 0 carrying its outcome (and result: a checkpoint's
   directory) — so nobody uses the servers before the change is made, and if it failed
   every worker raises.

Every meeting names its collective and is counted: workers in different collectives
(rank 0 in ``save_checkpoint``, rank 1 in ``barrier``) get
:class:`~pskv.errors.CollectiveMismatchError` on every side at once, never a silent
pairing. A worker that fails at any step still goes to the meeting, carrying its error:
it raises its own error, and every other worker :class:`~pskv.errors.CollectiveFailedError`
naming it. Each wait is bounded by ``PSKV_REQUEST_TIMEOUT``; the scheduler answers first,
naming who did not arrive.

``save_optimizer_states`` is the one state operation rank 0 may call alone
(:meth:`ServerCollectives.alone`): rank 0 waits for its own operations, writes every
server's state to its files (:mod:`pskv.kvstore.state_files`), and posts the outcome at the
scheduler without meeting anyone; a worker of
another rank that calls it too waits for its own operations, then for rank 0's outcome
of its same-numbered call (and raises if it failed).

A server checkpoint (the directory layout is :mod:`pskv.checkpoints`'s) is written in
step 3: each server writes its file, then rank 0 writes the manifest, which makes the
directory a checkpoint. Before it, one more meeting gives every worker rank 0's directory,
and each worker that compresses its pushes writes its residuals there
(:meth:`pskv.worker.compressing.PushCompression.save`), which the manifest then lists.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from pskv.checkpoints import next_server_checkpoint, read_manifest, worker_file, write_manifest
from pskv.config import ClusterConfig
from pskv.errors import CheckpointError, InvalidArgumentError, InvalidTypeError
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

    def meet(self, name: str, failure: BaseException | None = None, *, result: str = "",
             agree: Sequence[tuple[str, str]] = (), mode: str = "", timeout: float | None = None) -> str:
        """One meeting of the collective ``name`` (``mode``: rank 0's posted outcome instead); rank 0's result.

        ``failure`` (this worker's error in the collective, or None) reaches every worker
        first; then it is raised here.

        Raises:
            BaseException: ``failure``.
            CollectiveFailedError: the collective failed on another worker.
            CollectiveMismatchError: the workers are in different collectives.
            InitMismatchError: the workers' ``agree`` items differ.
            NodeFailedError: a worker died. OperationTimeoutError: a worker did not come.
        """
        limit = self._cluster.request_timeout if timeout is None else timeout
        try:
            out = self._worker.control.barrier(limit, name, failure, result, agree, mode)
        except Exception:
            if failure is None:
                raise
            out = ""  # this worker's own error is the one to raise
        if failure is not None:
            raise failure
        return out

    def run(self, name: str, send: Callable[[], str | None], settle: Callable[[], None] | None = None, *,
            before: bool = True, agree: Sequence[tuple[str, str]] = (), root: int = 0) -> str:
        """Settle (default: every operation of this worker), meet, ``send`` on rank ``root``, meet; rank 0's result.

        ``before=False`` skips the first meeting (nothing on the servers must settle
        first). ``agree``: what the first meeting checks is alike on every worker.
        ``root``: the worker that sends (``broadcast(root_rank=)``; its result is not returned).

        Raises:
            CollectiveFailedError: it failed on another worker (that worker raises its own error).
            CollectiveMismatchError, InitMismatchError, NodeFailedError, OperationTimeoutError: see :meth:`meet`.
        """
        failure = self._settle(settle)
        if before:
            self.meet(name, failure, agree=agree)
        result = None
        if self._rank == root and failure is None:
            try:
                result = send()
            except Exception as exc:  # noqa: BLE001 - told to every worker, then raised
                failure = exc
        return self.meet(name, failure, result=result or "")

    def alone(self, name: str, send: Callable[[], None]) -> None:
        """A call rank 0 may make alone: rank 0 settles, sends and posts the outcome; others read it.

        Raises:
            CollectiveFailedError: on a rank other than 0, rank 0's call failed.
            NodeFailedError, OperationTimeoutError: rank 0 died or never made the call.
        """
        failure = self._settle(None)
        if self._rank == 0:
            if failure is None:
                try:
                    send()
                except Exception as exc:  # noqa: BLE001 - posted for the workers that read it, then raised
                    failure = exc
            self.meet(name, failure, mode="post")
        else:
            self.meet(name, failure, mode="read")

    def _settle(self, settle: Callable[[], None] | None) -> BaseException | None:
        """Wait for this worker's operations (or run ``settle``); the error it raised, if any."""
        try:
            if settle is None:
                self._engine.wait_all(None, self._cluster.request_timeout)
            else:
                settle()
        except Exception as exc:  # noqa: BLE001 - carried to the meeting
            return exc
        return None

    def set_optimizer(self, optimizer: Optimizer, recovery: bool) -> None:
        """Install ``optimizer`` (sent as its config) on every server; a replacement worker keeps theirs.

        Raises:
            InvalidTypeError: ``optimizer`` is not a :class:`pskv.optimizer.Optimizer`.
        """
        if not isinstance(optimizer, Optimizer):
            raise InvalidTypeError(f"set_optimizer needs a pskv.optimizer.Optimizer, got {type(optimizer).__qualname__}")
        self._worker.client.pacing.off()  # the servers answer a key's pieces only once they have them all
        if recovery:  # the servers run the job's optimizer already (with its state)
            return
        self.run("set_optimizer", lambda: self._worker.control.set_optimizer(optimizer.to_config()))

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
        if path is None and not self._cluster.checkpoint_dir:
            raise InvalidArgumentError("save_checkpoint() needs a path or PSKV_CHECKPOINT_DIR "
                                       "(pskv launch --checkpoint-dir)")
        # every worker settles, then learns rank 0's directory (made by rank 0) and writes its residuals there
        failure = self._settle(None)
        chosen = ""
        if self._rank == 0 and failure is None:
            try:
                chosen = self._make_directory(path)
            except Exception as exc:  # noqa: BLE001 - told to every worker, then raised
                failure = exc
        directory = self.meet("save_checkpoint", failure, result=chosen)

        def residuals() -> None:  # a failure is carried to the next meeting
            self._worker.compression.save(directory, self._cluster.num_workers)
        self.run("save_checkpoint", lambda: self._write_checkpoint(directory, meta_json, store, num_servers),
                 settle=residuals)
        self._worker.checkpoint_saved()  # a replacement server will load this checkpoint
        return directory

    def _make_directory(self, path: str | None) -> str:
        """Rank 0: the checkpoint directory (``path``, or the next under ``PSKV_CHECKPOINT_DIR``), created."""
        directory = os.path.abspath(path if path is not None else next_server_checkpoint(self._cluster.checkpoint_dir))
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(f"save_checkpoint: cannot create the directory {directory}: {exc.strerror}") from None
        return directory

    def _write_checkpoint(self, directory: str, meta: Any, store: str, num_servers: int) -> str:
        """Rank 0: every server writes its file into ``directory``, then the manifest makes it a checkpoint
        (listing the workers' residual files, which they wrote before); the directory."""
        workers = self._cluster.num_workers
        residuals = None
        if self._worker.compression.on:
            files = [worker_file(directory, r) for r in range(workers)]
            missing = [r for r, f in enumerate(files) if not f.is_file()]
            if missing:
                raise CheckpointError(f"save_checkpoint: worker(s) {missing} wrote no compression residuals into "
                                      f"{directory} (do all workers call set_gradient_compression alike?)")
            residuals = {"files": [f.name for f in files], "compression": self._worker.compression.params}
        bodies = self._worker.control.save_checkpoint(directory)
        write_manifest(directory, {
            "store": store, "num_servers": num_servers, "num_workers": workers,
            "files": [b.get("file") for b in bodies], "bytes": sum(int(b.get("bytes", 0)) for b in bodies),
            "open_rounds": sum(int(b.get("open_rounds", 0)) for b in bodies), "meta": meta,
            **({"residuals": residuals} if residuals is not None else {}),
        })
        return directory

    def resumed(self) -> dict[str, Any] | None:
        """The manifest of ``PSKV_RESUME_FROM`` with its ``"path"``, or None."""
        if not self._cluster.resume_from:
            return None
        return {**read_manifest(self._cluster.resume_from), "path": self._cluster.resume_from}
