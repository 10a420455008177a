"""Stores under test: one store, or every worker's store of an in-process cluster.

The contract checks (:mod:`pskv.testing.contracts`) and the model-based machine
(:mod:`pskv.testing.store_model`) are written once against a :class:`StoreGroup`: a set
of stores that act together — one ``local`` store, or the ``num_workers`` stores of a
distributed job. :meth:`StoreGroup.run` calls a function on every store of the group
at the same time (each worker in its own thread, as collectives require) and returns
the results in worker order.

A :class:`StoreSpec` names a kind of store and opens groups of it; a
:class:`StorePool` keeps one open group per spec, so that many checks share one
cluster, and drops a group as soon as a check failed in it (its stores may be
half-way through a collective).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from pskv.config import ClusterConfig
from pskv.errors import OperationTimeoutError
from pskv.kvstore import KVStoreBase, StoreType, create
from pskv.testing.cluster import InProcessCluster
from pskv.testing.loopback import loopback_store

__all__ = ["ClusterGroup", "LocalGroup", "StoreGroup", "StorePool", "StoreSpec", "cluster_store", "local_store",
           "loopback_spec"]

T = TypeVar("T")

# After one worker failed, how long the others get to finish: a worker left waiting in a
# collective the failed one never joins would otherwise hold the caller for the deadline.
_FAILURE_GRACE = 3.0


class StoreGroup(Protocol):
    """Stores that act together: one per worker."""

    @property
    def store_type(self) -> StoreType:
        """The type of every store of the group."""

    @property
    def num_workers(self) -> int:
        """How many stores (workers) the group has."""

    @property
    def broken(self) -> bool:
        """True once a call failed: the stores may be out of step; close the group."""

    def run(self, fn: Callable[[KVStoreBase], T]) -> list[T]:
        """``fn(store)`` on every store at once; results in worker order.

        Raises:
            Exception: the first worker's exception (in worker order), with a note naming
                the worker.
            OperationTimeoutError: a worker did not finish within the group's deadline.
        """

    def next_key_base(self) -> int:
        """A number not handed out before by this group (to make keys no check used yet)."""

    def close(self) -> None:
        """Close every store (and the cluster)."""


class _KeyBases:
    """Hands out disjoint blocks of keys, so that checks sharing a store never collide."""

    block = 1000

    def __init__(self) -> None:
        self._next = 0

    def next_key_base(self) -> int:
        self._next += self.block
        return self._next


class LocalGroup(_KeyBases):
    """One single-process store.

    Args:
        factory: makes the store (e.g. ``lambda: pskv.create('device')``).
    """

    def __init__(self, factory: Callable[[], KVStoreBase]) -> None:
        super().__init__()
        self.store = factory()
        self.broken = False

    @property
    def store_type(self) -> StoreType:
        return self.store.store_type

    @property
    def num_workers(self) -> int:
        return self.store.num_workers

    def run(self, fn: Callable[[KVStoreBase], T]) -> list[T]:
        try:
            return [fn(self.store)]
        except BaseException:
            self.broken = True
            raise

    def close(self) -> None:
        self.store.close()


class ClusterGroup(_KeyBases):
    """The worker stores of an :class:`InProcessCluster`, each living in its own thread.

    The threads keep their stores open between calls of :meth:`run`, so one cluster can
    serve many checks.

    Args:
        factory: makes a worker's store from its cluster contract (e.g.
            ``lambda cfg: pskv.create('dist_sync', cluster=cfg)``).
        num_servers, num_workers: the cluster's size.
        deadline: seconds any one call (and the cluster's requests) may take.
        **settings: further :class:`~pskv.config.ClusterConfig` fields (``bigarray_bound``, ...).

    Raises:
        OperationTimeoutError: the stores were not all created within ``deadline``.
        Exception: a worker's store could not be created.
    """

    def __init__(self, factory: Callable[[ClusterConfig], KVStoreBase], num_servers: int, num_workers: int,
                 deadline: float = 20.0, **settings: Any) -> None:
        super().__init__()
        self.deadline = deadline
        self.broken = False
        self._factory = factory
        self._cluster = InProcessCluster(num_servers, num_workers, deadline=deadline, **settings)
        self._cluster.__enter__()
        self._inboxes: list[queue.Queue[Callable[[KVStoreBase], Any] | None]] = [
            queue.Queue() for _ in range(num_workers)]
        self._outbox: queue.Queue[tuple[int, int, BaseException | None, Any]] = queue.Queue()
        self._stores: list[KVStoreBase | None] = [None] * num_workers
        self._seq = 0
        self._threads = [threading.Thread(target=self._serve, args=(i,), name=f"pskv-contract-worker-{i}",
                                          daemon=True) for i in range(num_workers)]
        for t in self._threads:
            t.start()
        try:
            self._collect("create the stores")
        except BaseException:
            self.close()
            raise

    @property
    def store_type(self) -> StoreType:
        store = self._stores[0]
        assert store is not None
        return store.store_type

    @property
    def num_workers(self) -> int:
        return len(self._threads)

    def _serve(self, index: int) -> None:
        """A worker thread: create the store, then run what arrives until ``None``."""
        seq = 0
        try:
            # Every worker runs on this host: local ranks 0..n-1, as `pskv launch` sets them.
            config = dataclasses.replace(self._cluster.worker_config(index), local_rank=index)
            self._stores[index] = self._factory(config)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller of run()
            self._outbox.put((index, seq, exc, None))
            return
        store = self._stores[index]
        assert store is not None
        self._outbox.put((index, seq, None, None))
        try:
            while (fn := self._inboxes[index].get()) is not None:
                seq += 1
                try:
                    self._outbox.put((index, seq, None, fn(store)))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller of run()
                    self._outbox.put((index, seq, exc, None))
        finally:
            store.close()

    def run(self, fn: Callable[[KVStoreBase], T]) -> list[T]:
        if self.broken:
            raise RuntimeError("this store group is broken by an earlier failure; open a new one")
        self._seq += 1
        for inbox in self._inboxes:
            inbox.put(fn)
        return self._collect(getattr(fn, "__name__", "the call"))

    def _collect(self, what: str) -> list[Any]:
        """Every worker's answer to call number ``self._seq``; raise the first error."""
        results: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}
        end = time.monotonic() + self.deadline
        while len(results) + len(errors) < self.num_workers:
            try:
                index, seq, exc, value = self._outbox.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                break
            if seq != self._seq:
                continue  # a late answer to an earlier call that timed out
            if exc is None:
                results[index] = value
            else:
                errors[index] = exc
                end = min(end, time.monotonic() + _FAILURE_GRACE)
        if errors or len(results) < self.num_workers:
            self.broken = True
        if errors:
            first = min(errors)
            error = errors[first]
            add_note = getattr(error, "add_note", None)  # Python 3.11+
            if add_note is not None:
                add_note(f"(in worker thread {first} of {self.num_workers}; {len(errors)} worker(s) failed)")
            raise error
        if len(results) < self.num_workers:
            missing = sorted(set(range(self.num_workers)) - set(results))
            raise OperationTimeoutError(f"workers {missing} did not {what} within {self.deadline} s")
        return [results[i] for i in range(self.num_workers)]

    def close(self) -> None:
        """Close every worker's store (together: a distributed close meets at a barrier), then the cluster."""
        for inbox in self._inboxes:
            inbox.put(None)
        end = time.monotonic() + (_FAILURE_GRACE if self.broken else self.deadline)
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))
        self._cluster.close()


@dataclasses.dataclass(frozen=True)
class StoreSpec:
    """A kind of store under test.

    Attributes:
        id: a name for test ids (``'dist_sync-2servers'``).
        store_type: what the stores are (decides which checks apply).
        open: makes a new group of such stores.
    """

    id: str
    store_type: StoreType
    open: Callable[[], StoreGroup]


def local_store(name: str = "local", **settings: Any) -> StoreSpec:
    """A single-process pskv store (``'local'``, ``'device'``), made by :func:`pskv.create`.

    ``settings`` are :class:`~pskv.config.Config` fields (``engine_threads=2``, ...).
    """
    return StoreSpec(name, StoreType.parse(name), lambda: LocalGroup(lambda: create(name, **settings)))


def cluster_store(name: str, num_servers: int, num_workers: int, *, id: str | None = None,
                  deadline: float = 20.0, **cluster_settings: Any) -> StoreSpec:
    """A distributed pskv store (``'dist_sync'``, ``'dist_async'``, ``'byteps'``, ...) in an in-process cluster.

    ``cluster_settings`` are :class:`~pskv.config.ClusterConfig` fields (``bigarray_bound``, ...).
    """
    def open_group() -> StoreGroup:
        return ClusterGroup(lambda cfg: create(name, cluster=cfg), num_servers, num_workers, deadline,
                            **cluster_settings)
    label = id or f"{name}-{num_servers}s{num_workers}w"
    return StoreSpec(label, StoreType.parse(name), open_group)


class StorePool:
    """One open group per spec, shared by the checks that leave a store as they found it."""

    def __init__(self) -> None:
        self._groups: dict[str, StoreGroup] = {}

    def get(self, spec: StoreSpec) -> StoreGroup:
        """The open group of ``spec`` (a new one if there is none or the last one broke)."""
        group = self._groups.get(spec.id)
        if group is not None and group.broken:
            self.discard(spec)
            group = None
        if group is None:
            group = self._groups[spec.id] = spec.open()
        return group

    def discard(self, spec: StoreSpec) -> None:
        """Close and forget the group of ``spec``."""
        group = self._groups.pop(spec.id, None)
        if group is not None:
            group.close()

    def close(self) -> None:
        """Close every group; the first error (if any) is raised after all were closed."""
        first: BaseException | None = None
        for spec_id in list(self._groups):
            try:
                self._groups.pop(spec_id).close()
            except BaseException as exc:  # noqa: BLE001 - close the others first
                first = first or exc
        if first is not None:
            raise first


def loopback_spec(name: str, num_servers: int, **cluster_settings: Any) -> StoreSpec:
    """A distributed store of one worker whose servers run in this process, without sockets
    (:func:`pskv.testing.loopback.loopback_store`)."""
    return StoreSpec(f"{name}-loopback-{num_servers}s", StoreType.parse(name),
                     lambda: LocalGroup(lambda: loopback_store(name, num_servers, **cluster_settings)))
