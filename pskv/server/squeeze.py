"""Server -> worker compression: each part's round value (a sum), compressed once per round. No I/O.

A PULL or PUSHPULL with ``COMPRESS_REPLY`` asks for the values compressed with the
compression its body names (``both_ways`` in ``set_gradient_compression``). That is
only sound for values that are sums of gradients — no optimizer on the servers — so
the handlers ask for it only then. The value of a part's round is compressed once,
with the part's own residual (error feedback on the server, as BytePS does), and every
pull of that round gets the same payload: every worker decodes the same values.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from pskv.compression import Compressor
from pskv.server.shard import Part

__all__ = ["ReplyCompression"]


class _Squeezed(NamedTuple):
    round: int
    compressor: Compressor
    payload: np.ndarray[Any, Any]
    residual: np.ndarray[Any, Any]


class ReplyCompression:
    """Per part: the residual of its compressed values, and the payload of its latest round."""

    def __init__(self) -> None:
        self._of: dict[tuple[int, int], _Squeezed] = {}

    def payload(self, part: Part, compressor: Compressor) -> np.ndarray[Any, Any]:
        """The compressed value of ``part``'s current round (made at the first pull of the round)."""
        key = (part.key, part.offset)
        done = self._of.get(key)
        if done is not None and done.round == part.round and done.compressor == compressor:
            return done.payload
        fresh = done is None or done.compressor != compressor or done.residual.size != part.value.size
        residual = np.zeros(part.value.size, np.float32) if fresh else done.residual  # type: ignore[union-attr]
        payload = compressor.compress(part.value.reshape(-1), residual)
        self._of[key] = _Squeezed(part.round, compressor, payload, residual)
        return payload

    def forget(self, part: Part) -> None:
        """``part``'s value was replaced (a broadcast): its residual no longer applies."""
        self._of.pop((part.key, part.offset), None)

    def __len__(self) -> int:
        return len(self._of)
