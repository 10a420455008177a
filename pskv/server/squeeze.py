"""Server -> worker compression: each part's round value (a sum), compressed once per round. No I/O.

A PULL or PUSHPULL with ``COMPRESS_REPLY`` asks for the values compressed with the
compression its body names (``both_ways`` in ``set_gradient_compression``). That is
only sound for values that are sums of gradients — no optimizer on the servers — so
the handlers ask for it only then. The value of a part's round is compressed once,
with the part's own residual (error feedback on the server, as BytePS does), and every
pull of that round gets the same payload: every worker decodes the same values.

A checkpoint keeps each part's residual and latest round payload (:meth:`ReplyCompression.export`,
:meth:`ReplyCompression.restore`, written by :mod:`pskv.server.checkpointing`). A residual
that cannot go on — the pulls ask for another compression, the part changed size, the
checkpoint predates saved residuals — starts at zero with a WARNING naming the part and why.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np

from pskv.compression import Compressor
from pskv.server.shard import Part

__all__ = ["ReplyCompression", "Squeezed"]

log = logging.getLogger("pskv.server")


class Squeezed(NamedTuple):
    """One part's reply compression: the round its payload is of, and the residual after it."""

    key: int
    offset: int
    round: int
    compressor: Compressor
    payload: np.ndarray[Any, Any]  # uint8
    residual: np.ndarray[Any, Any]  # float32, the part's size


class ReplyCompression:
    """Per part: the residual of its compressed values, and the payload of its latest round."""

    def __init__(self) -> None:
        self._of: dict[tuple[int, int], Squeezed] = {}
        # a restored checkpoint that holds no reply residuals (it predates them): named in the warning
        self._unsaved_in = ""
        self._warned_unsaved = False

    def payload(self, part: Part, compressor: Compressor) -> np.ndarray[Any, Any]:
        """The compressed value of ``part``'s current round (made at the first pull of the round)."""
        key = (part.key, part.offset)
        done = self._of.get(key)
        if done is not None and done.round == part.round and done.compressor == compressor:
            return done.payload
        fresh = done is None or done.compressor != compressor or done.residual.size != part.value.size
        if fresh:
            self._note_fresh(part, compressor, done)
        residual = np.zeros(part.value.size, np.float32) if fresh else done.residual  # type: ignore[union-attr]
        payload = compressor.compress(part.value.reshape(-1), residual)
        self._of[key] = Squeezed(part.key, part.offset, part.round, compressor, payload, residual)
        return payload

    def _note_fresh(self, part: Part, compressor: Compressor, done: Squeezed | None) -> None:
        """Say why ``part``'s reply residual starts at zero, when that drops something."""
        where = f"key {part.key} offset {part.offset}"
        if done is not None and done.compressor != compressor:
            log.warning("reply compression of %s: its residual (compression %s) dropped: the pulls ask for %s; "
                        "it starts at zero", where, done.compressor.params, compressor.params)
        elif done is not None:
            log.warning("reply compression of %s: its residual of %d values dropped: the part holds %d; it starts "
                        "at zero", where, done.residual.size, part.value.size)
        elif self._unsaved_in and not self._warned_unsaved:
            self._warned_unsaved = True
            log.warning("reply compression: the checkpoint %s holds no reply residuals (written before they "
                        "were saved): every part's residual starts at zero (first: %s)", self._unsaved_in, where)

    def forget(self, part: Part) -> None:
        """``part``'s value was replaced (a broadcast): its residual no longer applies."""
        self._of.pop((part.key, part.offset), None)

    def export(self) -> list[Squeezed]:
        """Every part's state (copies), for a checkpoint."""
        return [s._replace(payload=s.payload.copy(), residual=s.residual.copy()) for s in self._of.values()]

    def restore(self, saved: Iterable[Squeezed] | None, source: str) -> None:
        """Take the states a checkpoint (``source``) kept; None: it predates reply residuals (warned at use)."""
        self._of.clear()
        self._unsaved_in = source if saved is None else ""
        self._warned_unsaved = False
        for s in saved or ():
            self._of[(s.key, s.offset)] = s

    def __len__(self) -> int:
        return len(self._of)
