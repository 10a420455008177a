"""Dead and replaceable workers, as one server sees them, and the report of stalled sync rounds.

In sync mode a round needs a push from every worker, so a dead worker stops every
round it has not pushed to. What the server does about it (:class:`DeadWorkers`):

* without recovery (``recovery_timeout`` 0): the worker is dead for good; every pull
  waiting for a round it blocks fails at once with NodeFailedError naming it, and so
  does every later pull that would have to wait;
* with recovery: its rounds keep waiting for a replacement process; a replacement
  announces itself (membership's ``on_alive``, then a ``REJOIN`` request, answered with
  its rank's push counts, from which it numbers on); a worker not replaced within the timeout is dead for
  good, as above.

A worker that *left* (closed its store, or its process ended: the scheduler's
``Liveness.left``) is not dead: it will never push again, so in sync mode exactly the
waiting pulls whose rounds need a push of it fail, at once, naming it — and, when other
workers pushed the round, naming them as ahead (mismatched step counts), the key, the round and
the fix (:meth:`DeadWorkers.on_node_left`); rounds it pushed complete as usual.

In async mode nothing waits for a worker, so a death changes nothing here.

:class:`StallReport` logs, once per round, sync rounds that wait longer than the
stall limit, naming the key (a str key by its name, which INIT carries) and the workers
they wait for — the usual sign of a worker that hangs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from pskv.protocol import Role, node_id, node_name, node_role_rank
from pskv.server.part import Part
from pskv.server.part_init import named_key
from pskv.server.shard import ServerShard
from pskv.server.steps import mismatch_text

__all__ = ["DeadWorkers", "StallReport"]

log = logging.getLogger("pskv.server")


class DeadWorkers:
    """The workers a server gave up on, and those it waits for a replacement of.

    Args:
        shard: the shard whose waiting pulls a death fails.
        recovery_timeout: seconds to wait for a dead worker's replacement (0: none).
        name: the server's name, for the log.
    """

    def __init__(self, shard: ServerShard, recovery_timeout: float, name: Callable[[], str]) -> None:
        self._shard = shard
        self._timeout = recovery_timeout
        self._name = name
        self.dead: set[int] = set()  # node ids of workers dead for good (until replaced)
        self._recovering: dict[int, float] = {}  # dead workers that may be replaced -> when they died
        self.left: set[int] = set()  # node ids of workers that left the job (not dead)

    def __bool__(self) -> bool:
        """True if some worker is dead for good."""
        return bool(self.dead)

    def names(self) -> str:
        """The dead workers, comma-separated (the node a failed pull names); without any, those that left.

        Not both: workers that end after a death (their own calls failed) leave the job, and a pull
        failed by the death after that still names the dead worker alone, as its reason does."""
        return ", ".join(node_name(n) for n in sorted(self.dead or self.left))

    def reason(self) -> str:
        """Why a pull that waits for a round the dead workers block fails."""
        dead = ", ".join(node_name(n) for n in sorted(self.dead))
        return f"{dead} died, so the sync round this request waits for can never complete"

    def on_node_dead(self, nid: int) -> None:
        """Membership callback (reactor thread): fail waits that a dead worker makes impossible."""
        role, _ = node_role_rank(nid)
        if role is Role.WORKER and self._shard.sync and self._timeout > 0:
            # its rounds keep waiting: a replacement may take over (the stall report names it)
            self._recovering[nid] = time.monotonic()
            log.warning("%s: %s died; waiting up to %g s for a replacement", self._name(), node_name(nid),
                        self._timeout)
            return
        if role is Role.WORKER and self._shard.sync:
            self.dead.add(nid)
            failed = self._shard.fail_waiting(self.reason())
            if failed:
                log.error("%s: failed %d waiting pull(s): %s", self._name(), failed, self.reason())

    def on_node_left(self, nid: int) -> None:
        """Membership callback (reactor thread): worker ``nid`` left the job; fail the waits that need it."""
        role, _ = node_role_rank(nid)
        if role is not Role.WORKER or nid in self.left:
            return
        self.left.add(nid)
        if not self._shard.sync:
            return
        doomed = []
        for part in self._shard.parts.values():
            reach = self._reach(part, nid)
            fails = [w[2] for w in part.waiting if w[0] > reach and w[2] is not None]
            part.waiting = [w for w in part.waiting if not (w[0] > reach and w[2] is not None)]
            if reach <= part.round:  # a pull waiting for its sender's push: that joins an open round at least
                fails += [e[3] for e in part.early if e[3] is not None]
                part.early = [e for e in part.early if e[3] is None]
            if fails:
                doomed.append((self._left_reason(nid, part), fails))
        for reason, fails in doomed:
            for fail in fails:
                fail(reason)
        if doomed:
            log.warning("%s: failed %d waiting pull(s): %s %s", self._name(), sum(len(f) for _, f in doomed),
                        node_name(nid), doomed[0][0])

    def left_reason(self, waits: list[tuple[Part, int | None]]) -> str | None:
        """Why a pull of these ``(part, round)`` waits can never complete because a worker left (None: it can).

        A round of None (a push the pull names has not arrived yet) is at least the open round.
        """
        if not self.left or not self._shard.sync:
            return None
        for nid in sorted(self.left):
            for part, r in waits:
                if (part.round + 1 if r is None else r) > self._reach(part, nid):
                    return self._left_reason(nid, part)
        return None

    def _reach(self, part: Part, worker: int) -> int:
        """The last round of ``part`` that can complete without more pushes of ``worker``."""
        if worker in self._shard.joined:  # rounds go on without it
            return 1 << 62
        if worker in part.pushed:
            return part.round + 1 + len(part.queued.get(worker, ()))
        return part.round

    def _left_reason(self, nid: int, part: Part) -> str:
        """The text of the NodeFailedError naming ``nid``: "worker 1 failed: left the job (...)", and, when
        workers pushed ``part``'s open round, that they are ahead (mismatched step counts, the fix)."""
        text = (f"left the job (closed its store or ended its process: {node_name(nid)} will never push again), "
                "so the sync round this request waits for can never complete")
        if not part.pushed or nid in part.pushed:
            return text
        ahead = mismatch_text(sorted(part.pushed), [nid], self._shard.named(part.key), part.round + 1, "leaving the job")
        return f"{text}: {ahead}"

    def check_recovery(self) -> None:
        """Timer: dead workers not replaced within the recovery timeout fail the waits that need them."""
        limit = time.monotonic() - self._timeout
        for nid in [n for n, since in self._recovering.items() if since < limit]:
            del self._recovering[nid]
            self.dead.add(nid)
            failed = self._shard.fail_waiting(self.reason())
            log.error("%s: %s was not replaced in time; failed %d waiting pull(s)", self._name(), node_name(nid),
                      failed)

    def on_node_alive(self, nid: int) -> None:
        """Membership callback: a dead worker was replaced (its REJOIN does the rest)."""
        self._recovering.pop(nid, None)
        self.dead.discard(nid)

    def rejoined(self, worker: int) -> list[tuple[int, int, int]]:
        """A replacement process of ``worker`` rejoined: its rank's push counts (ServerShard.replaced)."""
        self._recovering.pop(worker, None)
        self.dead.discard(worker)
        counts = self._shard.replaced(worker)
        log.warning("%s: %s rejoined (a replacement process); %d of its part(s) had pushes", self._name(),
                    node_name(worker), len(counts))
        return counts


class StallReport:
    """Logs, once per round, sync rounds waiting longer than ``limit`` seconds.

    Args:
        shard: the shard whose rounds are watched.
        num_workers: the workers of the job.
        limit: seconds a round may wait before it is reported.
        name: the server's name, for the log.
        key_names: the names of str keys by server key (:attr:`ServerCore.key_names`).
    """

    def __init__(self, shard: ServerShard, num_workers: int, limit: float, name: Callable[[], str],
                 key_names: Mapping[int, str]) -> None:
        self._shard = shard
        self._key_names = key_names
        self._everyone = {node_id(Role.WORKER, r) for r in range(num_workers)}
        self._limit = limit
        self._name = name
        self._reported: set[tuple[int, int, int]] = set()  # (key, offset, round)

    def report(self) -> None:
        """Timer: log the rounds that newly passed the limit."""
        for part, rnd, pushed, age in self._shard.open_rounds(self._limit):
            if (part.key, part.offset, rnd) in self._reported:
                continue
            self._reported.add((part.key, part.offset, rnd))
            missing = ", ".join(node_name(n) for n in sorted(self._everyone - pushed))
            have = ", ".join(node_name(n) for n in sorted(pushed))
            log.warning("%s: round %d of key %s (offset %d) has waited %.0f s for %s (pushed: %s)",
                        self._name(), rnd, named_key(part.key, self._key_names), part.offset, age, missing, have)
