"""How many messages of one call a worker keeps unanswered per server: a credit window between hosts.

Between hosts a big value's call is many messages per server (its partitions,
:mod:`pskv.partition`), and each server answers a partition only once every worker's piece
of it has come. Written all at once, the messages of W workers reach each server's link as
W flows that TCP does not share evenly: measured at W = 8 (100 Mbit/s links, one 16 MiB key),
the last of a partition's 8 pieces came 356 ms after the first (median; 948 ms at the 90th
percentile), and every reply waited for the slowest flow, so the replies came down the
workers' links late and one way at a time (docs/benchmarks.md, *Setup c*).

A :class:`CallPacer` keeps at most ``window`` messages of the call unanswered per server
(``PSKV_CALL_WINDOW``, :attr:`pskv.config.ClusterConfig.call_window`) and sends the next as
each reply comes — BytePS's credit-based scheduling, per call. A flow that gets ahead waits
for the slow ones' pieces, so its worker's link carries the laggards meanwhile, and the
servers reply while later partitions still go up.

Only calls that cannot wait on each other are paced, so a window never stalls a job:

* one key per call: every worker sends a key's partitions to each server in the same order
  (:func:`pskv.worker.layout.by_server`), so the oldest round a server lacks always has
  every missing piece on its way (a piece is held only behind older ones of the same
  call, and those are answered once their rounds complete). Calls of several keys keep
  the caller's order of the keys, which workers need not share: they are not paced;
* answered messages only: a quiet push (answered only if it fails) would never free its
  place;
* each call has its own window: two calls never wait on each other's credit.

* no calls while the servers run an optimizer (:meth:`Pacing.off`, on every worker's
  ``set_optimizer`` and ``load_optimizer_states``, and in a job resumed from a checkpoint):
  a server then updates a key's pieces together and answers none before it has them all.

Should a server still answer none of a call's messages for :data:`ESCAPE` s while others
wait here, they all go (a safety net: a call is never held up for good by its window).

A held message's request exists from the start (its timeout runs from then); it is sent
from the thread that completes the reply before it. One that failed meanwhile (its server
died, it timed out) is not sent and frees its place at once.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from pskv.cluster.requests import Pending

if TYPE_CHECKING:
    from pskv.worker.client import WorkerClient
    from pskv.worker.layout import KeyLayout, Message
    from pskv.worker.requests import WorkerRequest

__all__ = ["ESCAPE", "CallPacer", "Pacing"]

ESCAPE = 1.0  # seconds without an answer from a server while a call's messages wait: they all go
TICK = 0.25  # how often the network thread looks for such calls (seconds)


class Pacing:
    """A worker's window for its calls (``WorkerClient.pacing``): which calls get one, and the safety net.

    Args:
        client: the worker's client.
        window: the most unanswered messages of a call per server (0: no pacing).
    """

    def __init__(self, client: WorkerClient, window: int) -> None:
        self._client = client
        self.window = window
        self._lock = threading.Lock()
        self._waiting: weakref.WeakSet[CallPacer] = weakref.WeakSet()  # calls holding messages
        self._ticking = False

    def off(self) -> None:
        """The servers run an optimizer: no call is paced from now on (see the module's notes)."""
        self.window = 0

    def requester(self, layouts: Sequence[KeyLayout], messages: Sequence[Message],
                  quiet: bool) -> Callable[..., WorkerRequest]:
        """What sends the socket messages of a call: ``client.request``, or a new :class:`CallPacer`'s
        :meth:`~CallPacer.request` for a call the window applies to (one key, answered messages,
        more than the window of them to some server)."""
        window = self.window
        if not window or quiet or len(layouts) != 1:
            return self._client.request
        counts: dict[int, int] = {}
        for server, shared, _ in messages:
            if not shared:
                counts[server] = counts.get(server, 0) + 1
        if max(counts.values(), default=0) <= window:
            return self._client.request
        return CallPacer(self._client, window, self._holding).request

    def _holding(self, pacer: CallPacer) -> None:
        """``pacer`` holds messages: watch it from the network thread."""
        with self._lock:
            self._waiting.add(pacer)
            if self._ticking:
                return
            self._ticking = True
        reactor = self._client._reactor
        reactor.call_soon(partial(reactor.add_timer, TICK, self._tick))

    def _tick(self) -> None:
        with self._lock:
            waiting = list(self._waiting)
        before = time.monotonic() - ESCAPE
        for pacer in waiting:
            pacer.escape(before)
        with self._lock:  # a pacer that holds one again meanwhile is added again after it holds it
            for pacer in waiting:
                if not pacer.holds():
                    self._waiting.discard(pacer)


class CallPacer:
    """The socket messages of one call, at most ``window`` of them unanswered per server.

    Args:
        client: the worker's client (:meth:`~pskv.worker.client.WorkerClient.prepare`,
            :meth:`~pskv.worker.client.WorkerClient.submit`).
        window: the most unanswered messages per server.
        holding: told each time the pacer holds a message.
    """

    __slots__ = ("_client", "_window", "_holding", "_lock", "_flying", "_held", "_moved", "__weakref__")

    def __init__(self, client: WorkerClient, window: int, holding: Callable[[CallPacer], None]) -> None:
        self._client = client
        self._window = window
        self._holding = holding
        self._lock = threading.Lock()
        self._flying: dict[int, int] = {}  # server rank -> messages sent and not answered
        self._held: dict[int, deque[tuple[int, WorkerRequest]]] = {}  # server rank -> (priority, request) in order
        self._moved: dict[int, float] = {}  # server rank -> when a message to it was last sent or answered

    def request(self, server: int, command: Any, arrays: tuple[Any, ...] = (), data: list[Any] | None = None,
                body: str = "", priority: int = 0, timeout: float | None = None, quiet: bool = False,
                flags: int = 0) -> WorkerRequest:
        """As :meth:`WorkerClient.request <pskv.worker.client.WorkerClient.request>`; the message
        waits here while ``window`` of the call's messages to ``server`` are unanswered."""
        pending = self._client.prepare(server, command, arrays, data, body, priority, timeout=timeout,
                                       quiet=quiet, flags=flags)
        with self._lock:
            flying = self._flying.get(server, 0)
            held = flying >= self._window
            if held:
                self._held.setdefault(server, deque()).append((priority, pending))
            else:
                self._flying[server] = flying + 1
                self._moved[server] = time.monotonic()
        if held:
            self._holding(self)  # watched while it holds any (again after a tick found none)
        else:
            self._send(server, priority, pending)
        return pending

    def holds(self) -> bool:
        """True while some message waits here."""
        with self._lock:
            return any(self._held.values())

    def escape(self, before: float) -> None:
        """Send every held message to a server that answered nothing since ``before``."""
        for server in list(self._held):
            with self._lock:
                held = self._held[server]
                if not held or self._moved[server] > before:
                    continue
                out = list(held)
                held.clear()
                self._flying[server] += len(out)
                self._moved[server] = time.monotonic()
            for priority, pending in out:
                if not pending.done():
                    self._send(server, priority, pending)

    def _send(self, server: int, priority: int, pending: WorkerRequest) -> None:
        pending.add_done_callback(partial(self._answered, server))
        self._client.submit(server, priority, pending)

    def _answered(self, server: int, _done: Pending) -> None:
        """A message to ``server`` was answered (or failed): send its next held one that can still be."""
        while True:
            with self._lock:
                self._moved[server] = time.monotonic()
                held = self._held.get(server)
                if not held:
                    self._flying[server] -= 1
                    return
                priority, pending = held.popleft()
            if not pending.done():
                self._send(server, priority, pending)
                return
