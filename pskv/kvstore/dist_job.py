"""The job-level calls of a distributed store: replacement, the servers' state, the cluster.

:class:`~pskv.kvstore.dist.DistStore` is the MXNet API of the distributed stores. Its key
calls (``init``, ``push``, ``pull``, ``pushpull``, ``broadcast``, ``row_sparse_pull``) live
in :mod:`pskv.kvstore.dist`; the calls that concern the job rather than keys live in its base
class here, :class:`DistJob`:

- the worker's place: ``rank``, ``local_rank``, ``num_workers``;
- replacement: :attr:`~DistJob.is_recovery`, :meth:`~DistJob.push_count`, :meth:`~DistJob.resume_step`
  (the push numbering is :mod:`~pskv.kvstore.resume`'s);
- the servers' state, as collectives (:mod:`~pskv.kvstore.collectives`): ``set_optimizer``,
  ``save_optimizer_states`` / ``load_optimizer_states`` (their files: :mod:`~pskv.kvstore.state_files`),
  ``save_checkpoint`` / ``resumed``, ``send_command_to_servers``;
- the cluster: ``barrier``, ``join``, ``num_dead_node``, ``metrics``, ``close``;
- an elastic job's ``commit``, ``restore`` and ``view`` (:mod:`~pskv.kvstore.elastic`).

Each is a line or two of wiring to the module that owns it; the docstrings are the API's.
"""

from __future__ import annotations

import logging
from typing import Any

from pskv.config import ClusterConfig
from pskv.errors import InvalidArgumentError, InvalidTypeError, NodeFailedError, NotSupportedError
from pskv.kvstore.collectives import ServerCollectives
from pskv.kvstore.elastic import FixedJob, View
from pskv.kvstore.exit import left
from pskv.kvstore.frontend import StoreFrontEnd
from pskv.kvstore.keys import Key
from pskv.kvstore.resume import PushNumbers
from pskv.kvstore.state_files import load_states, save_states
from pskv.metrics import JobMetrics, snapshot
from pskv.optimizer import Optimizer
from pskv.worker import KeyLayout, KVWorker

__all__ = ["DistJob"]

log = logging.getLogger("pskv.dist")

SETTLE_BEFORE_BARRIER = 10.0  # seconds barrier() waits for this worker's own operations (pskv.server.steps)


class DistJob(StoreFrontEnd[KeyLayout]):
    """The job-level calls of :class:`~pskv.kvstore.dist.DistStore` (its base class; it sets the state below)."""

    _cluster: ClusterConfig
    _worker: KVWorker
    _servers: ServerCollectives
    _pushes: PushNumbers
    _keys: dict[Key, KeyLayout]
    _recovery: bool
    _num_servers: int
    _rank: int
    _num_workers: int
    _elastic: FixedJob

    # -- the job ----------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This worker's rank."""
        return self._rank

    @property
    def local_rank(self) -> int:
        """This worker's rank among the workers of its host: ``PSKV_LOCAL_RANK`` (set by ``pskv launch``)
        or ``BYTEPS_LOCAL_RANK``; unset, the cluster manager's local rank when its rank comes from one
        (``DMLC_WORKER_ID`` unset: torchrun, SLURM, MPI), else its rank in a job on one host, else 0
        (docs/env.md)."""
        return self._cluster.local_rank_of(self._rank)

    @property
    def num_workers(self) -> int:
        """Number of workers in the job."""
        return self._num_workers

    @property
    def is_recovery(self) -> bool:
        """True in a process that replaced a dead worker of a running job (``PSKV_RECOVERY_TIMEOUT``).

        Such a process skips the collective steps the others did long ago: ``init``
        registers the keys without sending values or meeting at a barrier (pulls return
        the servers' current values), ``set_optimizer`` keeps the servers' optimizer, and
        ``broadcast`` of existing keys pulls them. Its pushes join the current rounds. Explicit
        ``barrier()`` calls are not skipped: guard them with ``if not kv.is_recovery``.

        Where to go on: the servers told it how many pushes of its rank reached them
        (:meth:`push_count`, :meth:`resume_step`); a push number that arrived already is
        never applied again, so re-pushing a step that had landed changes nothing. Its
        pushes of a key its rank had pushed are refused until :meth:`resume_step` answered for it.
        """
        return self._recovery

    def push_count(self, key: Any) -> int:
        """How many pushes (and pushpulls) of ``key`` this worker rank has made; in a replacement
        process, on from those of its predecessors that reached the servers (:mod:`~pskv.kvstore.resume`).

        Raises:
            UnknownKeyError: ``key`` was not initialised.
            InvalidArgumentError: ``key`` is a list.
        """
        keys, single = self._key_list(key)
        if not single:
            raise InvalidArgumentError(f"push_count takes one key, not {key!r}")
        return self._pushes.count(self._record(keys[0], "push_count"))

    def resume_step(self, keys: Any = None) -> int:
        """The step to go on from, for a training loop that pushes each of ``keys`` once per step.

        The fewest pushes of any of ``keys`` (default: every key initialised so far); in a
        replacement process, of those that reached the servers from the processes it
        replaced, and each key's push numbering is set back to that step
        (:mod:`~pskv.kvstore.resume`). 0 before any push. Until it answered for a key its
        rank had pushed, a replacement's ``push`` / ``pushpull`` of the key raises
        InvalidArgumentError naming it: the step its program had in mind could be summed
        into a later round.

        Raises:
            UnknownKeyError: a key was not initialised.
            InvalidArgumentError: a replacement process pushed one of ``keys`` already
                (call it before the first push).
        """
        names = list(self._keys) if keys is None else self._key_list(keys)[0]
        return self._pushes.resume_step([self._record(k, "resume_step") for k in names])

    # -- the servers' state: collectives (pskv.kvstore.collectives) ------------------------
    def set_optimizer(self, optimizer: Optimizer) -> None:
        """Install ``optimizer`` on every server (its config, never pickled). Collective.

        Calling it again updates the hyperparameters and keeps the optimizer state; a
        replacement worker (:attr:`is_recovery`) keeps the servers' optimizer.

        Raises:
            InvalidTypeError: ``optimizer`` is not a :class:`pskv.optimizer.Optimizer`.
            RemoteError: a server refused it (on rank 0).
            CollectiveFailedError: it failed on rank 0 (on every other rank, at once).
            CollectiveMismatchError: the workers are in different collectives.
        """
        self._check_open("set_optimizer")
        self._servers.set_optimizer(optimizer, self._recovery or self._elastic.joining)  # a joiner keeps theirs too

    def set_updater(self, updater: Any) -> None:
        """Not available: code never travels to the servers. Use :meth:`set_optimizer`."""
        raise NotSupportedError("a distributed store cannot ship a Python function to its servers; use "
                                "set_optimizer with a pskv.optimizer optimizer")

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Write every server's shard of the optimizer state to ``<fname>.server<rank>``, from rank 0.

        The servers send their state; rank 0 writes the files (:mod:`~pskv.kvstore.state_files`),
        on its own host, where ``fname`` says (relative: to its working directory) — no server
        writes a path a worker names. Each file is in the local store's format.

        Rank 0 may call it alone (``if kv.rank == 0: kv.save_optimizer_states(f)``): it
        waits for its own operations, writes the files and returns; the other workers go on.
        Every worker may call it too: the others wait for their own operations and for rank
        0's outcome of the same call. A worker of another rank calling it while rank 0 does not fails.

        Raises:
            OptimizerStateError: a file could not be written (on rank 0; its folder must exist).
            RemoteError: a server has no optimizer, or its state exceeds ``PSKV_MAX_MESSAGE_BYTES`` (on rank 0).
            CollectiveFailedError: rank 0's call failed (on the other ranks that called it).
            CollectiveMismatchError: rank 0 went on to a collective without making this call.
        """
        self._check_open("save_optimizer_states")
        self._servers.alone("save_optimizer_states", lambda: save_states(self._worker, fname, bool(dump_optimizer)))

    def load_optimizer_states(self, fname: str) -> None:
        """Restore every server's optimizer state from ``<fname>.server<rank>`` (:meth:`save_optimizer_states`'
        files), which rank 0 reads and sends to the servers. Collective.

        Raises:
            OptimizerStateError: a file is missing or not a pskv state file (on rank 0, naming it).
            RemoteError: a server's state does not fit its shard (keys, shapes; on rank 0).
            CollectiveFailedError: it failed on rank 0 (on every other rank, at once).
            CollectiveMismatchError: the workers are in different collectives.
        """
        self._check_open("load_optimizer_states")
        self._worker.client.pacing.off()  # the servers run an optimizer (pskv.worker.pacing)
        self._servers.run("load_optimizer_states", lambda: load_states(
            self._worker, fname, self._num_servers, self._cluster.max_message_bytes))

    def save_checkpoint(self, path: str | None = None, meta: Any = None) -> str:
        """Save every server's shard — values, rounds, optimizer state and config — as a checkpoint.

        With gradient compression, every worker's residuals too (``worker-<rank>.safetensors``)
        and the servers' ``both_ways`` reply residuals: a resumed job restores them.

        Collective: every worker calls it at the same point (e.g. every N steps). The
        files are written atomically on the servers' hosts (use a shared file system
        across hosts). A job started with ``PSKV_RESUME_FROM`` set to the directory (``pskv
        launch --max-restarts`` does it after a failure) continues from it: see :attr:`resumed`.

        Args:
            path: the checkpoint directory; default ``<PSKV_CHECKPOINT_DIR>/ckpt-<n>``
                with ``n`` one more than the highest existing one.
            meta: any JSON-serialisable value (e.g. the step), returned by :attr:`resumed`
                after a restart.

        Returns:
            The checkpoint directory (rank 0's, on every worker).

        Raises:
            InvalidArgumentError: no ``path`` and no ``PSKV_CHECKPOINT_DIR``, or ``meta``
                is not JSON-serialisable.
            RemoteError: a server could not write its file (CheckpointError there; on rank 0).
            CheckpointError: rank 0 could not create the directory.
            CollectiveFailedError: it failed on rank 0 (on every other rank, at once).
            CollectiveMismatchError: the workers are in different collectives.
        """
        self._check_open("save_checkpoint")
        return self._servers.save_checkpoint(path, meta, self._type, self._num_servers)

    @property
    def resumed(self) -> dict[str, Any] | None:
        """The manifest of the checkpoint this job resumed from (``PSKV_RESUME_FROM``), or None.

        Its ``"meta"`` is what :meth:`save_checkpoint` was given, ``"path"`` the directory.
        The keys it holds keep their saved values (and optimizer state) when the workers
        ``init`` them again.
        """
        return self._servers.resumed()

    def send_command_to_servers(self, head: int, body: str) -> None:
        """Run the controller registered for ``head`` on every server; returns when all answered.

        Controllers are registered on the servers (``@pskv.server.controller`` in a module
        named by ``PSKV_SERVER_MODULES``); only ``head`` and ``body`` travel.

        Raises:
            InvalidTypeError: ``head`` is not an int or ``body`` not a str.
            RemoteError: a server has no controller for ``head``, or it raised.
        """
        self._check_open("send_command_to_servers")
        if isinstance(head, bool) or not isinstance(head, int) or not isinstance(body, str):
            raise InvalidTypeError("send_command_to_servers needs an int head and a str body")
        self._worker.control.controller(head, body)

    # -- cluster ------------------------------------------------------------------------
    def barrier(self) -> None:
        """Wait until every worker reached the barrier (a collective named ``"barrier"``).

        This worker's own operations are waited for first, for up to
        :data:`SETTLE_BEFORE_BARRIER` seconds (their errors stay for their handles), so the
        servers can tell that a sync round this worker never pushed was pushed by another
        worker before the barrier: mismatched step counts then fail on every worker at once.

        Raises:
            NodeFailedError: a worker died (named).
            CollectiveMismatchError: another worker is in another collective (both named), or in a
                sync round this worker never pushed (mismatched step counts: names the worker ahead).
            OperationTimeoutError: a worker did not come within ``PSKV_REQUEST_TIMEOUT`` (named).
        """
        self._check_open("barrier")
        # this worker's operations first (a while): then the servers tell a missing push from a late one;
        # still pending (waiting for pushes the others make after the barrier?): its mark accuses nobody
        settled = self._engine.settle(min(SETTLE_BEFORE_BARRIER, self._cluster.request_timeout))
        self._worker.control.barrier(self._cluster.request_timeout, "barrier", settled=settled)

    def join(self, timeout: float | None = None) -> None:
        """This worker has no more data: rounds go on without it until every worker joined.

        Collective (:meth:`KVStoreBase.join`): finishes this worker's operations, tells
        every server, then waits at a barrier for the other workers; when it returns,
        every server has seen every worker's join. ``timeout`` bounds each wait, the
        slowest worker's included (default ``PSKV_REQUEST_TIMEOUT``).

        Raises:
            NodeFailedError: a worker or server died.
            OperationTimeoutError: a server did not answer within the timeout.
        """
        self._check_open("join")
        limit = self._timeout(timeout)
        failure = None
        try:
            self.wait(timeout=limit)
            self._worker.control.join(limit)
        except Exception as exc:  # noqa: BLE001 - every worker learns it at the meeting
            failure = exc
        self._servers.meet("join", failure, timeout=limit)

    def num_dead_node(self, node_id: int, timeout: float = 60) -> int:
        """Nodes of group ``node_id`` (1 scheduler, 2 servers, 4 workers, sums) silent for > ``timeout`` s."""
        super().num_dead_node(node_id, timeout)  # validates
        return self._worker.control.num_dead_node(node_id, timeout)

    def metrics(self, timeout: float = 5.0) -> JobMetrics:
        """The job's metrics now, every node's (:func:`pskv.metrics.snapshot` of this job's scheduler):
        per node its state, ops, rounds and bytes per second, queue and stalls, as ``pskv top`` shows.

        Raises:
            OperationTimeoutError: the scheduler did not answer within ``timeout`` seconds.
        """
        return snapshot(self._cluster.scheduler_address, timeout, self._cluster.curve_key_file)

    def close(self) -> None:
        """Finish queued work and leave the job; then wait until every worker has left (unless disabled).

        The scheduler learns of the departure at once: a meeting (``barrier``, a
        collective) that needs this worker fails on the others, and so does a sync round
        this worker never pushed (both naming it), instead of waiting for it. The wait
        that follows is the exit barrier (``set_barrier_before_exit``): it ends when every
        other worker has left too, or died. A process that exits without ``close()``
        leaves the same way, without that wait.

        Raises:
            OperationTimeoutError: the others did not leave within ``PSKV_REQUEST_TIMEOUT``.
        """
        self._leave(self._barrier_before_exit, self._cluster.request_timeout)

    def _leave(self, wait: bool, timeout: float) -> None:
        if self._closed:
            return
        self._closed = True
        left(self)
        try:
            self._engine.close(timeout)
            try:
                self._worker.control.shutdown(timeout, wait=wait)
            except NodeFailedError as exc:  # the job is failing anyway: still release everything
                log.error("worker %d: could not report shutdown: %s", self._rank, exc)
        finally:
            self._kernels.close()
            self._worker.close(self._keys.values())

    # -- an elastic job (pskv.kvstore.elastic) --------------------------------------------
    @property
    def view(self) -> View | None:
        """An elastic job's membership view this worker works in (``kv.rank`` is its rank in it); else None."""
        return self._elastic.view

    def commit(self) -> View | None:
        """An elastic job's commit: every worker and server agrees on this cut (:mod:`~pskv.kvstore.elastic`).

        Collective. Every operation of this worker finishes first. Returns the new view the commit made
        (workers admitted or drained; ``kv.rank`` and ``kv.num_workers`` are its now), or None.

        Raises:
            MembershipChangedError: a worker departed: call :meth:`restore`, put the program's state back
                to its last commit, and redo the steps since.
            NotSupportedError: the job is not elastic (``pskv launch -n MIN:MAX``).
            CollectiveFailedError, CollectiveMismatchError, NodeFailedError, OperationTimeoutError: as collectives.
        """
        self._check_open("commit")
        return self._elastic.commit(self, self._keys.values())

    def restore(self) -> View:
        """After :class:`~pskv.errors.MembershipChangedError`: adopt the view the departure made (the servers
        went back to the last commit, and so must the program's state); returns it.

        Raises:
            NotSupportedError: the job is not elastic.
            OperationTimeoutError: no newer view, or this worker's operations did not end, within the request timeout.
        """
        self._check_open("restore")
        return self._elastic.restore(self, self._keys.values())

    def _placed(self, rank: int, num_workers: int) -> None:
        """A view was adopted: this worker's rank and the workers' number in it (collectives use the rank)."""
        self._rank, self._num_workers = rank, num_workers
        self._servers = ServerCollectives(self._worker, self._cluster, rank, self._engine)

    def _meet(self, name: str, failure: BaseException | None) -> None:
        self._servers.meet(name, failure)
