"""Repeated requests: what a server answers when a worker sends a request again. No I/O.

A worker resends every unanswered request when a reset connection comes back; some of
them had arrived. The server remembers the recent request ids of each socket requests
come from (``SEEN_PER_SOCKET`` of them; a socket belongs to one process, so a
replacement process starts afresh) — of a bounded number of sockets, the least recently
used forgotten first — and for each what a repeat gets:

* a request still being answered (a parked pull, a quiet push): the repeat is dropped;
* a request answered with a short reply (acknowledgement, error): the same frames again;
* an answered pushpull: its values gathered again for the rounds its pushes joined,
  without applying the pushes twice;
* an answered pull: simply served again (as a new request).

:class:`ReplyCache` holds that record; the node asks it about every request before
handling it (:meth:`ReplyCache.begin`) and does what it says.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, TypeAlias

from pskv.server.shard import Part

__all__ = ["ReplyCache", "Repeat", "Dropped", "Resend", "Regather", "DROPPED", "SEEN_PER_SOCKET"]

SEEN_PER_SOCKET = 8192  # request ids remembered per socket, for repeats after a reset connection


class Dropped:
    """A repeat of a request still being answered: ignore it."""

    __slots__ = ()


DROPPED: Final = Dropped()


@dataclass(frozen=True, slots=True)
class Resend:
    """A repeat of a request answered with a short reply: send ``frames`` again."""

    frames: list[Any]


@dataclass(frozen=True, slots=True)
class Regather:
    """A repeat of an answered pushpull: reply with ``parts``' values again (rounds included)."""

    parts: list[tuple[Part, int]]
    shared: bool


Repeat: TypeAlias = Dropped | Resend | Regather

_IN_FLIGHT: Final = object()  # a request being handled (or a quiet push: answered only if it failed)
_PULL: Final = object()  # an answered pull: a repeat is served again
Seen: TypeAlias = "OrderedDict[int, Any]"  # request id -> _IN_FLIGHT, _PULL, short reply frames, or Regather


class ReplyCache:
    """Per socket, the recent request ids and what a repeat of each gets.

    Used on the node's reactor thread only, one request at a time: :meth:`begin`,
    then the handler's reply (:meth:`answered`) or deferred reply (:meth:`later`),
    then :meth:`end`.

    Args:
        sockets: the sockets whose windows are kept; past it the least recently used
            one's is forgotten (a repeat from it is then handled as a new request).
    """

    def __init__(self, sockets: int = 1024) -> None:
        self._sockets = max(1, sockets)
        self._seen: OrderedDict[bytes, Seen] = OrderedDict()
        self._current: tuple[Seen, int] | None = None  # the request being handled

    def __len__(self) -> int:
        """The sockets whose request ids are remembered."""
        return len(self._seen)

    def remembered(self) -> int:
        """Request ids remembered, over every socket."""
        return sum(len(seen) for seen in self._seen.values())

    def begin(self, origin: bytes, request: int) -> Repeat | None:
        """None for a request to handle (new, or a pull to serve again); else what its repeat gets.

        Args:
            origin: the socket the request came from.
            request: its request id.
        """
        seen = self._seen.get(origin)
        if seen is None:
            seen = self._seen[origin] = OrderedDict()
            if len(self._seen) > self._sockets:
                self._seen.popitem(last=False)
        else:
            self._seen.move_to_end(origin)
        state = seen.get(request)
        if state is None:
            seen[request] = _IN_FLIGHT
            if len(seen) > SEEN_PER_SOCKET:
                seen.popitem(last=False)
            self._current = (seen, request)
            return None
        if state is _IN_FLIGHT:
            return DROPPED
        if type(state) is list:
            return Resend(state)
        if isinstance(state, Regather):
            return state
        self._current = (seen, request)  # a pull: served again
        seen[request] = _IN_FLIGHT
        return None

    def answered(self, frames: list[Any]) -> None:
        """The request being handled was answered with ``frames`` (kept for a repeat if short)."""
        if self._current is not None and len(frames) == 1:
            seen, request = self._current
            seen[request] = frames

    def later(self, parts: list[tuple[Part, int]] | None = None, shared: bool = False) -> Callable[[], None] | None:
        """The request being handled will be answered later, with values: call the result once it is.

        Args:
            parts: a pushpull's parts with the rounds its pushes joined (a repeat gets
                their values again); None for a pull (a repeat is served again).
            shared: the reply names shared-memory buffers instead of carrying values.

        Returns None when no request is being recorded (a repeat being answered).
        """
        if self._current is None:
            return None
        seen, request = self._current
        self._current = None
        return partial(seen.__setitem__, request, _PULL if parts is None else Regather(list(parts), shared))

    def end(self) -> None:
        """The request being handled is done with (its answer recorded, or to come through :meth:`later`)."""
        self._current = None
