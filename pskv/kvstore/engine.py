"""The operation engine: per-key ordering, priorities and handles for non-blocking calls.

Every data operation names the keys it touches. An operation may start only when all
earlier operations on any of its keys have finished, so operations on one key run in
the order they were issued. Among operations that are ready, the highest ``priority``
starts first (ties: issue order).

Blocking calls whose keys are idle run directly in the caller's thread (no hand-off
cost); otherwise they queue like non-blocking calls and the caller waits on the
handle. Errors are never dropped: they surface from :meth:`OpHandle.wait` or, if no
one waited on the handle, from the next :meth:`Engine.wait_all`.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from pskv.errors import OperationTimeoutError, StoreClosedError

__all__ = ["Engine", "OpHandle"]


class OpHandle:
    """The handle of one queued operation (returned by calls made with ``block=False``).

    ``wait`` returns the operation's result (for ``pull`` with ``out=None``: the new
    arrays) or raises the error it ended with.
    """

    __slots__ = ("name", "keys", "priority", "seq", "_fn", "_deps", "_dependents", "_done", "_event",
                 "_lock", "_result", "_error", "_observed")

    def __init__(self, name: str, keys: tuple[Hashable, ...], priority: int, seq: int, fn: Callable[[], Any],
                 lock: threading.Lock) -> None:
        self.name = name
        self.keys = keys
        self.priority = priority
        self.seq = seq
        self._fn: Callable[[], Any] | None = fn
        self._deps = 0
        self._dependents: list[OpHandle] = []
        self._done = False
        # Created only when someone waits: most operations run inline and are never waited on.
        self._event: threading.Event | None = None
        self._lock = lock  # the engine's lock, guarding _done / _event
        self._result: Any = None
        self._error: BaseException | None = None
        self._observed = False

    def __lt__(self, other: OpHandle) -> bool:  # heap order: priority desc, then issue order
        return (-self.priority, self.seq) < (-other.priority, other.seq)

    def __repr__(self) -> str:
        state = "done" if self._done else "pending"
        return f"<OpHandle {self.name} keys={list(self.keys)!r} priority={self.priority} {state}>"

    def done(self) -> bool:
        """True once the operation finished (successfully or not)."""
        return self._done

    def exception(self) -> BaseException | None:
        """The error the operation ended with, or None (also None while pending)."""
        return self._error

    def wait(self, timeout: float | None = None) -> Any:
        """Wait for the operation and return its result.

        Args:
            timeout: seconds to wait; None waits without limit.

        Raises:
            OperationTimeoutError: the operation did not finish in time (it stays queued).
            Exception: whatever the operation raised.
        """
        with self._lock:
            event = None
            if not self._done:
                if self._event is None:
                    self._event = threading.Event()
                event = self._event
        if event is not None and not event.wait(timeout):
            raise OperationTimeoutError(
                f"{self.name} on key(s) {list(self.keys)!r} did not finish within {timeout} s"
            )
        self._observed = True
        if self._error is not None:
            raise self._error
        return self._result


class Engine:
    """Runs operations in per-key order with priorities on a few worker threads.

    Args:
        threads: worker threads for queued operations.
        name: prefix of the worker threads' names.
    """

    def __init__(self, threads: int = 2, name: str = "pskv-engine") -> None:
        self._threads_wanted = max(1, threads)
        self._name = name
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # signalled when operations finish
        self._work = threading.Condition(self._lock)  # signalled when work is ready for the workers
        self._last: dict[Hashable, OpHandle] = {}
        self._ready: list[OpHandle] = []
        self._pending: set[OpHandle] = set()
        self._failed: list[OpHandle] = []
        self._seq = itertools.count()
        self._workers: list[threading.Thread] = []
        self._waiters = 0  # threads blocked in wait_all (they need a notify per finished op)
        self._closed = False

    # -- submission --------------------------------------------------------------------
    def submit(self, name: str, keys: Iterable[Hashable], priority: int, fn: Callable[[], Any],
               block: bool, timeout: float | None) -> Any:
        """Run ``fn`` once every earlier operation on ``keys`` has finished.

        Returns:
            With ``block=True`` the result of ``fn``; otherwise an :class:`OpHandle`.

        Raises:
            StoreClosedError: the engine was closed.
            OperationTimeoutError: ``block=True`` and the operation did not start and
                finish within ``timeout`` seconds.
            Exception: with ``block=True``, whatever ``fn`` raised.
        """
        op = OpHandle(name, tuple(dict.fromkeys(keys)), int(priority), next(self._seq), fn, self._lock)
        with self._lock:
            if self._closed:
                raise StoreClosedError(f"cannot {name}: the store is closed")
            before: set[OpHandle] = set()
            for k in op.keys:
                prev = self._last.get(k)
                if prev is not None and prev not in before:
                    before.add(prev)
                    prev._dependents.append(op)
                self._last[k] = op
            op._deps = len(before)
            self._pending.add(op)
            run_here = block and op._deps == 0
            if not run_here and op._deps == 0:
                self._enqueue(op)
        if run_here:
            op._observed = True  # the caller gets the error directly
            self._run(op)
            if op._error is not None:
                raise op._error
            return op._result
        if block:
            return op.wait(timeout)
        return op

    def _enqueue(self, op: OpHandle) -> None:  # lock held
        heapq.heappush(self._ready, op)
        if len(self._workers) < self._threads_wanted:
            t = threading.Thread(target=self._worker, name=f"{self._name}-{len(self._workers)}", daemon=True)
            self._workers.append(t)
            t.start()
        self._work.notify()

    # -- execution ---------------------------------------------------------------------
    def _run(self, op: OpHandle) -> None:
        fn, op._fn = op._fn, None
        try:
            assert fn is not None
            op._result = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter, never dropped
            op._error = exc
        with self._lock:
            for dep in op._dependents:
                dep._deps -= 1
                if dep._deps == 0:
                    self._enqueue(dep)
            op._dependents = []
            for k in op.keys:
                if self._last.get(k) is op:
                    del self._last[k]
            self._pending.discard(op)
            if op._error is not None:
                self._failed.append(op)
            op._done = True
            if op._event is not None:
                op._event.set()
            if self._waiters:
                self._cond.notify_all()

    def _worker(self) -> None:
        while True:
            with self._lock:
                while not self._ready and not self._closed:
                    self._work.wait()
                if not self._ready:  # closed and drained
                    return
                op = heapq.heappop(self._ready)
            self._run(op)

    # -- waiting -----------------------------------------------------------------------
    def wait_all(self, keys: Iterable[Hashable] | None = None, timeout: float | None = None) -> None:
        """Wait until every pending operation (on ``keys``, if given) has finished.

        Raises:
            OperationTimeoutError: work was still pending after ``timeout`` seconds; the
                message lists it.
            Exception: the first error of a finished operation whose handle nobody
                waited on (reported once).
        """
        wanted = None if keys is None else set(keys)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                busy = [op for op in self._pending if wanted is None or wanted.intersection(op.keys)]
                if not busy:
                    break
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    shown = ", ".join(repr(op) for op in sorted(busy)[:5])
                    raise OperationTimeoutError(
                        f"{len(busy)} operation(s) still pending after {timeout} s: {shown}"
                    )
                self._waiters += 1
                try:
                    self._cond.wait(remaining)
                finally:
                    self._waiters -= 1
            failed = [op for op in self._failed if not op._observed and (wanted is None or wanted.intersection(op.keys))]
            self._failed = [op for op in self._failed if not op._observed and op not in failed]
        for op in failed:
            op._observed = True
        if failed:
            raise failed[0]._error  # type: ignore[misc]

    def pending(self) -> int:
        """Number of operations queued or running."""
        with self._lock:
            return len(self._pending)

    def close(self, timeout: float | None) -> None:
        """Finish pending work (up to ``timeout`` seconds), then stop the workers.

        Raises:
            OperationTimeoutError: pending work did not finish in time (the engine is
                closed anyway; the work is abandoned).
            Exception: the first error of an operation nobody waited on (after closing).
        """
        error: BaseException | None = None
        try:
            self.wait_all(timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - re-raised once the engine is closed
            error = exc
        with self._lock:
            self._closed = True
            self._work.notify_all()
        for t in self._workers:
            t.join(timeout=5.0)
        if error is not None:
            raise error
