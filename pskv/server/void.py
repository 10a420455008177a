"""Void rounds: a sync push the server refused still takes its worker's place in a round.

A push refused for its shape, dtype or payload (a worker's ``kv.refuse_push``, which
``pskv.torch`` and the ``byteps`` store use for a misfit tensor, or a bad message) counts as
that worker's push, as every push does. It also holds the worker's place in the round it
would have joined, adding nothing. That round completes *void*: the value is unchanged, no
update runs, and its pulls fail with the refusal. So every worker's rounds stay in step: the
refused round is over on every worker and the key works on from the next one.

Before this, a refused push joined no round, while the others' pushes of that round waited
there forever. The refusing worker's later pushes were then one round behind the others',
and the next meeting failed with "mismatched step counts" (:mod:`pskv.server.steps`).

:class:`VoidRounds` holds the state and the rule; the shard calls it when a refused push is
counted (:meth:`~pskv.server.shard.ServerShard.void_push`) and when a round completes.
"""

from __future__ import annotations

import time
from collections import deque

from pskv.server.part import Part, PartId

__all__ = ["VoidRounds", "fail_round", "hold"]


class VoidRounds:
    """The void rounds of one shard's parts, each with the refusal its pulls fail with."""

    def __init__(self) -> None:
        self._rounds: dict[PartId, dict[int, str]] = {}  # void rounds still open: round -> refusal
        # each part's last void round that completed: (round, refusal, {worker: its push number in it})
        self._done: dict[PartId, tuple[int, str, dict[int, int]]] = {}
        self.parts: set[PartId] = set()  # parts with either (the shard's pulls look here only then)

    def push(self, part: Part, worker: int, reason: str) -> int:
        """``worker``'s refused push takes its place in ``part``'s next round it has not pushed to, which becomes
        void; the pulls already waiting for that round fail now. Returns that round."""
        if worker in part.pushed:  # for a later round, as a push would be: queued, holding its place
            queue = part.queued.setdefault(worker, deque())
            queue.append(None)
            joined = part.round + 1 + len(queue)
        else:
            hold(part, worker)
            joined = part.round + 1
        self._rounds.setdefault((part.key, part.offset), {})[joined] = reason
        self.parts.add((part.key, part.offset))
        fail_round(part, joined, reason)
        return joined

    def complete(self, part: Part) -> bool:
        """True if ``part``'s open round, full, is void: its rows or sum are dropped and the pulls waiting for it
        fail; the shard then advances it without touching the value."""
        voids = self._rounds.get((part.key, part.offset))
        if not voids or part.round + 1 not in voids:
            return False
        round_, pid = part.round + 1, (part.key, part.offset)
        reason = voids.pop(round_)
        if not voids:
            del self._rounds[pid]
        numbers = {w: next((n for n, r in log.open if r == round_), 0) for w, log in part.pushes.items()
                   if w in part.pushed}
        self._done[pid] = (round_, reason, numbers)
        part.rows_merge = []
        fail_round(part, round_, reason)
        return True

    def completed_by(self, part: Part, worker: int, number: int, round_: int) -> None:
        """``worker``'s push ``number`` completed ``part``'s round ``round_`` (its pulls name it): if void, noted."""
        done = self._done.get((part.key, part.offset))
        if done is not None and done[0] == round_:
            done[2][worker] = number

    def refusal(self, part: Part, round_: int, worker: int = -1, number: int = 0) -> str | None:
        """The refusal a pull of ``part``'s round ``round_`` (or of ``worker``'s push ``number``) fails with:
        that round is void, open or the last one completed (its value is the round before's); else None."""
        pid = (part.key, part.offset)
        if pid not in self.parts:
            return None
        voids = self._rounds.get(pid)
        if voids and round_ in voids:
            return voids[round_]
        done = self._done.get(pid)
        if done is not None:
            if done[0] == round_ or (number and done[2].get(worker) == number):
                return done[1]
            if part.round > done[0] + 1:  # two rounds on: nobody pulls that round any more
                del self._done[pid]
                if pid not in self._rounds:
                    self.parts.discard(pid)
        return None


def hold(part: Part, worker: int) -> None:
    """``worker``'s place in ``part``'s open round, without a value (a queued refused push, ``None``, too)."""
    if not part.pushed:
        part.round_started = time.monotonic()  # its age: a round open too long is a stall
        part.rows_merge = []
        if part.merge is None and not part.row_width:
            part.merge = part._fresh_merge()  # the others' pushes are added here, then dropped
    part.pushed.add(worker)


def fail_round(part: Part, round_: int, reason: str) -> None:
    """The pulls waiting for ``part``'s round ``round_`` fail with ``reason``."""
    if not any(w[0] == round_ for w in part.waiting):
        return
    failing = [w[2] for w in part.waiting if w[0] == round_]
    part.waiting = [w for w in part.waiting if w[0] != round_]
    for fail in failing:
        if fail is not None:
            fail(reason)
