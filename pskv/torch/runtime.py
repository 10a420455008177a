"""``init`` / ``shutdown`` and the job's store: where ``pskv.torch``'s collectives run.

Horovod's PyTorch API is module-level (``hvd.init()``, then ``hvd.rank()``), so this
module holds one :class:`Runtime` per process between :func:`init` and :func:`shutdown`;
everything else in :mod:`pskv.torch` asks it for the store (:func:`current`).

Which store :func:`init` opens (the first that applies):

1. its ``store`` argument (a store type name, or a store the caller made);
2. the environment variable ``PSKV_TORCH_STORE`` (a store type name);
3. ``dist_sync`` in a worker of a job with servers (``pskv launch -s N``, N > 0:
   ``DMLC_NUM_SERVER``): the servers sum, as BytePS's do;
4. ``horovod``, the all-reduce store on torch.distributed: under ``pskv launch -s 0``,
   torchrun, SLURM or MPI, or a job of one process without any launcher.

Any pskv store type that offers ``pushpull`` and ``broadcast`` between processes works
(``dist_sync``, ``dist_sync_device``, ``byteps``, ``horovod``, ``nccl``); an
asynchronous one (``dist_async``) is refused: an all-reduce needs sync rounds.
"""

from __future__ import annotations

import atexit
import logging
from dataclasses import dataclass, field, replace
from typing import Any

from pskv.config import ClusterConfig, rank_env, torch_store_name
from pskv.errors import InvalidArgumentError, NotSupportedError
from pskv.kvstore import KVStoreBase, StoreType, create

__all__ = ["Runtime", "init", "shutdown", "is_initialized", "current", "size", "rank", "local_size", "local_rank",
           "cross_size", "cross_rank", "store", "STORE_ENV", "nccl_built", "cuda_built", "gloo_built", "gloo_enabled",
           "mpi_built", "mpi_enabled", "mpi_threads_supported", "rocm_built", "ddl_built", "ccl_built",
           "is_homogeneous", "adopt_view"]

#: The environment variable naming the store :func:`init` opens when given none.
STORE_ENV = "PSKV_TORCH_STORE"


@dataclass
class Runtime:
    """This process's store and what :mod:`pskv.torch.ops` keeps between calls.

    Attributes:
        store: the store every collective runs on.
        kind: its type (``StoreType``): ``servers`` says whether keys live on servers.
        local_size: processes on this host (the module functions :func:`cross_size` / :func:`cross_rank`
            derive the hosts, and this one's index, from it).
        state: per-module state other modules of :mod:`pskv.torch` hang here (names, handles),
            so that :func:`shutdown` forgets it all at once.
    """

    store: KVStoreBase
    kind: StoreType
    owned: bool
    local_size: int = 1
    state: dict[str, Any] = field(default_factory=dict)
    generation: int = 0  # how many times init() took a kept store back: each time, every name is new
    joining: bool = False  # admitted into a running elastic job, till its first commit: the members' keys exist

    def key(self, name: str) -> str:
        """The store key of ``name`` in this runtime: ``name`` itself, or ``name@G`` after the G-th re-init."""
        return name if self.generation == 0 else f"{name}@{self.generation}"

    @property
    def elastic(self) -> bool:
        """The store is a worker's of an elastic job (``pskv launch -n MIN:MAX``): it has a membership view."""
        return self.store.view is not None

    @property
    def servers(self) -> bool:
        """Keys live on servers (``dist_*``, ``byteps``): a key is declared before its first use."""
        return self.kind.distributed


_runtime: Runtime | None = None
_parked: Runtime | None = None  # a store with servers that shutdown() kept for the next init()


def _default_store_name() -> str:
    """The store type for :func:`init` without an argument (the module docstring's rules 2-4)."""
    named = torch_store_name()  # PSKV_TORCH_STORE (pskv.config: the only reader of the environment)
    if named:
        return named
    cluster = ClusterConfig.from_env()
    return "dist_sync" if cluster.num_servers > 0 and cluster.role == "worker" else "horovod"


def init(store: str | KVStoreBase | None = None, *, lazy: bool = True) -> None:
    """Start ``pskv.torch`` in this process: open (or adopt) the job's store. Idempotent.

    Args:
        store: a store type name (``'dist_sync'``, ``'byteps'``, ``'horovod'``, ``'nccl'``, ...), or a
            store this process made (not closed by :func:`shutdown`); default: see the module docstring.
        lazy: BytePS's ``init(lazy=False)``, accepted and ignored: the store is ready when ``init`` returns.

    Raises:
        NotSupportedError: an asynchronous or single-process store type.
        InvalidArgumentError: an unknown store type name.
        NodeFailedError, OperationTimeoutError: the job's other processes did not meet.
    """
    global _runtime, _parked
    if _runtime is not None:
        return
    if _parked is not None and (store is None or store == _parked.kind.name):
        _runtime, _parked = replace(_parked, state={}, generation=_parked.generation + 1), None
        return
    if isinstance(store, KVStoreBase):
        made, owned = store, False
    else:
        if store is not None and not isinstance(store, str):
            raise InvalidArgumentError(f"store must be a store type name or a store, got {type(store).__qualname__}")
        name = _default_store_name() if store is None else store
        kind = StoreType.parse(name)
        _check_kind(kind)
        made, owned = create(name), True
    kind = made.store_type
    try:
        _check_kind(kind)
    except NotSupportedError:
        if owned:
            made.close()
        raise
    joining = made.view is not None and made.view.cause != "start"  # admitted into a running elastic job
    _runtime = Runtime(made, kind, owned, local_size=_local_size(made), joining=joining)


def _local_size(store: KVStoreBase) -> int:
    """The launcher's ``LOCAL_WORLD_SIZE`` when it describes this job; 1 in an elastic job (whose worker ids
    are slots, not ranks, and whose ranks are not numbered host by host)."""
    if store.view is not None:
        return 1
    ranks = rank_env()
    return max(1, ranks.local_world_size if ranks is not None and ranks.world_size == store.num_workers else 1)


def adopt_view() -> None:
    """After an elastic job's membership changed (``kv.commit()`` returned a view, or ``kv.restore()``):
    :func:`size` and :func:`rank` already read the store's new view; ``local_size`` is worked out again.
    Not ``shutdown(); init()`` (Horovod's reset): a re-init renames every key (``name@G``), and a worker
    that joined would name them apart from the others (:mod:`pskv.torch.elastic`)."""
    job = current()
    job.local_size = _local_size(job.store)


def _check_kind(kind: StoreType) -> None:
    if not kind.sync:
        raise NotSupportedError(f"pskv.torch needs a synchronous store: {kind.name!r} applies each push as it "
                                "arrives, so its pushpull is not an all-reduce (use dist_sync)")
    if not kind.multiprocess:
        raise NotSupportedError(f"pskv.torch needs a store of the job's processes (dist_sync, byteps, horovod, "
                                f"nccl), not {kind.name!r}")


def shutdown() -> None:
    """Close the store :func:`init` opened and forget every name and handle. Idempotent.

    A store given to :func:`init` is left open (its maker closes it). A store with servers
    is kept: its worker cannot join the job a second time, so a later :func:`init` without
    another store takes it back (Horovod's re-init), with every name new again: its keys
    are ``name@G`` after the G-th re-init (the same on every rank, which re-init alike; the
    old keys stay on the servers until the job ends). It leaves the job when the process
    exits (:mod:`pskv.kvstore.exit`).
    """
    global _runtime, _parked
    job, _runtime = _runtime, None
    if job is None or not job.owned:
        return
    if job.servers:
        _parked = job
    else:
        job.store.close()


@atexit.register
def _close_at_exit() -> None:
    """Interpreter exit: an all-reduce store :func:`init` opened is closed, its torch.distributed group shut down
    while the interpreter still runs (Horovod shuts down at exit too): left to the interpreter's teardown, a
    group's C++ threads may still be running when it is destroyed, which aborts the process ("terminate called
    without an active exception") after the program ended well. A store with servers leaves its job at exit
    by :mod:`pskv.kvstore.exit`."""
    job = _runtime
    if job is not None and job.owned and not job.servers:
        try:
            job.store.close()
        except Exception as exc:  # noqa: BLE001 - exiting anyway: say why closing failed
            logging.getLogger("pskv.torch").error("pskv.torch: could not close the %s store at exit: %s",
                                                  job.kind.name, exc)


def is_initialized() -> bool:
    """True between :func:`init` and :func:`shutdown`."""
    return _runtime is not None


def current() -> Runtime:
    """The runtime :func:`init` started.

    Raises:
        InvalidArgumentError: (a ValueError, as Horovod's) :func:`init` was not called, or :func:`shutdown` was.
    """
    if _runtime is None:
        raise InvalidArgumentError("pskv.torch has not been initialized; use pskv.torch.init() "
                                  "(hvd.init() in a Horovod script)")
    return _runtime


def store() -> KVStoreBase:
    """The store ``pskv.torch`` runs on (for pskv's own calls: ``barrier``, checkpoints, metrics)."""
    return current().store


def size() -> int:
    """Number of processes (workers) in the job."""
    return current().store.num_workers


def rank() -> int:
    """This process's rank, ``0 <= rank() < size()``."""
    return current().store.rank


def local_rank() -> int:
    """This process's index among the job's processes on its host."""
    return current().store.local_rank


def local_size() -> int:
    """Processes of the job on this host (the launcher's ``LOCAL_WORLD_SIZE``; 1 when none said)."""
    return current().local_size


def cross_size() -> int:
    """Hosts of the job, assuming the same number of processes on each (as Horovod's homogeneous case)."""
    job = current()
    return max(1, job.store.num_workers // job.local_size)


def cross_rank() -> int:
    """This host's index, assuming ranks are numbered host by host (``pskv launch``, torchrun, srun do)."""
    job = current()
    return job.store.rank // job.local_size


# -- Horovod's build questions, answered for pskv (scripts test them to pick options) ----------
def nccl_built() -> bool:
    """True where the ``nccl`` store can run: CUDA and torch.distributed's NCCL are present."""
    import torch
    import torch.distributed as dist
    return bool(torch.cuda.is_available() and dist.is_available() and dist.is_nccl_available())


def cuda_built() -> bool:
    """True where torch sees CUDA (pskv's stores take CUDA tensors then)."""
    import torch
    return bool(torch.cuda.is_available())


def gloo_built() -> bool:
    """True: the all-reduce store runs on torch.distributed's Gloo."""
    return True


def gloo_enabled() -> bool:
    """True when this job's store is an all-reduce store: ``horovod`` (Gloo), and also ``nccl``
    (NCCL, not Gloo); False with servers, with a local store or before init."""
    return _runtime is not None and _runtime.kind.allreduce


def mpi_built() -> bool:
    """False: pskv does not use MPI (``pskv launch --launcher mpi`` only starts processes through ``mpirun``)."""
    return False


mpi_enabled = mpi_threads_supported = rocm_built = ddl_built = ccl_built = mpi_built


def is_homogeneous() -> bool:
    """True: pskv assumes the same number of processes on every host (see :func:`cross_size`)."""
    return True
