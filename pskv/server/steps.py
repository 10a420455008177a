"""Mismatched step counts, as one server sees them: a sync round that a worker at a meeting never pushed.

The most common data-parallel mistake is uneven data without ``kv.join()``: one worker runs
one ``pushpull`` more than another, which has gone on to a barrier (or another collective).
The round of the extra push waits for a push that comes only after the meeting, and the
meeting waits for the worker stuck in the round: without this module both wait their whole
timeout.

Before each counted meeting a worker sends every server a :class:`~pskv.protocol.bodies.Meeting`
mark (a ``SYNC`` with a body). One worker's messages to a server are handled in order, so
its pushes sent before the meeting are here when its mark is; a *settled* mark says it sent
every push it issued before the meeting. So when the mark of meeting ``n`` of worker A is
settled, and the open round of a part holds a push of worker B whose last mark here is
older than ``n`` (B pushed it before meeting ``n``), but none of A (not joined), the round
can only complete after meeting ``n`` on A's side and before it on B's: the workers' step
counts differ. The check is made when A's mark comes (every open round: a meeting is rare)
and when such a push comes later (:meth:`StepOrder.pushed`, called only while some settled
mark is ahead of another worker's mark — in a job whose steps match, only while the workers
arrive at a meeting).

What happens then: the server reports the meeting to the scheduler at once, in a heartbeat
(:meth:`StepOrder.take_report`, ``Membership.report_now``), which fails it on every worker
there with the text (:meth:`pskv.cluster.meetings.Meetings.mismatch`); once the scheduler has
it, the round fails on every worker (its waiting pulls, and later ones, get
:class:`~pskv.errors.CollectiveMismatchError` naming the worker that is ahead, the key, the
round and the fix). In that order, so that the worker ahead cannot raise and leave before
the meeting fails — a departure would fail the meeting first, naming only the departure.

Marks are compared only between workers that sent one: a replacement process (its meetings
are not counted) sends none, and its rank's marks are forgotten (:meth:`StepOrder.forget`).
An unsettled mark (operations still queued) counts as the worker's mark, so its later pushes
are not taken for early ones, but it accuses nobody.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from pskv.protocol import node_name
from pskv.protocol.bodies import Meeting
from pskv.server.gather import Refused
from pskv.server.part import Part
from pskv.server.shard import ServerShard

__all__ = ["StepOrder", "mismatch_text"]

log = logging.getLogger("pskv.server")

FIX = ("every worker must push a key as many times as the others between two collectives: with uneven data, "
       "call kv.join() on a worker that has run out of batches (or use Trainer.fit(uneven=True))")


def mismatch_text(ahead: list[int], behind: list[int], key: str, round_: int, where: str) -> str:
    """The error every worker gets: ``ahead`` pushed sync round ``round_`` of ``key``, ``behind`` is ``where``."""
    others = f" (and {', '.join(node_name(n) for n in ahead[1:])})" if ahead[1:] else ""
    late = ", ".join(node_name(n) for n in behind)
    return (f"mismatched step counts: {node_name(ahead[0])} is ahead{others}: it pushed key {key} for sync round "
            f"{round_}, which {late} will not push before {where}; {FIX}")


class StepOrder:
    """The workers' meeting marks on one server, and the rounds they show cannot complete.

    Args:
        shard: the shard whose open rounds are checked.
        refuse: fails a part's open round on every worker with a reason (``DataHandlers.refuse_round``).
        name: the server's name, for the log.
    """

    def __init__(self, shard: ServerShard, refuse: Callable[[Part, Refused], None], name: Callable[[], str]) -> None:
        self._shard = shard
        self._refuse = refuse
        self._name = name
        self._marks: dict[int, int] = {}  # worker -> the last meeting it marked here
        self._settled: dict[int, tuple[int, str]] = {}  # worker -> its meeting, named, if its mark was settled
        self.watch = False  # a settled mark is ahead of another worker's: pushes are checked (pushed)
        self._report: tuple[int, str] | None = None  # the meeting to fail, and why (for the scheduler)
        self._reported: set[int] = set()  # meetings reported (a few: a job fails at the first)
        # a report is due: the node sends it now, and calls back once the scheduler has it (Membership.report_now)
        self.on_report: Callable[[Callable[[], None]], None] = _at_once
        self._held: list[tuple[Part, Refused]] = []  # rounds to fail once the scheduler has the report

    def marked(self, worker: int, mark: Meeting) -> None:
        """``worker`` arrives at its meeting ``mark.seq``: fail the open rounds it shows cannot complete."""
        self._marks[worker] = mark.seq
        where = f"{mark.name}#{mark.seq}" if mark.name else f"its meeting #{mark.seq}"
        if mark.settled:
            self._settled[worker] = (mark.seq, where)
        else:
            self._settled.pop(worker, None)
        self._rewatch()
        if not mark.settled or not self._shard.sync or worker in self._shard.joined or not any(
                n < mark.seq for w, n in self._marks.items() if w != worker):
            return  # nobody's pushes can be from before this meeting: no pass over the parts
        for part in list(self._shard.parts.values()):
            if part.pushed and worker not in part.pushed:
                early = [b for b in part.pushed if self._marks.get(b, mark.seq) < mark.seq]
                if early:
                    self._fail(part, sorted(early), [worker], mark.seq, where)

    def pushed(self, parts: Iterable[Part], worker: int) -> None:
        """``worker``'s pushes joined these parts' rounds (while :attr:`watch`): early for a settled mark?"""
        seq = self._marks.get(worker)
        if seq is None or not self._shard.sync:
            return
        joined = self._shard.joined
        for part in parts:
            if worker not in part.pushed:  # queued for a later round
                continue
            behind = sorted(w for w, (n, _) in self._settled.items()
                            if n > seq and w not in part.pushed and w not in joined)
            if behind:
                n, where = self._settled[behind[0]]
                self._fail(part, [worker], behind, n, where)

    def forget(self, worker: int) -> None:
        """A replacement process took over ``worker``'s rank: its marks are not its predecessor's."""
        self._marks.pop(worker, None)
        self._settled.pop(worker, None)
        self._rewatch()

    def take_report(self) -> tuple[int, str] | None:
        """The meeting to fail at the scheduler and why, once (the membership sends it with a heartbeat)."""
        report, self._report = self._report, None
        return report

    def _rewatch(self) -> None:
        ahead = max((n for n, _ in self._settled.values()), default=0)
        self.watch = ahead > min(self._marks.values(), default=ahead)

    def _fail(self, part: Part, ahead: list[int], behind: list[int], seq: int, where: str) -> None:
        text = mismatch_text(ahead, behind, self._shard.named(part.key), part.round + 1, where)
        reason = Refused(text, "CollectiveMismatchError")
        if seq not in self._reported:  # once per meeting (every key of the extra step fails)
            self._reported.add(seq)
            self._report = (seq, text)
            log.error("%s: %s", self._name(), text)
            self._held.append((part, reason))
            self.on_report(self._release)  # the scheduler first: the meeting fails with this text, not a departure
        elif self._held:  # the report is on its way
            self._held.append((part, reason))
        else:
            self._refuse(part, reason)

    def _release(self) -> None:
        """The scheduler has the report: the rounds held fail now (their pulls, on every worker)."""
        held, self._held = self._held, []
        for part, reason in held:
            self._refuse(part, reason)


def _at_once(done: Callable[[], None]) -> None:
    """No membership (a shard in a test): the rounds fail at once; the report waits for :meth:`StepOrder.take_report`."""
    done()
