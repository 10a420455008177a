"""Folding a small non-blocking push into the pull behind it: one ``PUSHPULL`` instead of ``PUSH`` + ``PULL``.

A training loop's ``push(key, grad, block=False)`` followed by ``pull(key)`` sends, per
server, a quiet ``PUSH`` and a ``PULL`` that names "the round of that push": two messages
to decode, dispatch and check on the server, for one reply. :class:`HeldPushes` holds such a
push back for a moment instead of sending it: if a pull of exactly the same parts (same
server, same message) comes first, both travel as one ``PUSHPULL`` — the push's specs and
data, answered with the values of the round it joined, which is what that pull asks for.
So a small push + pull costs what a ``pushpull`` costs: one message each way.

What is held, and when it goes anyway:

* only quiet (``block=False``) pushes of a synchronous store of at most :data:`FOLD_BYTES`, not
  compressed, and only while the client's network thread runs (an in-process client has
  none to send it later);
* the held message is sent as the quiet ``PUSH`` it was by the network thread, which looks
  every :data:`FOLD_TICK` s for pushes held longer than :data:`FOLD_WAIT` (a timer started
  by the first hold: a wake-up per push would cost the worker more than the fold saves the
  server — a pipe write, a turn of that thread and the GIL handed back and forth); or before
  any other request to its server leaves
  (:meth:`HeldPushes.release`, called by the client's send path), so nothing else to that
  server — a ``SYNC`` confirming quiet pushes, a barrier's mark, another key's push or
  pull — overtakes it; a second held push to that server sends the first.

The push is numbered and its shared-memory slot written when it is held, as if sent;
folded, its request becomes the pull's too (one reply completes both calls: the push's
handle and the pull's values), answered rather than quiet and bounded by the pull's
timeout; a refused push fails the pull with it (the server names the key, in a ``pushpull``),
where unfolded the pull would fail with the round it voided. It is kept in the replay log (``PSKV_SERVER_RECOVERY``) as what it was sent as, a
``PUSH`` or a ``PUSHPULL``, so a replacement server gets it again in that form; a server
answers a repeated one (a reset connection) without applying it twice, as any push.
"""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from pskv.protocol import ArraySpec, Command, Flag, Header, Role, encode, node_id
from pskv.worker.layout import by_server, part_spec
from pskv.worker.shared import write_slots

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pskv.worker.client import WorkerClient, WorkerRequest
    from pskv.worker.layout import KeyLayout, Part
    from pskv.worker.replay import ReplayLog

__all__ = ["FOLD_BYTES", "FOLD_TICK", "FOLD_WAIT", "HeldPushes"]

#: A quiet push of at most this many bytes of values (the whole call) may be held for a pull.
#: Above it the per-message cost the fold saves is small against the bytes' own.
FOLD_BYTES = 64 << 10

#: Seconds a held push waits for its pull before the network thread may send it, and how often
#: that thread looks (so a push no pull follows leaves within about ``FOLD_TICK + FOLD_WAIT``).
FOLD_WAIT = 0.002
FOLD_TICK = 0.01


class _Held:
    """One quiet push message not sent yet."""

    __slots__ = ("pending", "specs", "data", "flags", "priority", "items", "since")

    def __init__(self, pending: WorkerRequest, specs: tuple[ArraySpec, ...], data: list[Any], flags: int,
                 priority: int, items: list[Part]) -> None:
        self.pending = pending
        self.specs = specs
        self.data = data
        self.flags = flags
        self.priority = priority
        self.items = items
        self.since = time.monotonic()


class HeldPushes:
    """The quiet push messages a :class:`~pskv.worker.client.WorkerClient` holds for a pull, per server rank.

    ``held`` is empty unless a push waits (the client's send path tests it, nothing more).
    ``replay``: the worker's push log (``PSKV_SERVER_RECOVERY``), set by its owner.
    """

    def __init__(self, client: WorkerClient) -> None:
        self._client = client
        self.held: dict[int, _Held] = {}
        self.replay: ReplayLog | None = None
        self.folded = 0  # pushes that left with a pull (tests count them)
        self._lock = threading.Lock()
        self._ticking = False  # the network thread's timer (_send_stale) runs

    def hold(self, server: int, specs: tuple[ArraySpec, ...], data: list[Any], flags: int, priority: int,
             items: list[Part]) -> WorkerRequest:
        """A quiet push of ``items`` to ``server`` (rank), not sent yet: its pending reply.

        ``data``: its frames (none through shared memory), unchanged until it is answered.
        """
        client = self._client
        pending = client.tracker.new(node_id(Role.SERVER, server), "push")
        pending.quiet = True
        pending.local = client if client._local_conn(server) is not None else None
        with self._lock:  # one held message per server: an earlier one goes now, ahead of this one
            earlier = self.held.get(server)
            self.held[server] = _Held(pending, specs, data, flags, priority, items)
        if earlier is not None:
            self._send(server, earlier, Command.PUSH, earlier.flags | Flag.QUIET, earlier.priority)
        if not self._ticking:  # the first hold: from now on the network thread looks for stale ones
            self._ticking = True
            client._reactor.call_soon(partial(client._reactor.add_timer, FOLD_TICK, self._send_stale))
        return pending

    def hold_alone(self, layouts: Sequence[KeyLayout], priority: int, max_bytes: int,
                   rank: int) -> tuple[list[Part], WorkerRequest] | None:
        """The held push of ``layouts`` if it is one uncompressed key of one part in shared memory — a training
        loop's push — in fewer steps than the general send path (which holds it alike): its parts and pending
        reply; None for any other push. ``max_bytes``, ``rank``: the worker's message grouping (by_server)."""
        rec = layouts[0]
        if len(layouts) != 1 or rec.compress or len(rec.parts) != 1 or not rec.shm or rec.shm[0] is None:
            return None
        ((server, _, items),) = by_server(layouts, True, max_bytes, rank)  # the same list as its pull's: _same
        write_slots(items)
        pending = self.hold(server, (part_spec(rec, 0, rec.pushes[0] + 1),), [], Flag.SHM, priority, items)
        rec.pushes[0] += 1
        return items, pending

    def _send_stale(self) -> None:
        """On the network thread, every :data:`FOLD_TICK` s: send the pushes no pull took within :data:`FOLD_WAIT` s."""
        if not self.held:
            return
        stale = time.monotonic() - FOLD_WAIT
        for server, held in list(self.held.items()):
            if held.since <= stale:
                self.release(server, held.pending)

    def release(self, server: int, pending: WorkerRequest | None = None) -> None:
        """Send ``server``'s held push (only if it is ``pending``'s, when given) as the quiet ``PUSH`` it is."""
        with self._lock:
            held = self.held.get(server)
            if held is None or (pending is not None and held.pending is not pending):
                return
            del self.held[server]
        self._send(server, held, Command.PUSH, held.flags | Flag.QUIET, held.priority)

    def fold(self, server: int, items: list[Part], priority: int, timeout: float) -> WorkerRequest | None:
        """Send ``server``'s held push with a pull of ``items`` as one ``PUSHPULL``; None: none held for them.

        The pull's values are those of the round the push joins: the reply answers both.
        """
        with self._lock:
            held = self.held.get(server)
            if held is None or not _same(held.items, items):
                return None
            del self.held[server]
        self.folded += 1
        pending = held.pending
        pending.quiet = False  # answered now: nothing to confirm, and a timeout as the pull's
        pending.what = "pushpull"
        pending.timeout = timeout
        pending.deadline = time.monotonic() + timeout
        self._send(server, held, Command.PUSHPULL, held.flags, max(priority, held.priority))
        return pending

    def _send(self, server: int, held: _Held, command: Command, flags: int, priority: int) -> None:
        client, pending = self._client, held.pending
        frames = encode(Header(command, pending.request, client.node_id, held.specs, priority, "", flags), held.data)
        pending.frames = frames  # sent again after a reset connection
        if self.replay is not None and not flags & Flag.SHM:  # kept until the next checkpoint (answered if replayed)
            self.replay.record(server, command, pending, held.specs, held.data, held.flags)
        client.enqueue(-priority, server, frames, pending)  # not client._queue_and_send: that sends held pushes first


def _same(held: list[Part], items: list[Part]) -> bool:
    """True if ``items`` are the parts of ``held`` (a single key's messages are the same list)."""
    if held is items:
        return True
    return len(held) == len(items) and all(a is c and b == d for (a, b), (c, d) in zip(held, items))
