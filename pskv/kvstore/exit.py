"""Process exit and fork for the distributed stores: a store left open still leaves its job.

A script that never calls ``close()`` still tells the scheduler it left when the
interpreter exits, so nobody takes it for dead (no heartbeat timeout, no ERROR line), and
the servers and the scheduler end as soon as every worker has left. Leaving at exit does
not wait for the others (no exit barrier), which keeps a failing script's exit — and its
exit code, the launcher's root cause — prompt.

The stores are held weakly: the hook never keeps a dropped store alive. A forked child
(a data-loading process) has its parent's stores but not their threads; it forgets them,
so its exit does not make them leave.
"""

from __future__ import annotations

import atexit
import logging
import os
import weakref
from typing import Protocol

__all__ = ["Leaving", "leave_at_exit", "left"]

log = logging.getLogger("pskv.dist")

_AT_EXIT_TIMEOUT = 10.0  # seconds a store left open may take to leave at interpreter exit


class Leaving(Protocol):
    """A store that leaves its job (:class:`~pskv.kvstore.dist.DistStore`)."""

    @property
    def rank(self) -> int: ...

    def _leave(self, wait: bool, timeout: float) -> None: ...


_OPEN: weakref.WeakKeyDictionary[Leaving, float] = weakref.WeakKeyDictionary()  # open store -> its exit timeout


def leave_at_exit(store: Leaving, timeout: float) -> None:
    """Make ``store`` leave at interpreter exit, taking at most ``timeout`` seconds (10 s at most)."""
    _OPEN[store] = min(timeout, _AT_EXIT_TIMEOUT)


def left(store: Leaving) -> None:
    """``store`` left (closed): the exit hook forgets it."""
    _OPEN.pop(store, None)


@atexit.register
def _leave_at_exit() -> None:
    """Interpreter exit: every store still open leaves the job (without the exit barrier)."""
    for store, timeout in list(_OPEN.items()):
        try:
            store._leave(wait=False, timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - exiting anyway: say why leaving failed
            log.error("worker %d: could not leave the job at exit: %s", store.rank, exc)


os.register_at_fork(after_in_child=_OPEN.clear)
