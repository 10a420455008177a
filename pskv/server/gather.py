"""One pull or pushpull reply, assembled as its parts complete their rounds.

A request names several parts; each completes its round on its own time (the shard
calls :meth:`Gather.ready` for each). The reply goes out once, when the last part is
ready — or an error, the first time the shard fails one of them (:meth:`Gather.fail`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pskv.protocol import ArraySpec, Flag, Header
from pskv.protocol.replies import error_frames, reply_frames
from pskv.server.shard import Part

__all__ = ["Gather"]

Answer = Callable[[bytes, list[Any]], None]  # (identity, frames): send a reply with values


class Refused(str):
    """Why a round cannot complete when nobody died: a push refused for its shape or dtype.

    A ``str`` (what a pull's ``fail`` callback takes) that carries the error's class name.
    """

    kind: str

    def __new__(cls, text: str, kind: str) -> Refused:
        self = super().__new__(cls, text)
        self.kind = kind
        return self


class Gather:
    """Collects the parts of one pull / pushpull and sends one reply (or one error).

    Args:
        answer: sends the reply (after the reply to the message being handled).
        node_id: this server's node id (the replies' sender).
        dead_names: the dead workers' names, for a failure.
        identity: where the reply goes.
        header: the request.
        n: the number of parts.
        snapshot: reply with snapshots of the values (an updater changes them in place).
        shared: reply with shared-buffer indices instead of data.
        on_answered: called just before the reply (or error) is sent (see ReplyCache.later).
    """

    __slots__ = ("_answer", "_node_id", "_dead_names", "_identity", "_results", "_remaining", "_header",
                 "_snapshot", "_shared", "_done", "_on_answered")

    def __init__(self, answer: Answer, node_id: Callable[[], int], dead_names: Callable[[], str], identity: bytes,
                 header: Header, n: int, snapshot: bool, shared: bool = False,
                 on_answered: Callable[[], None] | None = None) -> None:
        self._answer = answer
        self._node_id = node_id
        self._dead_names = dead_names
        self._identity = identity
        self._shared = shared
        self._results: list[Part | None] = [None] * n
        self._remaining = n
        self._header = header
        self._snapshot = snapshot
        self._done = False
        self._on_answered = on_answered

    def _send(self, frames: list[Any]) -> None:
        if self._on_answered is not None:
            self._on_answered()
        self._answer(self._identity, frames)

    def ready(self, i: int, part: Part) -> None:
        """Part ``i`` has completed the round the request waits for: reply if it was the last."""
        if self._done:
            return
        self._results[i] = part
        self._remaining -= 1
        if self._remaining:
            return
        self._done = True
        sender = self._node_id()
        if self._shared:  # the values are in shared memory: name each part's buffer
            named = tuple(ArraySpec(p.key, p.dtype, (p.value.size,), p.offset, p.round, p.buffer_index())
                          for p in self._results if p is not None)
            self._send(reply_frames(self._header, sender, arrays=named, flags=Flag.SHM))
            return
        specs, data = [], []
        for p in self._results:
            assert p is not None
            data.append(p.wire_value(self._snapshot))
            specs.append(ArraySpec(p.key, p.dtype, (p.value.size,), p.offset, p.round))
        self._send(reply_frames(self._header, sender, arrays=tuple(specs), data=data))

    def fail(self, reason: str) -> None:
        """Answer with NodeFailedError naming the dead worker(s) (the round cannot complete), or with
        the error class of a :class:`Refused` reason."""
        if self._done:
            return
        self._done = True
        if isinstance(reason, Refused):
            self._send(error_frames(self._header, self._node_id(), reason.kind, str(reason)))
            return
        self._send(error_frames(self._header, self._node_id(), "NodeFailedError", reason, node=self._dead_names()))
