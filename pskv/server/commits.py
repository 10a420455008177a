"""An elastic job's commits on one server: copy-on-write snapshots of the shard, and the rollback to one. No I/O.

A commit is a cut every worker agreed on (``kv.commit()``): every member settled and met, so every part
of every key sits at a round boundary. When a member departs, every server rolls back to the last
commit and the survivors redo the steps since (design: ``docs/elastic.md``; the note of issue 24 §2.3).

**Snapshot** (:meth:`CommitSnapshots.take`, at ``COMMIT``): per part its round, a *reference* to its
value, and a row-sparse part's present rows; the updater in use, its optimizer, update counts and
per-key states (references, :meth:`~pskv.optimizer.Updater.document`); the reply-compression
residuals (copied: they are small, and written by every compressed pull).

**Copy on write** (:meth:`CommitSnapshots.before_write`): every in-place write of a value goes through
the shard observer's ``applied`` (:mod:`pskv.server.shard`), which :class:`CommitObserver` wraps: before a
key's first in-place write after a commit, its parts' values and its updater state are copied, once.
A sync round without an updater *replaces* the value array and never writes the old one again, so
the reference is enough and nothing is copied: servers that only sum copy nothing. Parts in shared
memory are copied at the snapshot (their two buffers take turns as value and merge). A part made
after the commit is recorded at its first push or write (its INIT value). A job that is not elastic
has no :class:`CommitObserver` and a :class:`NoCommits`: nothing on its hot path.

**Rollback** (:meth:`CommitSnapshots.rollback`): the values are put back (copied back into an array
written in place, so views of it stay valid; a replaced one is rebound), and the rounds, present
rows, updater, optimizer, counts, states and residuals. Every part's pushes, open round, queued
pushes and cached reply are cleared; parked pulls fail with
:class:`~pskv.errors.MembershipChangedError`; ``joined`` and the void rounds are cleared. A key made
after the commit keeps its INIT value. What lies outside the shard (``StepOrder``, the parked-pull
bounds, the ``ReplyCache``, the refused rounds) is the caller's to clear.

**Two snapshots.** A failure may come between a commit's two meetings: the snapshot taken at
``COMMIT`` n is *pending* until the view that names commit n promotes it (:meth:`CommitSnapshots.promote`);
until then a rollback goes to the previous one. Commit 0 is the state when the snapshots were made
(the store's creation).

Memory: at most one copy of each value written since the commit plus its optimizer state (≤ 2× the
shard, 3× with Adam); :meth:`CommitSnapshots.nbytes` counts it (``pskv top``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np

from pskv.errors import CollectiveMismatchError, InvalidArgumentError, MembershipChangedError, NotSupportedError
from pskv.optimizer import Updater
from pskv.optimizer.base import Optimizer, UpdateFn
from pskv.optimizer.states import KeyStates, StatesDocument
from pskv.protocol import node_name
from pskv.server.gather import Refused
from pskv.server.part import Part, PartId
from pskv.server.shard import ServerShard, ShardObserver
from pskv.server.squeeze import ReplyCompression, Squeezed
from pskv.server.void import VoidRounds

__all__ = ["CommitObserver", "CommitSnapshots", "NoCommits"]

log = logging.getLogger("pskv.server")

T = TypeVar("T")
Array = np.ndarray[Any, Any]


@dataclass
class _Held:
    """One part at the commit: its round, present rows, and the array that holds its value then."""

    round: int
    value: Array  # the part's own array until it is written in place; then a copy
    present: Array | None
    written: Array | None = None  # the part's array ``value`` was copied from (written in place since)

    @classmethod
    def of(cls, part: Part) -> _Held:
        """``part`` as it is now (a part in shared memory copied at once: its buffers take turns)."""
        held = cls(part.round, part.value, part.present)
        if part.buffers is not None:
            held.copy(part)
        return held

    def copy(self, part: Part) -> None:
        """Copy the value before ``part``'s first in-place write, if it is still the one held."""
        if self.written is None and part.value is self.value:  # else copied, or replaced: written no more
            self.value, self.written = part.value.copy(), part.value

    def put_back(self, part: Part) -> None:
        """``part``'s value, round and present rows as at the commit."""
        if self.written is not None and (part.value is self.written or part.buffers is not None):
            np.copyto(part.value, self.value)  # its own array: views of it (a cut slice's) stay valid
        elif part.value is not self.value:
            part.value, self.written = self.value, None  # rebound: the held array is the part's again
        part.round = self.round
        part.present = self.present


class _Snapshot:
    """One commit of a shard (see the module's docstring)."""

    def __init__(self, n: int, shard: ServerShard, squeezed: ReplyCompression | None) -> None:
        self.n = n
        self.parts: dict[PartId, _Held] = {pid: _Held.of(p) for pid, p in shard.parts.items()}
        self.written: set[int] = set()  # keys copied since the commit (each key once)
        self.updater: UpdateFn | None = shard.updater
        self.optimizer: Optimizer | None = None
        self.states: dict[Any, KeyStates] = {}  # key -> its updater state at the commit (refs until written)
        self.num_update = 0
        self.detached = False  # a rollback gave the updater these states to copy from: none is written in place
        if isinstance(shard.updater, Updater):
            doc = shard.updater.document()
            self.optimizer, self.num_update = shard.updater.optimizer, doc.num_update
            self.states = {ks.key: ks for ks in doc.keys}
        self.state_bytes: dict[Any, int] = {}  # key -> bytes of its state's copy
        self.squeezed: list[Squeezed] | None = None if squeezed is None else squeezed.export()

    def touch(self, part: Part) -> None:
        """Hold a part made after the commit, at its first push or write."""
        pid = (part.key, part.offset)
        if pid not in self.parts:
            self.parts[pid] = _Held.of(part)

    def before_write(self, shard: ServerShard, key: int) -> None:
        """Copy ``key``'s parts and updater state, the first time it is written since the commit."""
        self.written.add(key)
        for part in shard.pieces(key):
            held = self.parts.get((part.key, part.offset))
            if held is None:
                self.parts[(part.key, part.offset)] = held = _Held(part.round, part.value, part.present)
            held.copy(part)
        ks = self.states.get(key)
        if ks is not None and not self.detached and isinstance(shard.updater, Updater):
            arrays = tuple(a.copy() for a in ks.arrays)
            self.states[key] = replace(ks, arrays=arrays)
            self.state_bytes[key] = sum(a.nbytes for a in arrays)

    def put_back(self, shard: ServerShard) -> None:
        """The shard's values, rounds and updater as at the commit."""
        for pid, part in shard.parts.items():
            held = self.parts.get(pid)
            if held is not None:
                held.put_back(part)
        shard.updater = self.updater
        if isinstance(self.updater, Updater):
            assert self.optimizer is not None
            self.updater.optimizer = self.optimizer
            self.updater.restore(StatesDocument(self.num_update, tuple(self.states.values()), None))
            self.detached = True  # the updater copies them into fresh states at each key's next update
        elif self.updater is not None:
            log.warning("rollback to commit %d: the servers' updater is a function of the user's: its own state, "
                        "if any, is not rolled back", self.n)
        self.written.clear()

    def nbytes(self, shard: ServerShard) -> int:
        """Bytes held only by this snapshot: copies, and value arrays the parts replaced since."""
        held = 0
        for pid, h in self.parts.items():
            part = shard.parts.get(pid)
            if h.written is not None or (part is not None and part.value is not h.value):
                held += h.value.nbytes
        held += sum(self.state_bytes.values())
        return held + sum(s.residual.nbytes + s.payload.nbytes for s in self.squeezed or ())


class CommitSnapshots:
    """The commits of one shard in an elastic job: the last one (rolled back to), and one pending.

    Args:
        shard: the shard; its observer is wrapped in a :class:`CommitObserver` (copy on write).
        squeezed: the shard's reply-compression residuals (``both_ways``), snapshotted with it; None: none.
    """

    def __init__(self, shard: ServerShard, squeezed: ReplyCompression | None = None) -> None:
        self._shard = shard
        self._squeezed = squeezed
        self._committed = _Snapshot(0, shard, squeezed)
        self._pending: _Snapshot | None = None
        self._live = [self._committed]  # the snapshots a write must keep valid
        shard.observer = self.wrap(shard.observer)

    def wrap(self, inner: ShardObserver) -> ShardObserver:
        """The shard's observer ``inner``, told first to copy on write (a new observer, e.g. a traced one, is
        wrapped again: ``shard.observer = commits.wrap(new)``)."""
        return CommitObserver(inner, self)

    @property
    def commit(self) -> int:
        """The commit a rollback goes back to (0: the state when these snapshots were made)."""
        return self._committed.n

    def take(self, n: int) -> None:
        """``COMMIT`` n: snapshot the shard (pending until :meth:`promote`).

        Raises:
            CollectiveMismatchError: a part has an open round, a queued push or a parked pull: the
                workers did not all push the same steps before the commit (nothing is taken).
        """
        self._check_boundary(n)
        if self._pending is not None and self._pending.n == n - 1:
            # every worker passed commit n - 1's release before rank 0 could send COMMIT n: it holds, even
            # where no view named it yet (a departure now rolls back to it, not to the one before)
            self.promote(n - 1)
        self._pending = _Snapshot(n, self._shard, self._squeezed)
        self._live = [self._committed, self._pending]

    def _check_boundary(self, n: int) -> None:
        for part in self._shard.parts.values():
            if part.pushed or part.queued:
                who = ", ".join(node_name(w) for w in sorted(part.pushed | set(part.queued)))
                raise CollectiveMismatchError(
                    f"commit {n}: key {self._shard.named(part.key)} (offset {part.offset}) has an open sync round "
                    f"{part.round + 1} that {who} pushed and the others did not: every worker must push the same "
                    "steps between commits")
            if part.waiting or part.early:
                raise CollectiveMismatchError(f"commit {n}: key {self._shard.named(part.key)} (offset {part.offset}) "
                                              f"has {len(part.waiting) + len(part.early)} pull(s) waiting for a round")

    def promote(self, n: int) -> None:
        """The view names commit ``n``: the pending snapshot becomes the one to roll back to.

        Raises:
            InvalidArgumentError: this shard took no commit ``n`` (it cannot roll back to it).
        """
        if self._pending is not None and self._pending.n == n:
            self._committed, self._pending = self._pending, None
            self._live = [self._committed]
        elif self._committed.n != n:
            raise InvalidArgumentError(f"commit {n} was not taken on this server (its last is {self._committed.n})")

    def touch(self, part: Part) -> None:
        """A push joined ``part``'s round: a part made since a commit is held at its first one."""
        for snap in self._live:
            snap.touch(part)

    def before_write(self, part: Part) -> None:
        """``part``'s key is about to be written in place: copy it (and its updater state) once per commit."""
        for snap in self._live:
            if part.key not in snap.written:
                snap.before_write(self._shard, part.key)

    def rollback(self, detail: str, epoch: int = 0, slot: int = -1) -> int:
        """Put the shard back to the last commit; its parked pulls fail with MembershipChangedError.

        Args:
            detail: what changed (``"worker slot 1 departed"``), in the error the pulls get.
            epoch, slot: the view the change made and the slot that caused it (the error's fields).

        Returns:
            The pulls failed.
        """
        shard = self._shard
        error = MembershipChangedError(detail, epoch, slot)
        failed = shard.fail_waiting(Refused(str(error), type(error).__name__))
        snap = self._committed
        snap.put_back(shard)
        for part in shard.parts.values():
            part.pushes.clear()
            part.pushed.clear()
            part.queued.clear()
            part.rows_merge = []
            part.published = None
        shard.joined.clear()
        shard.void = VoidRounds()
        if self._squeezed is not None and snap.squeezed is not None:
            self._squeezed.restore([s._replace(payload=s.payload.copy(), residual=s.residual.copy())
                                    for s in snap.squeezed], "")
        self._pending = None
        self._live = [snap]
        return failed

    def nbytes(self) -> int:
        """Bytes the snapshots hold beyond the shard (``pskv top``)."""
        return sum(snap.nbytes(self._shard) for snap in self._live)


class CommitObserver(ShardObserver):
    """The shard's observer in an elastic job: each push and in-place write told to the snapshots, then to
    the observer it wraps."""

    def __init__(self, inner: ShardObserver, commits: CommitSnapshots) -> None:
        self.inner = inner
        self._commits = commits

    def pushed(self, part: Part, worker: int) -> None:
        self._commits.touch(part)
        self.inner.pushed(part, worker)

    def round_full(self, part: Part) -> None:
        self.inner.round_full(part)

    def applied(self, part: Part, update: Callable[..., T], *args: Any) -> T:
        self._commits.before_write(part)
        return self.inner.applied(part, update, *args)

    def round_completed(self, part: Part) -> None:
        self.inner.round_completed(part)


class NoCommits:
    """A job that is not elastic: no snapshots; the handlers' calls cost a call that returns."""

    commit = 0

    @staticmethod
    def wrap(inner: ShardObserver) -> ShardObserver:
        """``inner`` itself: nothing on the hot path."""
        return inner

    def take(self, n: int) -> None:
        """Raises NotSupportedError: only an elastic job commits."""
        raise NotSupportedError("COMMIT: this job is not elastic (pskv launch -n MIN:MAX)")

    def promote(self, n: int) -> None:
        """Nothing to promote."""

    def before_write(self, part: Part) -> None:
        """Nothing to copy."""

    def rollback(self, detail: str, epoch: int = 0, slot: int = -1) -> int:
        """Nothing to roll back to; nothing failed."""
        return 0

    def nbytes(self) -> int:
        """No snapshot."""
        return 0
