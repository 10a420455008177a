"""Push numbers, and where a replacement worker process goes on (``push_count``, ``resume_step``).

Every push (and pushpull) a worker rank makes of a key is numbered, per part of the key
(:attr:`~pskv.worker.KeyLayout.pushes`); a server applies a push number once. A process
that replaces a dead worker of a running job (``is_recovery``) learns at its REJOIN how
many pushes of its rank reached each server (:meth:`~pskv.worker.KVWorker.resume`) and
numbers on from there, so re-pushing a step that had landed changes nothing.

``resume_step`` is the step a training loop that pushes each key once per step goes on
from: the fewest pushes of its keys. Where the old process died in the middle of a step
(some keys pushed, others not), each key's numbering is set back to that step, so pushing
the step again is applied for the keys that missed it and ignored for the others.
"""

from __future__ import annotations

from collections.abc import Sequence

from pskv.errors import InvalidArgumentError
from pskv.kvstore.keys import Key
from pskv.worker import KeyLayout, KVWorker

__all__ = ["PushNumbers"]


class PushNumbers:
    """A dist store's push numbering across process replacement.

    Args:
        worker: the store's worker layer (it learnt at REJOIN which pushes arrived).
        recovery: whether this process replaced a dead worker of a running job.
    """

    def __init__(self, worker: KVWorker, recovery: bool) -> None:
        self._worker = worker
        self._recovery = recovery
        self._resumed: dict[Key, int] = {}  # a replacement: per key, pushes of this rank that had arrived

    def resume(self, recs: Sequence[KeyLayout]) -> None:
        """A replacement's keys: number their pushes on from those of this rank that reached the servers."""
        self._worker.resume(recs)
        self._resumed.update((rec.key, rec.pushes[0]) for rec in recs)

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
        return step
