"""The key-value store API: ``create`` and the store classes.

Layering: ``kvstore`` sits above ``arrays``, ``optimizer`` and (for the distributed
stores) ``worker``; it is the surface users see.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from pskv.config import ClusterConfig, Config, rank_env
from pskv.errors import InvalidArgumentError, InvalidTypeError
from pskv.kvstore.base import KVStoreBase
from pskv.kvstore.byteps import BytePSStore
from pskv.kvstore.dist import DistStore
from pskv.kvstore.engine import OpHandle
from pskv.kvstore.horovod import AllreduceStore
from pskv.kvstore.local import LocalStore
from pskv.kvstore.types import BUILTIN_TYPES, StoreType
from pskv.logs import show_records
from pskv.roles import run_role

#: The distributed store type names (aliases included).
DIST_TYPES = tuple(sorted(n for n in BUILTIN_TYPES if StoreType.parse(n).distributed))

__all__ = ["AllreduceStore", "BytePSStore", "DIST_TYPES", "DistStore", "KVStoreBase", "LocalStore", "OpHandle", "StoreType",
           "create", "known_types"]


def run_role_if_not_worker(store_type: StoreType, config: Config | None,
                           cluster: ClusterConfig | None) -> KVStoreBase:
    """A worker gets its distributed store; a server or scheduler process serves its role, then **exits**.

    Cluster managers often start the same command for every role (MXNet did the same),
    so ``create('dist_*')`` in a process whose ``DMLC_ROLE`` is ``server`` or
    ``scheduler`` runs that role until the job ends and exits the process (``sys.exit``
    with the role's status): the side effect :func:`create` documents.
    """
    cluster = ClusterConfig.from_env() if cluster is None else cluster
    if cluster.role == "worker":
        # pskv's records as this worker's (a worker's default level: WARNING; the rank once registered)
        show_records("worker" if cluster.rank < 0 else f"worker {cluster.rank}", cluster.log_level, "WARNING")
        store: KVStoreBase = (BytePSStore(store_type.name, config, cluster) if store_type.summation_only
                              else DistStore(store_type.name, config, cluster))
        show_records(f"worker {store.rank}", cluster.log_level, "WARNING")
        return store
    sys.exit(run_role(cluster))


def known_types() -> list[str]:
    """Every name ``create`` accepts: pskv's store types and registered custom ones."""
    return sorted(BUILTIN_TYPES | set(KVStoreBase.kv_registry))


def create(name: str = "local", *, config: Config | None = None, cluster: ClusterConfig | None = None,
           **settings: Any) -> KVStoreBase:
    """Create a key-value store.

    Args:
        name: ``'local'`` (values reduced on the CPU), ``'device'`` (reduced on the
            values' device, e.g. CUDA tensors), MXNet's aliases
            (``'local_update_cpu'``, ``'local_allreduce_cpu'``,
            ``'local_allreduce_device'``), ``'horovod'`` / ``'nccl'`` (an all-reduce on
            torch.distributed between the ranks torchrun, ``pskv launch``, SLURM or MPI
            started: :mod:`pskv.kvstore.horovod`), or the lower-cased name of a class registered
            with :meth:`KVStoreBase.register`. Case-insensitive.
        config: settings for pskv's own stores (default: from the environment).
        cluster: the cluster contract of a ``dist_*`` store (default: from the
            ``DMLC_*`` environment that ``pskv launch`` sets).
        **settings: individual :class:`~pskv.config.Config` fields overriding the
            environment, e.g. ``engine_threads=4``.

    A distributed name (``dist_*``, ``byteps``) in a process whose ``DMLC_ROLE`` is
    ``server`` or ``scheduler`` does not return: it serves that role until the job ends
    and exits the process (:func:`run_role_if_not_worker`), as MXNet did.

    Raises:
        InvalidTypeError: ``name`` is not a string.
        InvalidArgumentError: unknown store type (the message lists the known ones), or
            an unknown setting.
    """
    if not isinstance(name, str):
        raise InvalidTypeError(f"store type name must be a string, got {type(name).__qualname__}")
    lname = name.lower()
    if settings:
        config = Config.from_env(**settings) if config is None else _with(config, settings)
    if lname in BUILTIN_TYPES:
        store_type = StoreType.parse(lname)
        if store_type.allreduce:  # torch.distributed's ranks: torchrun, pskv launch, SLURM, MPI
            return AllreduceStore(lname, config, rank_env())
        if not store_type.distributed:
            return LocalStore(lname, config)
        return run_role_if_not_worker(store_type, config, cluster)
    if lname in KVStoreBase.kv_registry:
        return KVStoreBase.kv_registry[lname]()
    raise InvalidArgumentError(f"unknown store type {name!r}; known types: {', '.join(known_types())}")


def _with(config: Config, settings: dict[str, Any]) -> Config:
    unknown = set(settings) - {f.name for f in dataclasses.fields(Config)}
    if unknown:
        raise InvalidArgumentError(f"unknown setting(s) {sorted(unknown)}")
    return dataclasses.replace(config, **settings)
