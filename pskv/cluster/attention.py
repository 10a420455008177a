"""Whether a node's own loop was held up: a peer's silence counts only while the loop could hear it.

A liveness check runs on its node's reactor every ``period`` seconds. If the reactor was
busy for longer (a long handler, a machine under load), the peers' heartbeats are waiting,
unread, in the node's sockets: marking a peer dead now would blame it for the checker's own
stall. :class:`Attention` tells the check to wait one turn instead, by which time the
waiting messages have been read.
"""

from __future__ import annotations

import time

__all__ = ["Attention"]


class Attention:
    """The time between two liveness checks, compared with their period.

    Args:
        period: seconds between two checks (a reactor timer's interval).
    """

    def __init__(self, period: float) -> None:
        self._late = max(2 * period, 0.5)  # a check this late means the loop was held up
        self._at = time.monotonic()

    def held_up(self) -> float:
        """Seconds since the previous call if the loop was held up meanwhile (more than two
        periods, at least 0.5 s), else 0.0. Call once per check."""
        now = time.monotonic()
        gap, self._at = now - self._at, now
        return gap if gap > self._late else 0.0
