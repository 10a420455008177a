"""How a reactor waits (:mod:`pskv.transport.reactor`): its poll set, its wake-up pipe and its timers.

* :class:`Poller` — a ``zmq.Poller`` that also keeps a plain ``select.poll`` of the same
  descriptors plus each ZeroMQ socket's mailbox descriptor (``ZMQ_FD``). ``zmq_poll`` asks
  every ZeroMQ socket for its events after each wait: two system calls per socket and turn
  (a server with three ZeroMQ sockets and the inproc wake socket made 29 system calls per
  4 KB push + pull, about 19 of them these). A ZeroMQ socket whose input was drained, and
  which nothing used since, can only get news through its mailbox descriptor, so while
  every socket is so *settled* the reactor waits with one ``poll`` of the plain set
  (:meth:`Poller.quick_wait`); when a mailbox has news it asks them all. What settles and
  unsettles the sockets is the reactor's to say (it reads and sends on them).
* :class:`WakePipe` — other threads interrupt the reactor's wait through a pipe, a plain
  descriptor (an inproc ZeroMQ socket in the poll set would cost its two calls each turn).
* :class:`Timers` — callbacks run every so often on the reactor thread; they bound the wait.
"""

from __future__ import annotations

import math
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

__all__ = ["Poller", "Timers", "WakePipe"]

# Plain ints: combining pyzmq's enum flags runs Python-level enum code.
_POLLIN, _POLLOUT, _POLLERR = int(zmq.POLLIN), int(zmq.POLLOUT), int(zmq.POLLERR)
_ZMQ_FLAGS = {select.POLLIN: _POLLIN, select.POLLOUT: _POLLOUT, select.POLLIN | select.POLLOUT: _POLLIN | _POLLOUT}


class Poller(zmq.Poller):
    """A ``zmq.Poller`` whose descriptors and ZeroMQ mailboxes are also in a plain ``select.poll``.

    :attr:`changed` is set whenever a ZeroMQ socket joins or leaves (the reactor then makes a
    full turn before it waits quick again).
    """

    def __init__(self) -> None:
        super().__init__()
        self._quick = select.poll()
        self.mailboxes: set[int] = set()  # the ZMQ_FD of every ZeroMQ socket registered
        self.changed = True  # a ZeroMQ socket joined or left since the last full turn

    def register(self, socket: Any, flags: int = zmq.POLLIN | zmq.POLLOUT) -> None:
        super().register(socket, flags)
        self._mirror(socket)

    def unregister(self, socket: Any) -> None:
        super().unregister(socket)
        self._mirror(socket)

    def _mirror(self, socket: Any) -> None:
        """Make the quick poll watch ``socket`` as this poller does (or not at all)."""
        zmq_socket = isinstance(socket, zmq.Socket)
        fd = socket if isinstance(socket, int) else socket.fileno()  # a ZeroMQ socket's: ZMQ_FD
        index = self._map.get(socket)
        if zmq_socket:
            self.changed = True
            if index is None:
                self.mailboxes.discard(fd)
            else:
                self.mailboxes.add(fd)
        if index is None:
            try:
                self._quick.unregister(fd)
            except KeyError:
                pass
            return
        flags = self.sockets[index][1]
        self._quick.register(fd, select.POLLIN if zmq_socket else
                             (select.POLLIN if flags & _POLLIN else 0) | (select.POLLOUT if flags & _POLLOUT else 0))

    def quick_wait(self, timeout_ms: int) -> dict[Any, int] | None:
        """One ``poll`` of the plain set: the ready descriptors with their events as ``zmq_poll`` reports
        them (errors and hang-ups: POLLERR); None if a ZeroMQ socket's mailbox has news (ask them all)."""
        events: dict[Any, int] = {}
        mailboxes = self.mailboxes
        for fd, revents in self._quick.poll(timeout_ms):
            if fd in mailboxes:
                return None
            events[fd] = _ZMQ_FLAGS.get(revents) or _zmq_flags(revents)
        return events


def _zmq_flags(revents: int) -> int:
    """``select.poll``'s events of a descriptor as ``zmq_poll`` reports them."""
    flags = _POLLIN if revents & select.POLLIN else 0
    if revents & select.POLLOUT:
        flags |= _POLLOUT
    if revents & ~(select.POLLIN | select.POLLOUT):
        flags |= _POLLERR
    return flags


class WakePipe:
    """A non-blocking pipe: :meth:`wake` from any thread makes :attr:`fd` readable until :meth:`drain`."""

    def __init__(self) -> None:
        self.fd, self._out = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._out, False)
        self._lock = threading.Lock()  # a write never races the close (the number could be reused)

    def wake(self) -> None:
        """Make :attr:`fd` readable. Never blocks, never raises: a full pipe means wake-ups are pending
        (a blocking wake-up once deadlocked a reactor's stop against its closing thread); closed: nothing."""
        with self._lock:
            if self._out < 0:
                return
            try:
                os.write(self._out, b"\0")
            except BlockingIOError:
                pass

    def drain(self) -> None:
        """Take the pending wake-ups (more than one read holds leave :attr:`fd` readable: the next turn)."""
        try:
            os.read(self.fd, 4096)
        except BlockingIOError:
            pass

    def close(self) -> None:
        """Close both ends (idempotent); later wake-ups do nothing."""
        with self._lock:
            if self._out >= 0:
                os.close(self._out)
                os.close(self.fd)
                self._out = -1


class Timers:
    """Callbacks to run every so often (on the reactor thread: add before it starts, or on it)."""

    def __init__(self) -> None:
        self._timers: list[tuple[float, float, Callable[[], None]]] = []
        self._next = math.inf  # when the first timer is due: a turn before it only computes the wait

    def add(self, interval: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` every ``interval`` seconds, first ``interval`` seconds from now."""
        due = time.monotonic() + interval
        self._timers.append((due, interval, callback))
        self._next = min(self._next, due)

    def run_due(self) -> int:
        """Run the callbacks that are due; the milliseconds until the next one (at most 100)."""
        wait = self._next - time.monotonic()
        if wait > 0:  # nothing due (every turn but a few): no pass over the timers
            return 100 if wait >= 0.1 else math.ceil(wait * 1000)
        if not self._timers:
            return 100
        now = time.monotonic()
        nearest = now + 0.1
        for i, (due, interval, callback) in enumerate(self._timers):
            if due <= now:
                callback()
                due = now + interval
                self._timers[i] = (due, interval, callback)
            nearest = min(nearest, due)
        self._next = min(due for due, _, _ in self._timers)
        return max(0, math.ceil((nearest - time.monotonic()) * 1000))  # rounded down, the last ms polls in a spin
