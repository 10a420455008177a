"""``KVStoreBase``: the interface every store implements, and the registry of custom stores.

The abstract methods are MXNet's ``KVStoreBase`` interface (what a custom store such
as a BytePS or Horovod adapter must provide). ``init``/``push``/``pull`` and friends
have defaults that raise :class:`~pskv.errors.NotSupportedError`, because a
summation-only store need not offer them. The cluster methods (``barrier``,
``num_dead_node``, ...) have single-process defaults.
"""

from __future__ import annotations

import abc
import operator
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal, NoReturn, TypeVar, overload

from pskv._registry import Registry
from pskv.errors import InvalidArgumentError, NotSupportedError
from pskv.kvstore.engine import OpHandle
from pskv.kvstore.keys import Keys, Outs, Values
from pskv.kvstore.types import BUILTIN_TYPES, StoreType
from pskv.metrics import JobMetrics
from pskv.optimizer import Optimizer

__all__ = ["KVStoreBase", "RESERVED_NAMES"]

T = TypeVar("T", bound=type)

#: Store type names that pskv itself provides; a custom class may not take them.
RESERVED_NAMES: frozenset[str] = BUILTIN_TYPES

#: MXNet's node-group ids for num_dead_node: 1 scheduler, 2 servers, 4 workers (and sums).
NODE_GROUPS: frozenset[int] = frozenset(range(1, 8))


class KVStoreBase(abc.ABC):
    """Base class of every key-value store.

    Subclass it and decorate the subclass with :meth:`KVStoreBase.register` to make
    ``pskv.create(<lower-cased class name>)`` build it (with no arguments).
    """

    #: Capability: the store can run an optimizer (``set_optimizer``).
    OPTIMIZER: ClassVar[str] = "optimizer"
    #: Capability: the store supports ``row_sparse_pull``.
    ROW_SPARSE_PULL: ClassVar[str] = "row_sparse_pull"
    #: Capability: the store compresses pushed gradients (``set_gradient_compression``).
    GRADIENT_COMPRESSION: ClassVar[str] = "gradient_compression"
    #: Every capability name ``is_capable`` understands.
    CAPABILITIES: ClassVar[frozenset[str]] = frozenset({"optimizer", "row_sparse_pull", "gradient_compression"})

    #: Custom store classes by lower-cased name (filled by :meth:`register`; the rule: pskv._registry).
    kv_registry: ClassVar[Registry[type[KVStoreBase]]] = Registry("store type")

    @staticmethod
    def register(klass: T) -> T:
        """Class decorator: make ``pskv.create(klass.__name__.lower())`` build ``klass()``.

        Registering the same class again (a reloaded module) replaces it.

        Raises:
            InvalidArgumentError: ``klass`` is not a KVStoreBase subclass, its name is
                one of pskv's own store types, or a different class holds the name.
        """
        if not (isinstance(klass, type) and issubclass(klass, KVStoreBase)):
            raise InvalidArgumentError(f"register() needs a KVStoreBase subclass, got {klass!r}")
        name = klass.__name__.lower()
        if name in RESERVED_NAMES:
            raise InvalidArgumentError(f"store type name {name!r} is reserved by pskv; rename the class")
        KVStoreBase.kv_registry.add(name, klass)
        return klass

    @classmethod
    def _capability(cls, capability: str) -> str:
        """Normalise a capability name.

        Raises:
            InvalidArgumentError: unknown capability (the message lists the known ones).
        """
        cap = str(capability).lower()
        if cap not in KVStoreBase.CAPABILITIES:
            raise InvalidArgumentError(
                f"Unknown capability: {capability!r}; known: {', '.join(sorted(KVStoreBase.CAPABILITIES))}"
            )
        return cap

    # -- MXNet's abstract interface -----------------------------------------------------
    @overload
    def broadcast(self, key: Keys, value: Values, out: Outs | None = None, priority: int = 0, *, block: Literal[True] = True, timeout: float | None = None, root_rank: int = 0) -> None: ...
    @overload
    def broadcast(self, key: Keys, value: Values, out: Outs | None = None, priority: int = 0, *, block: Literal[False], timeout: float | None = None, root_rank: int = 0) -> OpHandle: ...
    @overload
    def broadcast(self, key: Keys, value: Values, out: Outs | None = None, priority: int = 0, *, block: bool, timeout: float | None = None, root_rank: int = 0) -> OpHandle | None: ...
    @abc.abstractmethod
    def broadcast(self, key: Keys, value: Values, out: Outs | None = None, priority: int = 0, *, block: bool = True, timeout: float | None = None, root_rank: int = 0) -> OpHandle | None:
        """Write ``value`` (rank ``root_rank``'s, in a cluster) into the store and into every ``out``.

        ``root_rank``: the worker whose value everyone gets (every worker passes the same);
        a single-process store has rank 0 only.
        """

    def _root_rank(self, root_rank: object) -> int:
        """``root_rank`` checked against this store's ranks.

        Raises:
            InvalidArgumentError: not an int in ``[0, num_workers)``.
        """
        if isinstance(root_rank, bool) or not hasattr(root_rank, "__index__"):
            raise InvalidArgumentError(f"root_rank must be an int, got {type(root_rank).__qualname__}")
        root = operator.index(root_rank)  # type: ignore[arg-type]  # has __index__
        if not 0 <= root < self.num_workers:
            raise InvalidArgumentError(f"root_rank {root} is not a worker of this {self.type!r} store "
                                       f"(ranks 0..{self.num_workers - 1})")
        return root

    @overload
    def pushpull(self, key: Keys, value: Values, out: Outs | None = None, priority: int = 0, *, block: Literal[True] = True, timeout: float | None = None) -> None: ...
    @overload
    def pushpull(self, key: Keys, value: Values, out: Outs | None = None, priority: int = 0, *, block: Literal[False], timeout: float | None = None) -> OpHandle: ...
    @overload
    def pushpull(self, key: Keys, value: Values, out: Outs | None = None, priority: int = 0, *, block: bool, timeout: float | None = None) -> OpHandle | None: ...
    @abc.abstractmethod
    def pushpull(self, key: Keys, value: Values, out: Outs | None = None, priority: int = 0, *, block: bool = True, timeout: float | None = None) -> OpHandle | None:
        """Push ``value`` and pull the result into ``out`` (into ``value`` if out is None)."""

    @abc.abstractmethod
    def set_optimizer(self, optimizer: Optimizer) -> None:
        """Run ``optimizer`` on every push (in the store)."""

    @classmethod
    @abc.abstractmethod
    def is_capable(cls, capability: str) -> bool:
        """Whether this store type offers ``capability`` (see :attr:`CAPABILITIES`)."""

    @abc.abstractmethod
    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Save the optimizer state (and config, if ``dump_optimizer``) to ``fname``."""

    @abc.abstractmethod
    def load_optimizer_states(self, fname: str) -> None:
        """Load optimizer state saved by :meth:`save_optimizer_states`."""

    @property
    @abc.abstractmethod
    def type(self) -> str:
        """The store's type name (as given to ``create``, lower-cased)."""

    @property
    def store_type(self) -> StoreType:
        """What the type means (distributed? sync? reduced on device? servers optimize?).

        pskv's stores return their parsed :class:`StoreType`; a custom store is
        :meth:`StoreType.custom` (one process, synchronous, no optimizer) unless it
        overrides this.
        """
        try:
            return StoreType.parse(self.type)
        except InvalidArgumentError:
            return StoreType.custom(self.type)

    @property
    @abc.abstractmethod
    def rank(self) -> int:
        """This worker's rank in ``[0, num_workers)``."""

    @property
    @abc.abstractmethod
    def num_workers(self) -> int:
        """Number of worker processes."""

    # -- data operations a store may offer ---------------------------------------------
    def _unsupported(self, op: str) -> NotSupportedError:
        return NotSupportedError(f"store type {self.type!r} does not support {op}")

    def refuse_push(self, key: Any, error: BaseException, value: Any = None) -> NoReturn:
        """Refuse this worker's part in a collective ``pushpull`` of ``key``, on every worker, raising ``error`` here.

        For a caller that checks a value before the store sees it (``pskv.torch``: a tensor
        whose dtype or size is not its name's) and must not leave the others waiting: it
        calls this instead of ``pushpull``. The other workers' ``pushpull`` of ``key`` in
        the same round (the same call, on the all-reduce stores) fails at once with an error
        naming this worker; afterwards the key works on, as if nobody had called (the refused
        round changes no value and counts alike on every worker). ``value``: what this worker
        was given (described in the others' error where the store can), or None.

        Raises:
            error: on the stores that support it (``dist_sync``, ``dist_sync_device``,
                ``byteps``, ``horovod``, ``nccl``), once the others are told.
            NotSupportedError: the single-process stores (``local``, ``device``, ...) and custom
                stores (nobody to tell). The asynchronous ``dist_async`` and ``dist_async_device``
                (no rounds to fail) raise ``error`` without telling the others.
        """
        raise self._unsupported("refuse_push")

    def set_gradient_compression(self, compression_params: Mapping[str, Any]) -> None:
        """Compress pushed gradients (see :meth:`pskv.kvstore.frontend.StoreFrontEnd.set_gradient_compression`)."""
        raise self._unsupported("set_gradient_compression")

    def init(self, key: Keys, value: Values, *, summed: bool = False) -> None:
        """Create keys with initial values (see the concrete store).

        ``summed=True``: pushes to these keys store their sum even when an optimizer runs.
        """
        raise self._unsupported("init")

    @overload
    def push(self, key: Keys, value: Values, priority: int = 0, *, block: Literal[True] = True, timeout: float | None = None) -> None: ...
    @overload
    def push(self, key: Keys, value: Values, priority: int = 0, *, block: Literal[False], timeout: float | None = None) -> OpHandle: ...
    @overload
    def push(self, key: Keys, value: Values, priority: int = 0, *, block: bool, timeout: float | None = None) -> OpHandle | None: ...
    def push(self, key: Keys, value: Values, priority: int = 0, *, block: bool = True, timeout: float | None = None) -> OpHandle | None:
        """Push values into the store (see the concrete store); ``block=False`` returns a handle."""
        raise self._unsupported("push")

    @overload
    def pull(self, key: Keys, out: Outs | None = None, priority: int = 0, *, block: Literal[True] = True, timeout: float | None = None) -> Any: ...
    @overload
    def pull(self, key: Keys, out: Outs | None = None, priority: int = 0, *, block: Literal[False], timeout: float | None = None) -> OpHandle: ...
    @overload
    def pull(self, key: Keys, out: Outs | None = None, priority: int = 0, *, block: bool, timeout: float | None = None) -> Any: ...
    def pull(self, key: Keys, out: Outs | None = None, priority: int = 0, *, block: bool = True, timeout: float | None = None) -> Any:
        """Pull values out of the store (new arrays if ``out`` is None); ``block=False`` returns a handle."""
        raise self._unsupported("pull")

    @overload
    def row_sparse_pull(self, key: Keys, out: Outs | None = None, priority: int = 0, row_ids: Any = None, *, block: Literal[True] = True, timeout: float | None = None) -> Any: ...
    @overload
    def row_sparse_pull(self, key: Keys, out: Outs | None = None, priority: int = 0, row_ids: Any = None, *, block: Literal[False], timeout: float | None = None) -> OpHandle: ...
    @overload
    def row_sparse_pull(self, key: Keys, out: Outs | None = None, priority: int = 0, row_ids: Any = None, *, block: bool, timeout: float | None = None) -> Any: ...
    def row_sparse_pull(self, key: Keys, out: Outs | None = None, priority: int = 0, row_ids: Any = None, *, block: bool = True, timeout: float | None = None) -> Any:
        """Pull selected rows (see the concrete store); ``block=False`` returns a handle."""
        raise self._unsupported("row_sparse_pull")

    def restore_rows(self, key: Any, ids: Any, rows: Any) -> None:
        """Make the row-sparse ``key`` hold exactly ``rows`` at the sorted unique ``ids`` (its present rows from
        now on, every other row zero), as a training checkpoint saved them (:mod:`pskv.parallel.checkpoint`).

        An optional capability: the single-process stores offer it (a distributed store's servers restore
        their rows from their own checkpoint when they start).

        Raises:
            NotSupportedError: this store does not restore rows (the default).
        """
        raise self._unsupported("restore_rows")

    # -- an elastic job's calls (pskv launch -n MIN:MAX; the distributed stores') ---------
    @property
    def view(self) -> Any:
        """An elastic job's membership view (:class:`~pskv.protocol.bodies.View`); None in every other job."""
        return None

    def commit(self) -> Any:
        """An elastic job's commit (see :meth:`pskv.kvstore.dist_job.DistJob.commit`).

        Raises:
            NotSupportedError: the job is not elastic (the default).
        """
        raise NotSupportedError(f"commit() is for an elastic job (pskv launch -n MIN:MAX); this {self.type} "
                                "store's job is not elastic")

    def restore(self) -> Any:
        """After :class:`~pskv.errors.MembershipChangedError`, an elastic job's restore (see
        :meth:`pskv.kvstore.dist_job.DistJob.restore`).

        Raises:
            NotSupportedError: the job is not elastic (the default).
        """
        raise NotSupportedError(f"restore() is for an elastic job (pskv launch -n MIN:MAX); this {self.type} "
                                "store's job is not elastic")

    def set_updater(self, updater: Callable[[Any, Any, Any], None]) -> None:
        """Install ``updater(key, merged, stored)`` (see the concrete store)."""
        raise self._unsupported("set_updater")

    def _set_updater(self, updater: Callable[[Any, Any, Any], None]) -> None:
        """MXNet's name for :meth:`set_updater`."""
        self.set_updater(updater)

    # -- cluster operations: single-process defaults -----------------------------------
    @property
    def local_rank(self) -> int:
        """This worker's rank among the workers on its host (0 in one process)."""
        return 0

    def barrier(self) -> None:
        """Wait until every worker reached the barrier (returns at once in one process)."""
        return None

    def _barrier(self) -> None:
        """MXNet's name for :meth:`barrier`."""
        self.barrier()

    def save_checkpoint(self, path: str | None = None, meta: Any = None) -> str:
        """Save the servers' state (values, optimizer state, rounds) as a checkpoint directory.

        Only distributed stores have servers to save; see :meth:`DistStore.save_checkpoint`.

        Raises:
            NotSupportedError: this store has no servers (save your arrays and
                ``save_optimizer_states`` instead).
        """
        raise NotSupportedError(f"the {self.type!r} store has no servers to checkpoint; save the values you pull "
                                "and use save_optimizer_states")

    @property
    def is_recovery(self) -> bool:
        """True in a process that replaced a dead worker of a running distributed job."""
        return False

    @property
    def resumed(self) -> dict[str, Any] | None:
        """The manifest of the checkpoint this job resumed from (its ``meta`` included), or None."""
        return None

    def join(self, timeout: float | None = None) -> None:
        """Declare that this worker has no more data for now (uneven data across workers).

        In a distributed sync store, sync rounds then complete without this worker (it
        contributes nothing to the sums) while the others go on pushing; the call
        returns when every worker has joined, after which rounds need everyone again.
        Call it at the end of every epoch whose batch counts may differ between workers.
        In one process it waits for this store's outstanding operations only.
        """
        self.wait(timeout=timeout)

    def send_command_to_servers(self, head: int, body: str) -> None:
        """Send a command to every server's controller; a store without servers ignores it."""
        return None

    def _send_command_to_servers(self, head: int, body: str) -> None:
        """MXNet's name for :meth:`send_command_to_servers`."""
        self.send_command_to_servers(head, body)

    def num_dead_node(self, node_id: int, timeout: float = 60) -> int:
        """Number of dead nodes in a node group (1 scheduler, 2 servers, 4 workers; sums).

        A single-process store has no other nodes, so the answer is 0.

        Raises:
            InvalidArgumentError: ``node_id`` is not a group id in 1..7 or timeout < 0.
        """
        if isinstance(node_id, bool) or not isinstance(node_id, int) or node_id not in NODE_GROUPS:
            raise InvalidArgumentError(
                f"node_id must be a node group id in 1..7 (1 scheduler, 2 servers, 4 workers, or a sum), got {node_id!r}"
            )
        if timeout < 0:
            raise InvalidArgumentError(f"timeout must be >= 0, got {timeout}")
        return 0

    def metrics(self, timeout: float = 5.0) -> JobMetrics:
        """The job's metrics now, every node's, as ``pskv top`` shows them (:mod:`pskv.metrics`).

        An optional capability: the stores with a scheduler (``dist_*``, ``byteps``) offer it.

        Raises:
            NotSupportedError: this store has no scheduler to ask (the default).
            OperationTimeoutError: the scheduler did not answer within ``timeout`` seconds.
        """
        raise NotSupportedError(f"the {self.type!r} store has no scheduler to report a job's metrics; "
                                "pskv.metrics.snapshot reads a job's scheduler")

    def set_barrier_before_exit(self, barrier_before_exit: bool = True) -> None:
        """Whether closing the store first waits at a barrier of all workers."""
        self._barrier_before_exit = bool(barrier_before_exit)

    def wait(self, keys: Keys | None = None, timeout: float | None = None) -> None:
        """Wait for outstanding non-blocking operations (none in a synchronous store)."""
        return None

    def close(self) -> None:
        """Release the store's resources. Later key and optimizer operations (``init``, ``push``,
        ``pull``, ``set_optimizer``, ...) raise StoreClosedError; ``wait`` and ``close`` return."""
        return None

    def __enter__(self) -> KVStoreBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
