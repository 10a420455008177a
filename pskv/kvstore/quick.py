"""A training loop's small calls in fewer steps: ``push(key, grad, block=False)``, ``pull(key, out=w)``,
``pushpull(key, grad, out=w)``.

A training loop exchanges each small gradient the same way every step. The worker sends one
message each way (a non-blocking push and the pull behind it are folded into one,
:mod:`pskv.worker.fold`), and what the calls themselves cost — the front end's checks and
staging, the engine's bookkeeping — lies on the loop's path between a reply and the next
request: for a 4 KB key on one host the push call alone cost as much again as the time
``pull`` adds over ``pushpull`` (docs/benchmarks.md, "4 KB").

:class:`QuickCalls` takes the common case in the fewest steps and leaves every other call to
the general path (:class:`~pskv.kvstore.dist.DistStore`'s methods), whose result it matches:

* the case: one ``int`` or ``str`` key that exists, dense and not compressed, of a CPU value of
  at most :data:`~pskv.kvstore.staging.QUICK_BYTES`; each array of the call a NumPy array of
  exactly the key's shape and dtype (anything else — a list, a tensor, a mismatch that deserves
  its error — goes the general way); pushes only while no compression is set, and to a key
  whose shared slot the push reuses only once the previous push was answered; no earlier
  operation holding the key (:meth:`Engine.start_now <pskv.kvstore.engine.Engine.start_now>`);
  ``pull`` and ``pushpull`` blocking, ``push`` not;
* what runs is what the general path runs for that case: the same staging (the value is sent
  as it is), the same messages (:class:`~pskv.worker.KVWorker`), the replies into the outs as
  :mod:`~pskv.kvstore.staging` puts them, the same engine operation: a push's handle lets later
  operations on the key start at once and is done when the push is answered, its error for its
  waiter or the next ``wait``; a blocking call's error raised to its caller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pskv.arrays import CpuKernels
from pskv.arrays.dtypes import NUMPY_NAMES
from pskv.kvstore.checks import check_priority
from pskv.kvstore.engine import Deferred, Engine, OpHandle
from pskv.kvstore.keys import Key
from pskv.kvstore.staging import QUICK_BYTES, deliver, fan_out_rest, landing
from pskv.worker import KeyLayout, KVWorker

__all__ = ["QuickCalls"]


class QuickCalls:
    """The store's calls in fewer steps (see the module's text).

    Args:
        keys: the store's key layouts (its own dict: keys added later are seen).
        worker: the store's worker layer.
        engine: the store's engine.
        kernels: the store's CPU kernels (replies into outs).
        compressing: True while the store compresses pushes (then every push goes the general way).
        limit: a call's timeout, or the store's default (what a waiter's confirmation waits).
    """

    def __init__(self, keys: dict[Key, KeyLayout], worker: KVWorker, engine: Engine, kernels: CpuKernels,
                 compressing: Callable[[], bool], limit: Callable[[float | None], float]) -> None:
        self._keys = keys
        self._worker = worker
        self._engine = engine
        self._kernels = kernels
        self._compressing = compressing
        self._limit = limit

    def _key(self, key: Any, value: Any) -> KeyLayout | None:
        """The layout of ``key`` if a call on it with ``value`` (an array of the call) is the common case."""
        kind = type(key)
        rec = self._keys.get(key) if kind is int or kind is str else None
        if rec is None or type(value) is not np.ndarray or rec.row_width or rec.compress:
            return None
        meta = rec.meta
        if (value.shape != meta.shape or NUMPY_NAMES.get(value.dtype) != meta.dtype or meta.device != "cpu"
                or rec.nbytes > QUICK_BYTES):
            return None
        return rec

    def push(self, key: Any, value: Any, priority: int, timeout: float | None) -> OpHandle | None:
        """``push(key, value, priority, block=False)`` if it is the common case: its handle; else None (nothing
        done: the general path takes the call)."""
        rec = self._key(key, value)
        worker = self._worker
        if rec is None or self._compressing() or (rec.shared and not worker.acked([rec])):
            return None  # (a slot in use: the general path waits for its push's answer)
        recs = [rec]

        def start() -> Deferred:
            if rec.shared:
                worker.await_acks(recs, timeout)  # answered already: forgets them
            rec.outgoing = value  # one CPU value is sent as it is (reduce_outgoing)
            sent = worker.push(recs, priority, timeout, True)
            return Deferred(sent.replies, lambda: worker.wait_acks(sent, timeout), release=True, inline=True,
                            poke=lambda: worker.confirm(sent.replies, self._limit(timeout)))
        return self._engine.start_now("push", key, check_priority(priority), start)

    def pull(self, key: Any, out: Any, priority: int, timeout: float | None) -> bool:
        """``pull(key, out=out, priority)`` (blocking) if it is the common case: True once done; else False
        (nothing done)."""
        rec = self._key(key, out)
        if rec is None:
            return False
        worker, recs, outs = self._worker, [rec], [[out]]

        def start() -> Deferred:
            sent = worker.pull(recs, priority, timeout)
            into = landing(recs, outs)

            def finish() -> None:
                deliver(recs, worker.values(sent, timeout, into), outs, False, self._kernels)
            return Deferred(sent.replies, finish, inline=True)
        return self._run("pull", key, priority, start)

    def pushpull(self, key: Any, value: Any, out: Any, priority: int, timeout: float | None) -> bool:
        """``pushpull(key, value, out, priority)`` (blocking; ``out`` None: into ``value``) if it is the common
        case: True once done; else False (nothing done)."""
        rec = self._key(key, value)
        worker = self._worker
        if (rec is None or (out is not None and self._key(key, out) is None) or self._compressing()
                or (rec.shared and not worker.acked([rec]))):
            return False
        recs, outs = [rec], [[value if out is None else out]]

        def start() -> Deferred:
            if rec.shared:
                worker.await_acks(recs, timeout)  # answered already: forgets them
            rec.outgoing = value
            sent = worker.pushpull(recs, priority, timeout)
            into = landing(recs, outs)  # a piece's result lands after its own bytes were sent

            def finish() -> None:
                fan_out_rest([(outs[0], worker.values(sent, timeout, into)[id(rec)])], self._kernels)
            return Deferred(sent.replies, finish, inline=True)
        return self._run("pushpull", key, priority, start)

    def _run(self, name: str, key: Key, priority: int, start: Callable[[], Deferred]) -> bool:
        op = self._engine.start_now(name, key, check_priority(priority), start, block=True)
        if op is None:
            return False
        op.outcome()  # raises the call's error
        return True
