"""The key-value state one server holds, and its sync / async aggregation rules. No I/O.

A server holds *parts*: a whole small key, or one contiguous slice of a big key that is
split over all servers. Each part is identified by ``(key, offset)``.

Sync mode (``dist_sync``), per part:

* a round collects exactly one push from each worker — distinct workers are counted,
  not requests (MXNet counted requests, so one worker could complete a round alone);
* a worker's second push before the round completes is queued for the next round;
* when every worker has pushed, the updater runs once on the sum (or the sum becomes the
  value), the round number advances, waiting pulls are answered, and queued pushes
  start the next round;
* a pull names the push it must see — "this worker's ``n``-th push of this part" — and
  is parked until the round that push joined is complete — so consecutive pushes give
  every worker the same values (MXNet's were undefined). Naming the push by number
  lets a worker send the pull right behind the push, without waiting for the push's
  reply; a pull that overtook its push on the way waits for the push to arrive. Every
  push a worker sends counts, also one that failed (its "round" is that of the
  worker's previous push), so worker and server always agree on the numbers; a
  refused one holds its worker's place in a round that then changes nothing
  (:mod:`pskv.server.void`), so the workers' rounds stay in step.

Push numbers (at most once): every push of a part carries its number (the worker's
``n``-th push of it, :attr:`ArraySpec.round`). A number that already landed — a replayed
message, or a replacement process pushing again a step its predecessor's push of which
had arrived — is ignored: not summed, not counted, acknowledged as before. The counts
outlive the worker process that pushed: a replacement (``REJOIN``) learns them
(:meth:`ServerShard.replaced`) and numbers its pushes on from them, so a push is applied
at most once per (worker rank, part, push number). A push without a number (0) takes the
next one.

Async mode (``dist_async``): each push is applied on arrival through the updater, which
is required; a pull waits only for the push it names to have arrived.

Values are stored as NumPy arrays; bfloat16 parts are held as float32 (exact for
bfloat16 values) and rounded back when sent.

Row-sparse parts (``Part.row_width`` > 0; :mod:`pskv.server.rows`): a range of whole rows
of a row-sparse key. Their pushes carry some rows (a :class:`~pskv.server.rows.RowBatch`);
the same round rules apply (every worker pushes each round, maybe no rows), the round's
rows are summed by id and applied by :func:`pskv.server.rows.apply`. They are never in
shared memory, and are updated in place, so replies of their whole value are snapshots.

Replies are sent without copying, so a value array that may be in flight is never
written again: without an updater a completed round *replaces* the value by the merge
buffer (and the next round gets a fresh one); with an updater, which changes the value
in place, :meth:`Part.wire_value` hands out a snapshot — one per round, shared by every
pull of that round. Every in-place write of a value goes through ``observer.applied``, where an
elastic job's commit snapshots copy the key before its first write after a commit
(:mod:`pskv.server.commits`); :meth:`ServerShard.overwrite`'s caller asks them first itself.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, TypeVar

import numpy as np

from pskv.arrays.dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from pskv.errors import InvalidArgumentError
from pskv.optimizer.base import UpdateFn
from pskv.server import rows as sparse_rows
from pskv.server.part import MAX_PUSHES_AHEAD, Allocator, KeySlice, Part, PartId, PushLog, storage_dtype, to_storage
from pskv.server.part_init import PartInit
from pskv.server.rows import RowBatch
from pskv.server.void import VoidRounds, hold

# Part and its helpers live in pskv.server.part; they are named here too, where the server's modules look for them.
__all__ = ["MAX_PUSHES_AHEAD", "Allocator", "OpenRound", "Part", "PushLog", "ServerShard", "ShardObserver", "PartId",
           "bf16_bits_to_f32", "f32_to_bf16_bits", "storage_dtype", "to_storage"]

T = TypeVar("T")


class ShardObserver:
    """What a shard's rounds do, told to whoever watches them: the server's counters and timeline spans
    (:mod:`pskv.server.observe`). This one, the default, ignores it all: the shard calls it without a test."""

    def pushed(self, part: Part, worker: int) -> None:
        """``worker``'s push joined ``part``'s open sync round."""

    def round_full(self, part: Part) -> None:
        """``part``'s open sync round has every push it waits for; it is applied next."""

    def applied(self, part: Part, update: Callable[..., T], *args: Any) -> T:
        """Apply ``part``'s round (or async push): ``update(*args)``, whose result is returned."""
        return update(*args)

    def round_completed(self, part: Part) -> None:
        """A round of ``part`` completed (sync) or a push of it was applied (async)."""


class OpenRound(NamedTuple):
    """A sync round some workers pushed to and others not yet (:meth:`ServerShard.open_rounds`)."""

    part: Part
    round: int  # its number (1-based)
    pushed: set[int]  # the workers whose push joined it (the part's own set: read, do not keep)
    age: float  # seconds since its first push


class ServerShard(PartInit):
    """All parts of one server (made and found by :class:`~pskv.server.part_init.PartInit`).

    Args:
        num_workers: workers whose pushes make up one sync round.
        sync: sync (True) or async (False) aggregation.
        allocate: makes a part's shared-memory buffers (None: none), with a push slot for each of ``workers``.
        observer: told what the rounds do (:class:`ShardObserver`; the default ignores it).
    """

    def __init__(self, num_workers: int, sync: bool = True, allocate: Allocator | None = None,
                 workers: tuple[int, ...] = (), observer: ShardObserver | None = None) -> None:
        super().__init__(sync, allocate, workers)
        self.num_workers = num_workers
        self.updater: UpdateFn | None = None
        # Workers that joined (ran out of data, see :meth:`join`): sync rounds complete
        # without them until every worker has joined.
        self.joined: set[int] = set()
        self.void = VoidRounds()  # rounds a refused push holds a place in (void_push)
        self.observer = observer or ShardObserver()

    def _full(self, part: Part) -> bool:
        """True if the open round of ``part`` has a push from every worker that has not joined."""
        if not self.joined:
            return len(part.pushed) == self.num_workers
        return bool(part.pushed) and len(part.pushed | self.joined) >= self.num_workers

    # -- uneven data --------------------------------------------------------------------
    def join(self, worker: int) -> list[Part]:
        """``worker`` has no more data: complete every open round that only waited for it.

        From now on, sync rounds need pushes only from the workers that have not joined
        (a joined worker contributes nothing to the sum). When every worker has joined,
        the joined set is cleared and rounds need everyone again (the next epoch).

        Returns:
            The parts whose rounds completed.
        """
        self.joined.add(worker)
        completed = []
        if len(self.joined) >= self.num_workers:
            self.joined.clear()
        elif self.sync:
            for part in self.parts.values():
                if part.pushed and self._full(part):
                    self._complete(part)
                    completed.append(part)
        return completed

    # -- whole values (making and finding parts: PartInit) ---------------------------------
    @staticmethod
    def overwrite(part: Part, data: np.ndarray[Any, Any]) -> None:
        """Replace ``part``'s value in place (a broadcast; every reader finished at the barrier before)."""
        np.copyto(part.value, to_storage(part.dtype, data.reshape(-1)))
        part.published = None

    def snapshot(self) -> list[tuple[Part, np.ndarray[Any, Any]]]:
        """Every part with a copy of its value (as stored), for a checkpoint."""
        return [(p, p.value.copy()) for p in self.parts.values()]

    # -- push -------------------------------------------------------------------------
    def landed(self, part: Part, worker: int, number: int) -> bool:
        """True if ``worker``'s push ``number`` of ``part`` arrived already: a repeat, to be ignored.

        Raises:
            InvalidArgumentError: ``number`` is more than :data:`MAX_PUSHES_AHEAD` past the
                worker's pushes that arrived (no worker numbers so; nothing is counted).
        """
        log = part.pushes.get(worker)
        count = 0 if log is None else log.count
        if number > count + MAX_PUSHES_AHEAD:
            raise InvalidArgumentError(f"push of key {self.named(part.key)}: push number {number} is more than "
                                       f"{MAX_PUSHES_AHEAD} past the {count} push(es) of this worker that arrived")
        return log is not None and log.landed(number)

    def push(self, part: Part, worker: int, frame: np.ndarray[Any, Any] | RowBatch, number: int = 0) -> int:
        """Add ``worker``'s push ``number`` to ``part`` (0: its next one); the number counts also if it fails.

        A row-sparse part's push is a :class:`RowBatch` (checked, storage dtype).

        The caller has checked with :meth:`landed` that the number is new.

        Returns:
            The round this push belongs to (1-based): its effect is visible to a pull
            that waits for this round.

        Raises:
            InvalidArgumentError: async mode without an updater; or an unnumbered push whose
                number would be more than :data:`MAX_PUSHES_AHEAD` past the worker's (nothing counted).
            Exception: the updater's own error (the part is unchanged in sync mode).
        """
        log = part.pushes.get(worker)
        if log is None:  # (not setdefault: that would build a PushLog for every push)
            log = part.pushes[worker] = PushLog()
        number = number or log.next_number()
        if number > log.count + MAX_PUSHES_AHEAD:  # an unnumbered push past a far one (:meth:`landed`)
            raise InvalidArgumentError(f"push of key {self.named(part.key)} by worker {worker}: push number {number} "
                                       f"is more than {MAX_PUSHES_AHEAD} past the {log.count} push(es) of this "
                                       "worker that arrived")
        try:
            joined = self._push(part, worker, frame if isinstance(frame, RowBatch)
                                else to_storage(part.dtype, frame.reshape(-1)))
        except Exception:
            self.skip_push(part, worker, number)
            raise
        log.mark(number)
        if joined > part.round:
            log.open.append((number, joined))
        elif self.void.parts:  # this push completed its round: a void one's pulls may name it
            self.void.completed_by(part, worker, number, joined)
        if part.early:
            self._resolve_early(part, worker)
        return joined

    def skip_push(self, part: Part, worker: int, number: int = 0) -> None:
        """Count ``worker``'s push ``number`` (0: its next one) that was refused: no effect, its number used.

        A pull naming it waits for what the worker's previous push joined. A number far
        past the worker's pushes (:meth:`landed` refuses it) is not recorded.
        """
        log = part.pushes.get(worker)
        if log is None:  # (not setdefault: that would build a PushLog for every push)
            log = part.pushes[worker] = PushLog()
        number = number or log.next_number()
        if number > log.count + MAX_PUSHES_AHEAD:
            return
        log.mark(number)
        if part.early:
            self._resolve_early(part, worker)

    def void_push(self, part: Part, worker: int, number: int, reason: str) -> int:
        """Count ``worker``'s sync push ``number`` (0: its next one), refused for ``reason``: a place in the round
        it would have joined, which is void (:mod:`pskv.server.void`). That round; 0 if :meth:`landed` refuses it."""
        log = part.pushes.get(worker)
        if log is None:  # (not setdefault: that would build a PushLog for every push)
            log = part.pushes[worker] = PushLog()
        number = number or log.next_number()
        if number > log.count + MAX_PUSHES_AHEAD:
            return 0
        log.mark(number)
        joined = self.void.push(part, worker, reason)
        log.open.append((number, joined))
        if joined == part.round + 1 and self._full(part):
            self._complete(part)
        if part.early:
            self._resolve_early(part, worker)
        return joined

    def replaced(self, worker: int) -> list[tuple[int, int, int]]:
        """A replacement process took over ``worker``'s rank: its pushes that arrived, per part.

        The counts stay (the replacement numbers its pushes on from them, so a push the old
        process made is not applied again); pulls of the old process that waited for a
        push of its that never came are dropped (nobody reads their answers).

        Returns:
            ``(key, offset, count)`` for every part the rank pushed: pushes 1..count arrived.
        """
        counts = []
        for part in self.parts.values():
            log = part.pushes.get(worker)
            if log is not None:
                counts.append((part.key, part.offset, log.count))
            if part.early:
                part.early = [e for e in part.early if e[0] != worker]
        return counts

    def round_of_push(self, part: Part, worker: int, number: int) -> int | None:
        """The round a pull naming ``worker``'s push ``number`` must wait for.

        0 when nothing to wait for (no such push yet asked for, or its round is complete,
        or async mode); None when that push has not arrived yet.
        """
        if number <= 0:
            return 0
        log = part.pushes.get(worker)
        if log is None or log.count < number:
            return None
        if log.open and log.open[0][1] <= part.round:
            log.open = [(n, r) for n, r in log.open if r > part.round]
        # the latest open round of the applied pushes up to `number` (in any order of arrival)
        return max((r for n, r in log.open if n <= number), default=0)

    def joined_round(self, part: Part, worker: int, number: int) -> int:
        """The round ``worker``'s push ``number`` joined if it may still be open; else 0 (complete)."""
        log = part.pushes.get(worker)
        return 0 if log is None else next((r for n, r in log.open if n == number), 0)

    def pull_after_push(self, part: Part, worker: int, number: int, ready: Callable[[Part], None],
                        fail: Callable[[str], None] | None = None) -> None:
        """Like :meth:`pull`, for the round of ``worker``'s push ``number`` of ``part``.

        If that push has not arrived yet (the pull overtook it), the pull waits for it.
        """
        min_round = self.round_of_push(part, worker, number)
        if min_round is None:
            part.early.append((worker, number, ready, fail))
        elif self.void.parts and fail and (refused := self.void.refusal(part, min_round, worker, number)):
            fail(refused)  # the push it names, or the round it waits for, is a refused push's (void)
        else:
            self.pull(part, min_round, ready, fail)

    def _resolve_early(self, part: Part, worker: int) -> None:
        count = part.pushes[worker].count
        due = [e for e in part.early if e[0] == worker and e[1] <= count]
        if not due:
            return
        part.early = [e for e in part.early if not (e[0] == worker and e[1] <= count)]
        for _, number, ready, fail in due:
            self.pull_after_push(part, worker, number, ready, fail)

    def _push(self, part: Part, worker: int, data: Any) -> int:
        if not self.sync:
            if self.updater is None and not part.summed:
                raise InvalidArgumentError(
                    "dist_async applies every push through the optimizer: call set_optimizer "
                    "(or set an updater on the servers) before pushing"
                )
            if part.row_width:
                part.present = self._apply_rows(part, data)
            elif part.summed:  # in place: told to the observer as any update is (an elastic job's copy-on-write)
                self.observer.applied(part, np.add, part.value, data, part.value)
            else:
                self._update(part, data)
            part.round += 1
            self._answer(part)
            return part.round
        if worker in part.pushed:
            queue = part.queued.setdefault(worker, deque())
            queue.append(RowBatch(data.ids.copy(), np.array(data.rows)) if part.row_width else np.array(data, copy=True))
            return part.round + 1 + len(queue)
        self._add(part, worker, data)
        joined = part.round + 1
        if self._full(part):
            self._complete(part)
        return joined

    def _add(self, part: Part, worker: int, data: Any) -> None:
        if not part.pushed:
            part.round_started = time.monotonic()  # its age: a round open too long is a stall
        if part.row_width:  # the rows are kept (copied) until the round completes
            if not part.pushed:
                part.rows_merge = []
            part.rows_merge.append(RowBatch(data.ids, np.array(data.rows)))
        elif not part.pushed:
            if part.merge is None:
                part.merge = part._fresh_merge()
            np.copyto(part.merge, data)
        else:
            assert part.merge is not None
            np.add(part.merge, data, out=part.merge)
        part.pushed.add(worker)
        self.observer.pushed(part, worker)

    def _complete(self, part: Part) -> None:
        """Apply a full round, answer pulls, and start queued pushes (possibly repeatedly).

        With an updater, the pieces of a key on this server (its slice, cut by
        ``PSKV_PART_BYTES``) are updated together once every piece's round is full: the
        updater sees the whole slice as if it were uncut (one state, one update count).
        Until then a full piece stays full, so its next pushes queue.
        """
        while True:
            if self.void.parts and self.void.complete(part):  # a refused push's round: nothing applied
                self._advance(part)
                if not self._full(part):
                    return
                continue
            self.observer.round_full(part)
            if part.row_width:
                batches, part.rows_merge = part.rows_merge, []
                part.present = self._apply_rows(part, sparse_rows.merge(batches, part.row_width, part.value.dtype))
                self._advance(part)
                if not self._full(part):
                    return
                continue
            assert part.merge is not None
            if self.updater is None or part.summed:
                part.value, part.merge = part.merge, None  # the old value may be in flight
                self._advance(part)
            else:
                pieces = self._pieces[part.key].pieces
                if len(pieces) == 1:
                    self._update(part, part.merge)
                    self._advance(part)
                elif all(p.merge is not None and p.pushed and self._full(p) for p in pieces):
                    self._update_pieces(self._pieces[part.key])
                    for p in pieces:
                        if p is not part:
                            self._advance(p)
                    self._advance(part)  # last: its queued pushes may fill the round again
                    if self.updater is not None and all(p.pushed and self._full(p) for p in pieces):
                        continue
                    return
                else:
                    return  # the other pieces are not full yet
            if not self._full(part):
                return

    def _apply_rows(self, part: Part, batch: RowBatch) -> np.ndarray[Any, Any]:
        """A round's (or an async push's) rows into a row-sparse part; its present rows after."""
        assert part.present is not None
        part.published = None
        return self.observer.applied(part, sparse_rows.apply, part.table(), part.present, batch, part.key,
                                     self.updater, part.summed, self.sync)

    def _update(self, part: Part, grad: np.ndarray[Any, Any]) -> None:
        """The updater on ``part``'s value with ``grad`` (a round's sum, or an async push)."""
        assert self.updater is not None
        self.observer.applied(part, self.updater, part.key, grad, part.value)

    def _advance(self, part: Part) -> None:
        """``part``'s round is applied: count it, answer its pulls, start its queued pushes."""
        part.round += 1
        part.pushed.clear()
        self._answer(part)
        for worker in list(part.queued):
            queue = part.queued[worker]
            pushed = queue.popleft()
            if pushed is None:  # a refused push's place (void_push)
                hold(part, worker)
            else:
                self._add(part, worker, pushed)
            if not queue:
                del part.queued[worker]

    def _update_pieces(self, key_slice: KeySlice) -> None:
        """One updater call over the slice the pieces make up (in offset order): in place, on the one buffer
        their values and merges are views of; else (:meth:`KeySlice.update_views`) over a concatenation,
        written back into them."""
        assert self.updater is not None
        pieces = key_slice.pieces
        views = key_slice.update_views()
        if views is not None:
            self.observer.applied(pieces[0], self.updater, key_slice.key, *views)
            return
        merged = np.concatenate([p.merge for p in pieces if p.merge is not None])
        value = np.concatenate([p.value for p in pieces])
        self.observer.applied(pieces[0], self.updater, pieces[0].key, merged, value)
        at = 0
        for p in pieces:
            np.copyto(p.value, value[at: at + p.value.size])
            at += p.value.size

    # -- pull -------------------------------------------------------------------------
    def pull(self, part: Part, min_round: int, ready: Callable[[Part], None],
             fail: Callable[[str], None] | None = None) -> None:
        """Call ``ready(part)`` once ``part`` has completed ``min_round`` (now, or later).

        ``fail(reason)`` is called instead if the round can never complete
        (:meth:`fail_waiting`).
        """
        if self.void.parts and fail and (refused := self.void.refusal(part, min_round)):
            fail(refused)  # a pull of a round a refused push made void
        elif part.round >= min_round:
            ready(part)
        else:
            part.waiting.append((min_round, ready, fail))

    def _answer(self, part: Part) -> None:
        """A round of ``part`` completed (sync) or a push was applied (async): tell the observer, answer the
        pulls that waited for it."""
        self.observer.round_completed(part)
        if not part.waiting:
            return
        now = [cb for r, cb, _ in part.waiting if r <= part.round]
        part.waiting = [w for w in part.waiting if w[0] > part.round]
        for cb in now:
            cb(part)

    def fail_waiting(self, reason: str) -> int:
        """Fail every parked pull (their rounds cannot complete); returns how many."""
        failed = 0
        for part in self.parts.values():
            waiting, part.waiting = part.waiting, []
            early, part.early = part.early, []
            for fail in [w[2] for w in waiting] + [e[3] for e in early]:
                if fail is not None:
                    fail(reason)
                    failed += 1
        return failed

    def open_rounds(self, older_than: float = 0.0) -> Iterator[OpenRound]:
        """The open sync rounds whose first push came ``older_than`` s ago or more (stalls: the stall report
        and the metrics both ask here)."""
        now = time.monotonic()
        for part in self.parts.values():
            if part.pushed and now - part.round_started >= older_than:
                yield OpenRound(part, part.round + 1, part.pushed, now - part.round_started)

    def parked(self) -> int:
        """Pulls parked now: waiting for a round to complete, or for the push they name to arrive."""
        return sum(len(part.waiting) + len(part.early) for part in self.parts.values())
