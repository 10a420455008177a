"""An elastic job's membership on a worker: the view it works in, stamped on every message it sends (issue 24).

In an elastic job (``pskv launch -n MIN:MAX``, :mod:`pskv.cluster.elastic`) a worker's node id names its
*slot*, a fixed identity; its *rank* is the slot's index in the membership view it adopted, and
``num_workers`` that view's size. :class:`WorkerView` holds the adopted view and is the only place they
change: at admission (:meth:`WorkerView.admitted`), at a commit whose release carries a new view, and at a
restore after :class:`~pskv.errors.MembershipChangedError` (:meth:`WorkerView.adopt`, called by
:mod:`pskv.kvstore.elastic`). Adopting a view

* stamps its epoch on every request to a server (``WorkerClient.view_epoch``, the header's ``epoch``: a
  server refuses an older one and holds a newer one until it has that view) and to the scheduler
  (:meth:`~pskv.cluster.Membership.adopt`, which also counts the meetings anew: they are per view);
* numbers every key's pushes from 0 again: each server cleared its push logs at the view, and a pull of
  push 0 reads the current value.

Every other job has no view: the epoch stays 0, sent as no header field at all, and none of this runs.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from pskv.cluster import NodeInfo
from pskv.cluster.elastic import COMMIT_MEETING, COMMITTED_MEETING
from pskv.errors import OperationTimeoutError, ProtocolError
from pskv.protocol import Command, Role, node_id, node_name, node_role_rank
from pskv.protocol.bodies import Commit, KeysRequest, KeyTable, View
from pskv.worker.layout import KeyLayout

if TYPE_CHECKING:
    from pskv.worker.client import WorkerClient

__all__ = ["COMMIT_MEETING", "COMMITTED_MEETING", "MAX_TABLE_PARTS", "View", "WorkerView"]

MAX_TABLE_PARTS = 1 << 24  # parts of one server a joining worker reads (KEYS pages): a server paging on is refused


class WorkerView:
    """The membership view one worker works in (an elastic job's; in any other job it stays empty).

    Args:
        client: the worker's connection (its epoch stamp, its membership, its servers).
    """

    def __init__(self, client: WorkerClient) -> None:
        self._client = client
        self.view: View | None = None  # the adopted view (None: not elastic, or not connected)
        self.slot = -1  # this worker's slot: its node id's rank, fixed for the process's life
        self.commit = 0  # the last commit this worker passed (0: the store's creation)
        self._newer = threading.Condition()  # notified when the scheduler tells of a newer view

    @property
    def epoch(self) -> int:
        """The adopted view's epoch (0: none)."""
        return self.view.epoch if self.view is not None else 0

    @property
    def rank(self) -> int:
        """This worker's rank in the adopted view (-1: it is no member, e.g. drained)."""
        return self.view.rank_of(self.slot) if self.view is not None else -1

    @property
    def num_workers(self) -> int:
        """The adopted view's size."""
        return len(self.view.members) if self.view is not None else 0

    def admitted(self, info: NodeInfo) -> NodeInfo:
        """The registration reply ``info``: in an elastic job the view this worker was admitted in is adopted
        (before any connection to a server opens: its HELLOs carry the epoch), and the returned info names
        the worker's rank in it (the scheduler's ``rank`` is the slot). Any other job's ``info`` is returned."""
        if info.view is None:
            return info
        self.slot = node_role_rank(info.node_id)[1]
        self.view, self.commit = info.view, info.view.commit
        self._client.view_epoch = info.view.epoch  # the membership adopted it as it registered
        return dataclasses.replace(info, rank=self.rank, num_workers=self.num_workers)

    @property
    def joiner(self) -> bool:
        """True if this worker joined a running job (admitted at a commit or a refill, not at the start)."""
        return self.view is not None and self.view.cause != "start"

    def arrived(self, view: View) -> None:
        """The membership heard of a newer view (reactor thread): wake a :meth:`newer` wait."""
        with self._newer:
            self._newer.notify_all()

    def newer(self, timeout: float) -> View:
        """The newest view the scheduler told of, once it is newer than the adopted one; asks for it at once.

        Raises:
            OperationTimeoutError: no newer view within ``timeout`` seconds.
        """
        membership = self._client.membership
        deadline = time.monotonic() + timeout
        membership.ask_view()
        with self._newer:
            while membership.view is None or membership.view.epoch <= self.epoch:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise OperationTimeoutError(f"restore: the scheduler told of no view newer than view "
                                                f"{self.epoch} within {timeout:g} s")
                self._newer.wait(min(remaining, 0.25))
        assert membership.view is not None
        return membership.view

    def adopt(self, view: View, layouts: Iterable[KeyLayout]) -> None:
        """Work in ``view`` from now on: its epoch on every request, its rank and size, its commit; the pushes
        of ``layouts`` numbered from 0 again (each server cleared its push logs at the view)."""
        self.view, self.commit = view, view.commit
        self._client.view_epoch = view.epoch
        self._client.membership.adopt(view)
        for rec in layouts:
            rec.pushes = [0] * len(rec.parts)
            rec.acks = []

    def send_commit(self, n: int, timeout: float) -> None:
        """Rank 0, between a commit's two meetings: every server snapshots its shard as commit ``n``.

        Raises:
            RemoteError: a server refused (CollectiveMismatchError there: an open round, a queued push).
            CollectiveMismatchError, MembershipChangedError, NodeFailedError, OperationTimeoutError.
        """
        client, body = self._client, Commit(self.epoch, n).encode()
        info = client.info
        pendings = [client.request(s, Command.COMMIT, body=body, what=f"commit {n}", timeout=timeout)
                    for s in range(info.num_servers if info is not None else 0)]
        for pending in pendings:
            pending.wait(timeout)

    def committed(self, n: int) -> View | None:
        """Commit ``n``'s release came: it is this worker's last commit. The newer view the scheduler told of
        (the release's, or a departure's right after it: either starts from this commit), if any."""
        self.commit = n
        view = self._client.membership.view
        return view if view is not None and view.epoch > self.epoch else None

    def key_table(self, timeout: float) -> dict[tuple[int, int], tuple[str, int]]:
        """Every part the servers hold (``KEYS``, page by page): (server key, offset) -> (dtype, size)."""
        client, info = self._client, self._client.info
        table: dict[tuple[int, int], tuple[str, int]] = {}
        for server in range(info.num_servers if info is not None else 0):
            start = 0
            while True:
                page = KeyTable.parse(client.request(server, Command.KEYS, body=KeysRequest(start).encode(),
                                                     what="keys", timeout=timeout).wait(timeout))
                table.update(((p.key, p.offset), (p.dtype, p.size)) for p in page.parts)
                if not page.next:
                    break
                start = _next_page(server, start, page)
        return table


def _next_page(server: int, start: int, page: KeyTable) -> int:
    """Where the KEYS page after ``page`` (asked from ``start``) of ``server`` starts: right after its parts.

    Raises:
        ProtocolError: ``next`` is not that (a server that would page forever or back), or the table
            runs past :data:`MAX_TABLE_PARTS`.
    """
    follow = start + len(page.parts)
    if page.next != follow or follow <= start or follow >= MAX_TABLE_PARTS:
        raise ProtocolError(f"KEYS reply of {node_name(node_id(Role.SERVER, server))}: the page from part {start} "
                            f"lists {len(page.parts)} part(s) but says the next starts at {page.next} (must be "
                            f"{follow}, past {start}, and a server holds fewer than {MAX_TABLE_PARTS} parts)")
    return follow
