"""The ``byteps`` store: a BytePS-style summation service on pskv's servers.

Servers only sum (no optimizer: ``is_capable`` is False for every known capability); workers use
``pushpull`` (an allreduce: every worker receives the sum of all workers' values) and
``broadcast`` (rank 0's value, or ``root_rank``'s, to everyone). A key is declared on its first use — the
first ``pushpull`` or ``broadcast`` of a key is collective, like BytePS's first blocking
push. ``local_rank`` is the worker's rank on its host, set by ``pskv launch``.

The store *holds* a :class:`~pskv.kvstore.dist.DistStore` and offers only that subset
of it; the cluster methods (``barrier``, ``join``, ``wait``, ``save_checkpoint``, ...)
are the distributed store's. ``init``, ``push``, ``pull``, ``row_sparse_pull`` and the
optimizer methods raise :class:`~pskv.errors.NotSupportedError`; ``metrics`` is the job's.
"""

from __future__ import annotations

from typing import Any, NoReturn

from pskv.arrays import describe, empty
from pskv.config import ClusterConfig, Config
from pskv.errors import NotSupportedError
from pskv.kvstore.base import KVStoreBase
from pskv.kvstore.dist import DistStore
from pskv.kvstore.elastic import View
from pskv.kvstore.engine import OpHandle
from pskv.kvstore.keys import Key, as_key_list, pair_up
from pskv.kvstore.types import StoreType
from pskv.metrics import JobMetrics
from pskv.optimizer import Optimizer

__all__ = ["BytePSStore"]


class BytePSStore(KVStoreBase):
    """Summation-only distributed store (``pskv.create('byteps')``).

    Args:
        name: the store type (``'byteps'``).
        config: local settings (kernels, engine).
        cluster: the cluster contract (default: from the environment).
    """

    def __init__(self, name: str = "byteps", config: Config | None = None,
                 cluster: ClusterConfig | None = None, context: Any = None) -> None:
        self._dist = DistStore(name, config, cluster, context)
        self._declared: set[Key] = set()  # every key of the store: only _declare creates keys

    # -- properties ------------------------------------------------------------------------
    @property
    def type(self) -> str:
        """The type name given to ``create``."""
        return self._dist.type

    @property
    def store_type(self) -> StoreType:
        """What the type means (summation only)."""
        return self._dist.store_type

    @property
    def rank(self) -> int:
        """This worker's rank."""
        return self._dist.rank

    @property
    def local_rank(self) -> int:
        """This worker's rank among the workers of its host (``PSKV_LOCAL_RANK``)."""
        return self._dist.local_rank

    @property
    def num_workers(self) -> int:
        """Number of workers in the job."""
        return self._dist.num_workers

    @property
    def is_recovery(self) -> bool:
        """True in a process that replaced a dead worker (see :attr:`DistStore.is_recovery`)."""
        return self._dist.is_recovery

    @property
    def resumed(self) -> dict[str, Any] | None:
        """The manifest of the checkpoint this job resumed from, or None (see :attr:`DistStore.resumed`)."""
        return self._dist.resumed

    @classmethod
    def is_capable(cls, capability: str) -> bool:
        """False for every known capability: the servers only sum.

        Raises:
            InvalidArgumentError: unknown capability, as for every store.
        """
        cls._capability(capability)
        return False

    # -- pushpull and broadcast ------------------------------------------------------------
    def _declare(self, key: Any, value: Any) -> None:
        """Create the keys not used before, as zeros shaped like ``value`` (collective)."""
        keys, single = as_key_list(key)
        fresh = [(k, vals[0]) for k, vals in pair_up(keys, single, value, "value") if k not in self._declared]
        if fresh:
            zeros = []
            for _, v in fresh:
                z = empty(describe(v), device="cpu")
                z[...] = 0
                zeros.append(z)
            self._dist.init([k for k, _ in fresh], zeros)
            self._declared.update(k for k, _ in fresh)

    def pushpull(self, key: Any, value: Any, out: Any = None, priority: int = 0, *, block: bool = True,
                 timeout: float | None = None) -> Any:  # KVStoreBase's overloads type the calls
        """Sum ``value`` over all workers into ``out`` (into ``value`` if out is None).

        The first call for a key declares it (collective).
        """
        self._declare(key, value)
        self._refuse_misfits(key, value)
        return self._dist.pushpull(key, value, out, priority, block=block, timeout=timeout)

    def _refuse_misfits(self, key: Any, value: Any) -> None:
        """A value of another dtype or size than its key's: the servers refuse it for the round.

        An allreduce every worker takes part in (horovod's semantics): this worker's store
        then refuses the call (ShapeMismatchError / DTypeMismatchError), and the other
        workers' pushpulls of that round fail at once with the same error naming this
        worker and both shapes, instead of waiting for it. A value of the same size and
        dtype but another shape is refused here only.
        """
        try:
            keys, single = as_key_list(key)
            pairs = pair_up(keys, single, value, "value")
        except Exception:  # noqa: BLE001 - malformed arguments: the store's own checks name them
            return
        for k, vals in pairs:
            for v in vals:
                try:
                    meta = describe(v)
                except Exception:  # noqa: BLE001 - not an array: the store's own checks name it
                    return
                if self._dist._refuse_push(k, meta):
                    break

    def refuse_push(self, key: Any, error: BaseException, value: Any = None) -> NoReturn:
        """:meth:`KVStoreBase.refuse_push` (:meth:`DistStore.refuse_push`); a key not declared yet: only ``error``."""
        self._dist.refuse_push(key, error, value)

    def broadcast(self, key: Any, value: Any, out: Any = None, priority: int = 0, *, block: bool = True,
                  timeout: float | None = None, root_rank: int = 0) -> Any:  # KVStoreBase's overloads type the calls
        """Rank ``root_rank``'s ``value`` into every ``out`` (into ``value`` if out is None)."""
        self._declare(key, value)  # the distributed store checks root_rank (at the meeting, for every worker)
        self._dist.broadcast(key, value, None, priority, block=True, timeout=timeout, root_rank=root_rank)
        target = value if out is None else out
        result: OpHandle | None = self._dist.pull(key, out=target, priority=priority, block=block, timeout=timeout)
        return result

    # -- not offered -----------------------------------------------------------------------
    def _unsupported(self, op: str) -> NotSupportedError:
        return NotSupportedError(f"the byteps store offers pushpull and broadcast, not {op}")

    def init(self, key: Any, value: Any, *, summed: bool = False) -> None:
        """Not part of the BytePS API: keys are declared by their first pushpull/broadcast."""
        raise NotSupportedError("the byteps store declares keys on first use; call pushpull or broadcast")

    def set_optimizer(self, optimizer: Optimizer) -> None:
        """Not available: BytePS servers only sum; run the optimizer on the workers."""
        raise NotSupportedError("byteps servers only sum; run the optimizer on the workers")

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Not available: the servers hold no optimizer state."""
        raise NotSupportedError("byteps servers hold no optimizer state")

    def load_optimizer_states(self, fname: str) -> None:
        """Not available: the servers hold no optimizer state."""
        raise NotSupportedError("byteps servers hold no optimizer state")

    # -- the distributed store's cluster methods -------------------------------------------
    def barrier(self) -> None:
        """Wait until every worker reached the barrier (see :meth:`DistStore.barrier`)."""
        self._dist.barrier()

    def join(self, timeout: float | None = None) -> None:
        """This worker has no more data (collective; see :meth:`DistStore.join`)."""
        self._dist.join(timeout)

    def wait(self, keys: Any = None, timeout: float | None = None) -> None:
        """Wait for outstanding operations (on ``keys``, if given)."""
        self._dist.wait(keys, timeout)

    def save_checkpoint(self, path: str | None = None, meta: Any = None) -> str:
        """Save the servers' sums as a checkpoint (collective; see :meth:`DistStore.save_checkpoint`)."""
        return self._dist.save_checkpoint(path, meta)

    def send_command_to_servers(self, head: int, body: str) -> None:
        """Run a controller on every server (see :meth:`DistStore.send_command_to_servers`)."""
        self._dist.send_command_to_servers(head, body)

    def num_dead_node(self, node_id: int, timeout: float = 60) -> int:
        """Nodes of group ``node_id`` silent for more than ``timeout`` seconds."""
        return self._dist.num_dead_node(node_id, timeout)

    def metrics(self, timeout: float = 5.0) -> JobMetrics:
        """The job's metrics now, every node's (see :meth:`DistStore.metrics`)."""
        return self._dist.metrics(timeout)

    def set_barrier_before_exit(self, barrier_before_exit: bool = True) -> None:
        """Whether closing the store first waits at a barrier of all workers."""
        self._dist.set_barrier_before_exit(barrier_before_exit)

    @property
    def view(self) -> View | None:
        """An elastic job's view (see :attr:`DistStore.view`)."""
        return self._dist.view

    def commit(self) -> View | None:
        """An elastic job's commit (collective; see :meth:`DistStore.commit`)."""
        return self._dist.commit()

    def restore(self) -> View:
        """An elastic job's restore after a departure (see :meth:`DistStore.restore`)."""
        return self._dist.restore()

    def close(self) -> None:
        """Finish queued work, meet the other workers (unless disabled), leave the job."""
        self._dist.close()

    def __enter__(self) -> BytePSStore:
        return self
