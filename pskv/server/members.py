"""An elastic job's membership view on one server: whom it serves and waits for, and stale epochs refused. No I/O.

Every message of an elastic job carries its sender's view epoch (``Header.epoch``; 0, not sent, in
every other job). A server in view ``e`` (:class:`ViewMembers`):

* refuses a message of an older epoch with :class:`~pskv.errors.MembershipChangedError`: it belongs to
  work a view change voided, or to a worker that has not restored yet (:meth:`ViewMembers.stale`);
* holds a message of a newer epoch (bounded) and asks for the view at once (``ask_view``: a heartbeat
  sent now): the sender got the view first; the message is handled again once the view came
  (:meth:`ViewMembers.adopt` hands it back);
* serves the view's members (:attr:`ViewMembers.members`), and its sync rounds wait for them
  (``ServerShard.num_workers``).

A view comes with the scheduler's heartbeat replies (:meth:`ViewMembers.adopt`). One that voids the
work since its commit (a departure: ``View.voids``) rolls the shard back to that commit
(:meth:`~pskv.server.commits.CommitSnapshots.rollback`); one a commit's release made (joins, drains)
promotes that commit's snapshot. Either way every push number starts over (the workers start their
numbering at 0 in each view, and a pull of push 0 reads the current value) and the uneven-data
``joined`` marks are cleared. What lies outside the shard (the step marks, the reply cache, the
stall report's workers) is the caller's to reset with the view.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from pskv.errors import InvalidArgumentError, MembershipChangedError
from pskv.protocol import Header, Role, node_id
from pskv.protocol.bodies import View
from pskv.server.shard import ServerShard

__all__ = ["Commits", "ViewMembers"]

Held = tuple[bytes, list[bytes]]  # (identity, frames) of a message to handle again


class Commits(Protocol):
    """What a view does to the commit snapshots (:class:`~pskv.server.commits.CommitSnapshots`, ``NoCommits``)."""

    @property
    def commit(self) -> int: ...

    def promote(self, n: int) -> None: ...

    def rollback(self, detail: str, epoch: int = 0, slot: int = -1) -> int: ...


class ViewMembers:
    """The view one server is in: its members, its epoch, and the messages of newer epochs held for it.

    Args:
        shard: the shard whose rounds wait for the members.
        commits: the shard's commit snapshots.
        workers: the workers' node ids before any view (a job that is not elastic: all of them, for good).
        ask_view: asks the scheduler for the current view now (None: the job is not elastic).
        limit: messages of newer epochs held at most (a joiner's connections open one at a time).
    """

    def __init__(self, shard: ServerShard, commits: Commits, workers: tuple[int, ...],
                 ask_view: Callable[[], None] | None = None, limit: int = 64) -> None:
        self._shard = shard
        self._commits = commits
        self._ask_view = ask_view
        self._limit = limit
        self.epoch = 0  # 0: no view yet (or not elastic): messages carry epoch 0
        self.view: View | None = None
        self.workers = workers  # node ids, in rank order
        self.members = frozenset(workers)  # the senders this server serves
        self._held: list[tuple[int, Held]] = []  # (epoch, message): newer than this server's view
        self._asked = 0  # the newest epoch asked for

    def stale(self, identity: bytes, header: Header, frames: list[Any]) -> bool:
        """A message whose epoch is not this server's (the caller tests ``header.epoch != epoch`` first).

        Returns:
            True: held until the view of its epoch comes (:meth:`adopt` hands it back).

        Raises:
            MembershipChangedError: it is of an older view (its work was voided, or its sender must restore),
                or too many messages wait for views this server does not have yet.
            InvalidArgumentError: the job is not elastic, and the message names a view.
        """
        if self._ask_view is None:
            raise InvalidArgumentError(f"a message of view {header.epoch}: this job is not elastic")
        if header.epoch < self.epoch:
            raise MembershipChangedError(f"a request of view {header.epoch} reached a server in view {self.epoch}",
                                         self.epoch)
        if len(self._held) >= self._limit:
            raise MembershipChangedError(f"view {header.epoch} has not reached this server yet and "
                                         f"{len(self._held)} messages wait for it", header.epoch)
        self._held.append((header.epoch, (identity, [bytes(memoryview(f).cast("B")) for f in frames])))
        if header.epoch > self._asked:
            self._asked = header.epoch
            self._ask_view()
        return True

    def adopt(self, view: View) -> list[Held]:
        """The scheduler's view ``view``: roll back (or promote its commit), serve and wait for its members.

        An older or the same epoch is ignored.

        Returns:
            The held messages of epochs up to the view's, in arrival order, to handle again.

        Raises:
            InvalidArgumentError: the view names a commit this server did not take.
        """
        if view.epoch <= self.epoch:
            return []
        commits = self._commits
        if view.commit != commits.commit:
            commits.promote(view.commit)  # its release came (the view names it): the commit to roll back to
        if view.voids:
            commits.rollback(f"view {view.epoch} ({view.cause}) goes back to commit {view.commit}", view.epoch)
        self.epoch, self.view = view.epoch, view
        self.workers = tuple(node_id(Role.WORKER, slot) for slot in view.members)
        self.members = frozenset(self.workers)
        shard = self._shard
        shard.num_workers = len(view.members)
        shard.joined.clear()
        for part in shard.parts.values():
            part.pushes.clear()  # every member numbers its pushes from 0 in the new view
        ready = [message for epoch, message in self._held if epoch <= view.epoch]
        self._held = [(epoch, message) for epoch, message in self._held if epoch > view.epoch]
        return ready

    def rank(self, worker: int) -> int:
        """``worker``'s (node id's) rank in the view; -1 if it is not a member."""
        return self.workers.index(worker) if worker in self.members else -1
