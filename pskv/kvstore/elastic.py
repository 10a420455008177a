"""An elastic job's store calls: ``kv.commit()``, ``kv.restore()``, ``kv.view`` (issue 24).

In an elastic job (``pskv launch -n MIN:MAX``) workers join and leave a running job. Exactly-once
counting of every gradient rests on **commits**, cuts every worker and server agreed on:

``commit()``
    1. every operation of this worker finishes (its pushes reached the servers, its pulls were answered);
    2. every member meets (:data:`~pskv.worker.elastic.COMMIT_MEETING`): no member has a push the others lack;
    3. rank 0 has every server snapshot its shard as commit ``n`` (``COMMIT``; a server with an open round,
       a queued push or a parked pull refuses: the workers pushed different steps);
    4. every member meets again (:data:`~pskv.worker.elastic.COMMITTED_MEETING`), carrying rank 0's outcome.
       Only a successful release makes commit ``n``: on every member at once. It may carry a new view (the
       joiners the scheduler admitted, the members drained), adopted here and returned.

``restore()``
    after :class:`~pskv.errors.MembershipChangedError` (a member departed: every server rolled back to the
    last commit, and failed or refused the work since): adopts the newer view once the scheduler told of
    it, after this worker's voided operations ended. The program then puts its own state back to its
    last commit and redoes the steps since.

Adopting a view (:class:`~pskv.worker.elastic.WorkerView`) is the only place ``kv.rank`` and
``kv.num_workers`` change; the push numbering restarts at 0 (every server restarted its push logs at
the view). A worker that joined a running job registers the keys it initialises without a meeting
until its first commit (the servers hold them, checked against their ``KEYS`` table; a pull reads
their current values), and keeps the servers' optimizer, as a replacement process does.

Every other job has a :class:`FixedJob`: ``commit`` and ``restore`` raise NotSupportedError, ``view``
is None, and nothing of this runs on any other call.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Protocol

from pskv.config import ClusterConfig
from pskv.errors import InitMismatchError, NotSupportedError, OperationTimeoutError
from pskv.kvstore.engine import Engine
from pskv.worker import KeyLayout, KVWorker
from pskv.worker.elastic import COMMIT_MEETING, COMMITTED_MEETING, View

log = logging.getLogger("pskv.worker")

__all__ = ["ElasticJob", "FixedJob", "Placed", "View", "WorkerDrained", "elastic_job"]


class WorkerDrained(SystemExit):
    """Raised by ``kv.commit()`` on a worker the launcher drained (its host left the job's hosts): the
    commit is done, the store has left the job, and the process ends with exit code 0 unless the
    program catches it (a drained worker is not a failure; the others go on without it)."""

    def __init__(self, slot: int, commit: int) -> None:
        super().__init__(0)
        self.slot = slot
        self.commit = commit

    def __str__(self) -> str:
        return f"worker slot {self.slot} was drained at commit {self.commit}"


class Placed(Protocol):
    """What a view change updates on the store (:class:`~pskv.kvstore.dist_job.DistJob`)."""

    @property
    def rank(self) -> int: ...

    def _placed(self, rank: int, num_workers: int) -> None: ...

    def _meet(self, name: str, failure: BaseException | None) -> None: ...

    def _leave(self, wait: bool, timeout: float) -> None: ...


class FixedJob:
    """A job that is not elastic: no views, no commits."""

    joining = False

    def held(self, layouts: Sequence[KeyLayout]) -> None:
        """Nothing to check: every worker's ``init`` meets."""

    @property
    def view(self) -> View | None:
        return None

    def commit(self, store: Placed, layouts: Iterable[KeyLayout]) -> View | None:
        raise NotSupportedError("kv.commit(): this job is not elastic (pskv launch -n MIN:MAX)")

    def restore(self, store: Placed, layouts: Iterable[KeyLayout]) -> View:
        raise NotSupportedError("kv.restore(): this job is not elastic (pskv launch -n MIN:MAX)")


class ElasticJob(FixedJob):
    """One dist store's commits and restores in an elastic job.

    Args:
        worker: the store's worker layer (its view: ``worker.client.views``).
        cluster: the cluster contract (the request timeout bounds each wait).
        engine: the store's engine, whose operations a commit and a restore wait for.
    """

    def __init__(self, worker: KVWorker, cluster: ClusterConfig, engine: Engine) -> None:
        self._worker = worker
        self._views = worker.client.views
        self._timeout = cluster.request_timeout
        self._engine = engine
        self.joining = self._views.joiner  # a joiner's inits register keys the servers hold, till its first commit
        self._table: dict[tuple[int, int], tuple[str, int]] | None = None  # the servers' parts (a joiner's)

    @property
    def view(self) -> View | None:
        """The membership view this worker works in (its rank: ``view.rank_of(slot)``)."""
        return self._views.view

    def held(self, layouts: Sequence[KeyLayout]) -> None:
        """A joiner's ``init`` of ``layouts`` registers keys the servers hold: each part must be there alike.

        Raises:
            InitMismatchError: a part is not on its server, or of another dtype or size (nothing is registered).
        """
        if not self.joining:
            return
        if self._table is None:
            self._table = self._views.key_table(self._timeout)
        for rec in layouts:
            for _, offset, size in rec.parts:
                held = self._table.get((rec.skey, offset))
                if held is None or held[0] != rec.meta.dtype or (held[1] != size and not rec.sparse):
                    found = "no such key" if held is None else f"a {held[0]} part of {held[1]} at offset {offset}"
                    raise InitMismatchError(
                        f"init of key {rec.key!r} ({rec.meta.dtype}, shape {tuple(rec.meta.shape)}): this worker joined "
                        f"a running job, whose servers hold {found}; a joiner's init registers the job's keys as "
                        "every worker made them (a new key is made by all the workers after a commit)")

    def commit(self, store: Placed, layouts: Iterable[KeyLayout]) -> View | None:
        """:meth:`DistJob.commit` (see the module docstring); the new view the commit's release made, if any."""
        failure: BaseException | None = None
        try:
            self._engine.wait_all(None, self._timeout)
        except Exception as exc:  # noqa: BLE001 - carried to the meeting: every member fails alike
            failure = exc
        store._meet(COMMIT_MEETING, failure)
        n = self._views.commit + 1
        if store.rank == 0:
            try:
                self._views.send_commit(n, self._timeout)
            except Exception as exc:  # noqa: BLE001 - carried to the release: no member counts the commit
                failure = exc
        store._meet(COMMITTED_MEETING, failure)
        self.joining = False
        view = self._views.committed(n)
        if view is not None and self._views.slot not in view.members:  # drained: this worker's part is done
            log.info("worker slot %d: drained at commit %d (%s); leaving the job", self._views.slot, n, view.cause)
            store._leave(False, self._timeout)
            raise WorkerDrained(self._views.slot, n)
        self._worker.compression.committed()
        if view is not None:
            self._adopt(store, view, layouts)
        return view

    def restore(self, store: Placed, layouts: Iterable[KeyLayout]) -> View:
        """:meth:`DistJob.restore` (see the module docstring); the view adopted."""
        view = self._views.newer(self._timeout)
        if not self._engine.settle(self._timeout):  # the voided operations fail at once (their servers rolled back)
            raise OperationTimeoutError(f"restore: this worker's operations did not end within {self._timeout:g} s")
        try:
            self._engine.wait_all(None, 0)  # their errors were the change's: not reported again by a later call
        except Exception:  # noqa: BLE001 - MembershipChangedError, or what a rolled-back server answered
            pass
        self._worker.compression.restored()
        self._adopt(store, view, layouts)
        return view

    def _adopt(self, store: Placed, view: View, layouts: Iterable[KeyLayout]) -> None:
        self._views.adopt(view, layouts)
        store._placed(self._views.rank, self._views.num_workers)


def elastic_job(worker: KVWorker, cluster: ClusterConfig, engine: Engine) -> FixedJob:
    """The store's elastic-job calls: :class:`ElasticJob` in an elastic job, else the refusing :class:`FixedJob`."""
    return ElasticJob(worker, cluster, engine) if cluster.elastic else FixedJob()
