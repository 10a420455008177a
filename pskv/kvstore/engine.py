"""The operation engine: per-key ordering, priorities and handles for non-blocking calls.

Every data operation names the keys it touches. An operation may start only when all
earlier operations on any of its keys have finished, so operations on one key run in
the order they were issued. Among operations that are ready, the highest ``priority``
starts first (ties: issue order).

Blocking calls whose keys are idle run directly in the caller's thread (no hand-off
cost); otherwise they queue like non-blocking calls and the caller waits on the
handle. Errors are never dropped: they surface from :meth:`OpHandle.wait` or, if no
one waited on the handle, from the next :meth:`Engine.wait_all`.

Network operations need not hold a thread while their replies travel: an operation's
function may send its requests and return a :class:`Deferred` naming what it waits for
and how to finish. The engine then finishes it when the last reply is in — on the
thread that delivered it when the finish is cheap (``inline``), else in the thread
waiting on the handle, else on a worker thread. A deferred operation may also
``release`` its keys as soon as it has sent (later operations on them start at once,
and the operation itself still completes only when its replies are in): that is how a
pull is sent right behind a non-blocking push. Non-blocking submissions marked
``inline`` start in the caller's thread when their keys are idle, so a quick send costs
no hand-off to a worker thread either.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from functools import partial
from typing import Any, Protocol

from pskv.errors import OperationTimeoutError, StoreClosedError

log = logging.getLogger("pskv.engine")

__all__ = ["Deferred", "Engine", "OpHandle"]


class Waitable(Protocol):
    """What a :class:`Deferred` waits for (e.g. :class:`pskv.cluster.requests.Pending`).

    One that also has a ``background()`` method gets it called when the engine, not a
    thread waiting on it directly, is to finish its operation (a request whose waiter
    would read its reply itself then has it read by its network thread).
    """

    def done(self) -> bool: ...

    def add_done_callback(self, fn: Callable[[Any], None]) -> None: ...


class Deferred:
    """Returned by an operation's function that has sent requests and finishes later.

    Args:
        pendings: what the operation waits for; each must call its done-callbacks exactly
            once, also when it fails or times out (the engine adds no timeout of its own).
        finish: run once every pending is done (successfully or not); its return value
            becomes the operation's result, its exception the operation's error. When
            the operation was started by a blocking call in the caller's thread, the
            caller runs ``finish`` at once instead, and it must then wait (with a
            timeout) for the pendings itself.
        release: let later operations on the same keys start now, before ``finish``.
        inline: ``finish`` is cheap and never blocks: it may run on the thread that
            completes the last pending (a network thread).
        poke: called (without blocking) when a thread starts waiting for the operation,
            for pendings that complete only when asked (e.g. unacknowledged requests).
    """

    __slots__ = ("pendings", "finish", "release", "inline", "poke")

    def __init__(self, pendings: Sequence[Waitable], finish: Callable[[], Any], *, release: bool = False,
                 inline: bool = False, poke: Callable[[], None] | None = None) -> None:
        self.pendings = list(pendings)
        self.finish = finish
        self.release = release
        self.inline = inline
        self.poke = poke


# OpHandle states
_QUEUED = 0  # waiting for its keys, or for a worker to start it
_STARTED = 1  # its function runs, or its replies are on their way
_REPLIES_IN = 2  # deferred: every reply is in, nobody finishes it yet
_FINISHING = 3  # deferred: claimed by the thread that runs its finish
_DONE = 4


class OpHandle:
    """The handle of one queued operation (returned by calls made with ``block=False``).

    ``wait`` returns the operation's result (for ``pull`` with ``out=None``: the new
    arrays) or raises the error it ended with.
    """

    __slots__ = ("name", "keys", "priority", "seq", "_fn", "_deps", "_dependents", "_done", "_engine",
                 "_lock", "_cond", "_waiters", "_state", "_deferred", "_left", "_released",
                 "_result", "_error", "_observed", "_shown")

    def __init__(self, name: str, keys: tuple[Hashable, ...], priority: int, seq: int, fn: Callable[[], Any],
                 engine: Engine, shown: Sequence[Hashable] | None = None) -> None:
        self.name = name
        self.keys = keys
        self._shown = shown  # the keys its messages name, when not its engine keys (see Engine.submit)
        self.priority = priority
        self.seq = seq
        self._fn: Callable[[], Any] | None = fn
        self._deps = 0
        self._dependents: list[OpHandle] = []
        self._done = False
        self._engine = engine
        self._lock = engine._lock  # guards everything below
        # Created only when someone waits: most operations are never waited on.
        self._cond: threading.Condition | None = None
        self._waiters = 0
        self._state = _QUEUED
        self._deferred: Deferred | None = None
        self._left = 0  # pendings of the deferred still outstanding
        self._released = False  # later operations on its keys no longer wait for it
        self._result: Any = None
        self._error: BaseException | None = None
        self._observed = False

    def __lt__(self, other: OpHandle) -> bool:  # heap order: priority desc, then issue order
        return (-self.priority, self.seq) < (-other.priority, other.seq)

    def __repr__(self) -> str:
        state = "done" if self._done else "pending"
        return f"<OpHandle {self.name} keys={self._named()!r} priority={self.priority} {state}>"

    def _named(self) -> list[Hashable]:
        """The keys its messages name: the caller's (``shown``) if given, else its engine keys."""
        return list(self.keys if self._shown is None else self._shown)

    def done(self) -> bool:
        """True once the operation finished (successfully or not)."""
        return self._done

    def outcome(self) -> Any:
        """The result of a finished operation; raises the error it ended with."""
        if self._error is not None:
            raise self._error
        return self._result

    def exception(self) -> BaseException | None:
        """The error the operation ended with, or None (also None while pending)."""
        return self._error

    def wait(self, timeout: float | None = None) -> Any:
        """Wait for the operation and return its result.

        Args:
            timeout: seconds to wait; None waits up to the store's default timeout
                (``PSKV_REQUEST_TIMEOUT`` for ``dist_*`` and ``byteps``, ``PSKV_DEFAULT_TIMEOUT``
                for the local and all-reduce stores), never forever.

        Raises:
            OperationTimeoutError: the operation did not finish in time (it stays queued).
            Exception: whatever the operation raised.
        """
        if timeout is None:
            timeout = self._engine.default_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        claimed = poked = False
        lock = self._lock
        with lock:
            self._waiters += 1  # from now on _replies_in hands the finish to us, _start pokes
            if self._cond is None:
                self._cond = threading.Condition(lock)
            try:
                while not self._done:
                    if self._state == _REPLIES_IN:  # its replies are in: finish it in this thread
                        self._state = _FINISHING
                        claimed = True
                        break
                    if not poked and self._deferred is not None and self._deferred.poke is not None:
                        poked = True
                        lock.release()
                        try:
                            _poke([self])
                        finally:
                            lock.acquire()
                        continue
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise OperationTimeoutError(
                            f"{self.name} on key(s) {self._named()!r} did not finish within {timeout} s"
                        )
                    self._cond.wait(remaining)
            finally:
                self._waiters -= 1
        if claimed:
            self._engine._finish(self)
        self._observed = True
        if self._error is not None:
            raise self._error
        return self._result


class Engine:
    """Runs operations in per-key order with priorities on a few worker threads.

    Args:
        threads: worker threads for queued operations.
        name: prefix of the worker threads' names.
        default_timeout: how long :meth:`OpHandle.wait` waits when given no timeout
            (None: without limit; pskv's stores pass their default timeout).
    """

    def __init__(self, threads: int = 2, name: str = "pskv-engine", default_timeout: float | None = None) -> None:
        self._threads_wanted = max(1, threads)
        self.default_timeout = default_timeout  # what OpHandle.wait() waits at most when given no timeout
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
               block: bool, timeout: float | None, inline: bool = False,
               shown: Sequence[Hashable] | None = None) -> Any:
        """Run ``fn`` once every earlier operation on ``keys`` has finished (or released them).

        ``fn`` may return a :class:`Deferred` to finish later. With ``inline`` (and
        ``block=False``) ``fn`` starts in the caller's thread when no earlier operation
        holds its keys; it should then be quick (e.g. only send requests). ``shown``: the
        keys a timeout and :meth:`wait_all`'s listing name instead of ``keys``, when those
        are the store's own (an all-reduce store's calls all hold one engine key).

        Returns:
            With ``block=True`` the result of ``fn``; otherwise an :class:`OpHandle`.

        Raises:
            StoreClosedError: the engine was closed.
            OperationTimeoutError: ``block=True`` and the operation did not start and
                finish within ``timeout`` seconds.
            Exception: with ``block=True``, whatever ``fn`` raised.
        """
        op = OpHandle(name, tuple(dict.fromkeys(keys)), int(priority), next(self._seq), fn, self, shown)
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
            start_here = op._deps == 0 and (block or inline)
            if start_here:
                op._state = _STARTED
            elif op._deps == 0:
                self._enqueue(op)
        if start_here:
            if not block:
                self._start(op, direct=False)
                return op
            op._observed = True  # the caller gets the error directly
            self._start(op, direct=True)
            if op._error is not None:
                raise op._error
            return op._result
        if block:
            return op.wait(timeout)
        return op

    def start_now(self, name: str, key: Hashable, priority: int, fn: Callable[[], Any],
                  block: bool = False) -> OpHandle | None:
        """``submit(name, [key], priority, fn, block, inline=True)`` in fewer steps, when no earlier
        operation holds ``key``: ``fn`` starts in the caller's thread now (a training loop's small
        calls, whose cost here lies on the loop's path). Returns its handle — with ``block``, finished:
        :meth:`OpHandle.outcome` — or None (nothing done) when an earlier operation holds ``key`` or
        the engine is closed: submit it then.
        """
        op = OpHandle(name, (key,), priority, next(self._seq), fn, self)
        with self._lock:
            if self._closed or key in self._last:
                return None
            op._state = _STARTED
            self._last[key] = op
            self._pending.add(op)
        op._observed = block  # the caller gets the error directly
        self._start(op, direct=block)
        return op

    def _enqueue(self, op: OpHandle) -> None:  # lock held
        heapq.heappush(self._ready, op)
        if len(self._workers) < self._threads_wanted:
            t = threading.Thread(target=self._worker, name=f"{self._name}-{len(self._workers)}", daemon=True)
            self._workers.append(t)
            t.start()
        self._work.notify()

    # -- execution ---------------------------------------------------------------------
    def _start(self, op: OpHandle, direct: bool) -> None:
        """Run ``op``'s function; ``direct``: the (blocking) caller finishes a deferred op itself."""
        fn, op._fn = op._fn, None
        try:
            assert fn is not None
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter, never dropped
            self._complete(op, None, exc)
            return
        if not isinstance(result, Deferred):
            self._complete(op, result, None)
            return
        op._deferred = result
        if direct:
            if result.release:
                with self._lock:
                    self._release(op)
            op._state = _FINISHING
            self._finish(op)
            return
        pendings = result.pendings
        with self._lock:
            if result.release:
                self._release(op)
            op._left = len(pendings)
            waited_on = op._waiters > 0 or self._waiters > 0
        if not pendings:
            self._replies_in(op)
            return
        on_reply = partial(self._one_reply_in, op)
        for p in pendings:
            p.add_done_callback(on_reply)
            background = getattr(p, "background", None)
            if background is not None:  # no thread waits on it directly: its reply is read in the background
                background()
        if waited_on and result.poke is not None:  # someone waits already: they may have poked too early
            _poke([op])

    def _one_reply_in(self, op: OpHandle, _pending: Any = None) -> None:
        """Done-callback of a deferred op's pendings (any thread, often the network thread)."""
        with self._lock:
            op._left -= 1
            if op._left or not self._claim(op):
                return
        self._finish(op)

    def _replies_in(self, op: OpHandle) -> None:
        """Every reply of ``op`` is in: finish it here, in its waiter's thread or on a worker."""
        with self._lock:
            if not self._claim(op):
                return
        self._finish(op)

    def _claim(self, op: OpHandle) -> bool:  # lock held
        """Every reply of ``op`` is in: True if this thread finishes it; else its waiter or a worker will."""
        assert op._deferred is not None
        if op._waiters:  # a thread waits on the handle: it runs the finish (no hand-off)
            op._state = _REPLIES_IN
            assert op._cond is not None
            op._cond.notify_all()
            return False
        if not op._deferred.inline:
            op._state = _REPLIES_IN
            self._enqueue(op)
            return False
        op._state = _FINISHING
        return True

    def _finish(self, op: OpHandle) -> None:
        """Run a deferred op's finish (the calling thread claimed it) and complete the op."""
        assert op._deferred is not None
        finish, op._deferred.finish = op._deferred.finish, _finished
        try:
            result = finish()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter, never dropped
            self._complete(op, None, exc)
            return
        self._complete(op, result, None)

    def _release(self, op: OpHandle) -> None:  # lock held
        if op._released:
            return
        op._released = True
        for dep in op._dependents:
            dep._deps -= 1
            if dep._deps == 0:
                self._enqueue(dep)
        op._dependents = []
        for k in op.keys:
            if self._last.get(k) is op:
                del self._last[k]

    def _complete(self, op: OpHandle, result: Any, error: BaseException | None) -> None:
        op._result = result
        op._error = error
        with self._lock:
            self._release(op)
            self._pending.discard(op)
            if error is not None:
                self._failed.append(op)
            op._done = True
            op._state = _DONE
            if op._cond is not None:
                op._cond.notify_all()
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
                state = op._state
                if state == _QUEUED:
                    op._state = _STARTED
                elif state == _REPLIES_IN:
                    op._state = _FINISHING
                else:  # a waiter claimed its finish meanwhile
                    continue
            if state == _QUEUED:
                self._start(op, direct=False)
            else:
                self._finish(op)

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
            self._waiters += 1  # notified per finished op; deferred ops starting from now are poked
            poked = [op for op in self._pending if wanted is None or wanted.intersection(op.keys)]
        try:
            _poke(poked)
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
                    self._cond.wait(remaining)
                failed = [op for op in self._failed
                          if not op._observed and (wanted is None or wanted.intersection(op.keys))]
                self._failed = [op for op in self._failed if not op._observed and op not in failed]
        finally:
            with self._lock:
                self._waiters -= 1
        for op in failed:
            op._observed = True
        if failed:
            raise failed[0]._error  # type: ignore[misc]

    def settle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no operation is pending; True if none is.

        Unlike :meth:`wait_all` it reports no error: a failed operation's error stays for
        its handle or the next :meth:`wait_all` (``barrier`` settles so, see DistJob.barrier).
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            self._waiters += 1
            poked = list(self._pending)
        try:
            _poke(poked)  # quiet pushes finish only when asked
            with self._lock:
                while self._pending:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._cond.wait(remaining)
                return True
        finally:
            with self._lock:
                self._waiters -= 1

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


def _finished() -> Any:
    raise AssertionError("a deferred operation was finished twice")


def _poke(ops: Iterable[OpHandle]) -> None:
    """Ask the started deferred operations among ``ops`` to get their answers (see Deferred.poke)."""
    for op in ops:
        d = op._deferred
        if d is not None and d.poke is not None and not op._done:
            try:
                d.poke()
            except Exception:  # noqa: BLE001 - then the pendings fail on their own (closed, dead node)
                log.debug("poking %r failed", op, exc_info=True)
