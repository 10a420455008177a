"""Push numbers, and where a replacement worker process goes on (``push_count``, ``resume_step``).

Every push (and pushpull) a worker rank makes of a key is numbered, per part of the key
(:attr:`~pskv.worker.KeyLayout.pushes`); a server applies a push number once. A process
that replaces a dead worker of a running job (``is_recovery``) learns at its REJOIN how
many pushes of its rank reached each server (:class:`~pskv.worker.replacement.WorkerRejoin`) and
numbers on from there, so re-pushing a step that had landed changes nothing.

``resume_step`` is the step a training loop that pushes each key once per step goes on
from: the fewest pushes of its keys. Where the old process died in the middle of a step
(some keys pushed, others not), each key's numbering is set back to that step, so pushing
the step again is applied for the keys that missed it and ignored for the others.

Until it has asked, a replacement whose rank had pushed a key cannot push it
(:class:`ResumeGuard`): numbered on from the pushes that arrived, a step the program
takes from elsewhere (its own progress file) would be summed into a later round. A
replacement whose rank never pushed the key goes on from step 0 either way.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Collection, Sequence
from typing import Any

from pskv.errors import InvalidArgumentError
from pskv.kvstore.keys import Key
from pskv.worker import KeyLayout, KVWorker

__all__ = ["PushNumbers", "ResumeGuard"]

log = logging.getLogger("pskv.dist")

GUARDED = ("push", "pushpull")  # the store's calls that number a push


class ResumeGuard:
    """Refuses a replacement's pushes of the keys its rank had pushed until it asked ``resume_step`` for them.

    Armed, it puts wrappers of the store's :data:`GUARDED` calls in the store instance's
    ``__dict__``, which check the call's keys before anything runs or is sent; disarmed,
    it removes them: a store that is no replacement, or that asked, calls its own methods.

    Args:
        store: the dist store (its ``push`` / ``pushpull`` and ``_key_list``), held weakly: no cycle.
    """

    def __init__(self, store: Any) -> None:
        self._store = weakref.ref(store)
        self._unasked: dict[Any, int] = {}  # key -> its rank's pushes that arrived, before resume_step asked

    def arm(self, counts: dict[Any, int]) -> None:
        """Refuse pushes of these keys (key -> pushes of this rank that had arrived) until :meth:`asked`."""
        if counts and not self._unasked:
            store = self._store()
            for name in GUARDED:
                vars(store)[name] = self._guarded(getattr(type(store), name), name)
        self._unasked.update(counts)

    def asked(self, keys: Collection[Any]) -> None:
        """``resume_step`` answered for ``keys``: their pushes go through (no wrapper left once all did)."""
        for key in keys:
            self._unasked.pop(key, None)
        store = self._store()
        if not self._unasked and store is not None:
            for name in GUARDED:
                vars(store).pop(name, None)

    def _guarded(self, call: Callable[..., Any], op: str) -> Callable[..., Any]:
        def guarded(key: Any, *args: Any, **kwargs: Any) -> Any:
            store = self._store()
            assert store is not None  # it calls this wrapper
            self.check(store._key_list(key)[0], op)
            return call(store, key, *args, **kwargs)
        return guarded

    def check(self, keys: Sequence[Any], op: str) -> None:
        """Raises InvalidArgumentError, naming ``kv.resume_step()``, for a key of ``keys`` not asked about yet."""
        for key in keys:
            if key in self._unasked:
                raise InvalidArgumentError(
                    f"{op} of key {key!r}: this process replaced a worker whose pushes of it had reached the servers "
                    f"({self._unasked[key]} of them); call kv.resume_step() first: it returns the step to go on from, and "
                    "a push of a step that was applied already would be summed into a later round")


class PushNumbers:
    """A dist store's push numbering across process replacement.

    Args:
        worker: the store's worker layer (it learnt at REJOIN which pushes arrived).
        recovery: whether this process replaced a dead worker of a running job (the log says so).
        store: the dist store, whose pushes a replacement's :class:`ResumeGuard` holds back.
        rank: this worker's rank, for the log.
    """

    def __init__(self, worker: KVWorker, recovery: bool, store: Any, rank: int) -> None:
        self._worker = worker
        self._recovery = recovery
        if recovery:  # the job runs already: nobody else is at a creation barrier
            log.warning("worker %d: a replacement process joins the running job (is_recovery)", rank)
        self._resumed: dict[Key, int] = {}  # a replacement: per key, pushes of this rank that had arrived
        self._guard = ResumeGuard(store)

    def resume(self, recs: Sequence[KeyLayout]) -> None:
        """A replacement's keys: number their pushes on from those of this rank that reached the servers."""
        rejoin = self._worker.client.rejoin
        rejoin.resume(recs)
        self._resumed.update((rec.key, rec.pushes[0]) for rec in recs)
        # any part's count (a key whose parts differ was pushed too) arms the guard
        self._guard.arm({rec.key: most for rec in recs if (most := rejoin.most(rec))})

    @staticmethod
    def count(rec: KeyLayout) -> int:
        """Pushes of ``rec``'s key made by this worker rank (in a replacement: on from those that arrived)."""
        return rec.pushes[0]

    def resume_step(self, recs: Sequence[KeyLayout]) -> int:
        """The fewest pushes of any of ``recs``' keys (0 for none); a replacement sets their numbering back to it.

        Raises:
            InvalidArgumentError: a replacement process pushed one of the keys already
                (call it before the first push).
        """
        if not recs:
            return 0
        step = min(rec.pushes[0] for rec in recs)
        if self._recovery:
            pushed = [rec.key for rec in recs if rec.pushes[0] != self._resumed.get(rec.key)]
            if pushed:
                raise InvalidArgumentError(f"resume_step: this replacement process pushed key {pushed[0]!r} "
                                           "already; call resume_step before the first push")
            for rec in recs:
                rec.pushes = [step] * len(rec.parts)
                self._resumed[rec.key] = step
            self._guard.asked([rec.key for rec in recs])
        return step
