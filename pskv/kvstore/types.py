"""``StoreType``: what a store type name means, parsed once by :func:`pskv.create`.

Every behaviour that depends on the type — is it distributed, are its rounds
synchronous, where does the local reduction run, can its servers run an optimizer —
is a field here, read by the stores, ``Trainer``, ``fit`` and the checkpoint helpers.
Nobody tests substrings of type names.

=========================  ===========  =====  =========  =================
name (aliases)             distributed  sync   on device  servers optimize
=========================  ===========  =====  =========  =================
``local`` (``local_update_cpu``, ``local_allreduce_cpu``)
                           no           yes    no         yes (in process)
``device`` (``local_allreduce_device``)
                           no           yes    yes        yes (in process)
``dist_sync`` (``dist``)   yes          yes    no         yes
``dist_sync_device`` (``dist_device_sync``)
                           yes          yes    yes        yes
``dist_async``             yes          no     no         yes
``dist_async_device``      yes          no     yes        yes
``byteps``                 yes          yes    no         no (they only sum)
``horovod``, ``nccl``      no (1)       yes    (2)        no (no servers)
=========================  ===========  =====  =========  =================

(1) ``horovod`` and ``nccl`` are ``allreduce`` types: several processes (torchrun's or
``pskv launch``'s ranks) but no servers or scheduler; ``pushpull`` and ``broadcast``
only (``summation_only``). (2) ``nccl`` sums CUDA tensors on the GPU, ``horovod`` on the CPU.

A custom store registered with :meth:`KVStoreBase.register` gets
:meth:`StoreType.custom`: not distributed, synchronous, no optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass

from pskv.errors import InvalidArgumentError

__all__ = ["StoreType", "BUILTIN_TYPES"]


@dataclass(frozen=True)
class StoreType:
    """The meaning of a store type name.

    Attributes:
        name: the name as given to ``create`` (lower-cased; an alias stays an alias).
        canonical: the name an alias stands for (``'dist'`` -> ``'dist_sync'``).
        distributed: workers, servers and a scheduler as separate processes.
        sync: every worker's push joins one round per step (MXNet's ``dist_sync``);
            False for ``dist_async`` (each push is applied as it arrives).
        on_device: values of several devices are summed on their device before they
            leave the process (``device`` / ``*_device``); else on the CPU.
        servers_optimize: the store can run an optimizer (``set_optimizer``).
        summation_only: the BytePS contract: ``pushpull`` and ``broadcast`` only.
        allreduce: an all-reduce between processes over torch.distributed, without servers
            (:mod:`pskv.kvstore.horovod`).
    """

    name: str
    canonical: str
    distributed: bool
    sync: bool = True
    on_device: bool = False
    servers_optimize: bool = True
    summation_only: bool = False
    allreduce: bool = False

    @property
    def multiprocess(self) -> bool:
        """The store spans the job's worker processes (``dist_*``, ``byteps``, ``horovod``, ``nccl``)."""
        return self.distributed or self.allreduce

    @classmethod
    def parse(cls, name: str) -> StoreType:
        """The type of a built-in name (case-insensitive).

        Raises:
            InvalidArgumentError: not one of pskv's own store types.
        """
        found = _TYPES.get(name.lower())
        if found is None:
            raise InvalidArgumentError(f"{name!r} is not one of pskv's store types ({', '.join(sorted(_TYPES))})")
        return found

    @classmethod
    def custom(cls, name: str) -> StoreType:
        """The type of a store class registered by the user under ``name``."""
        return cls(name, name, distributed=False, servers_optimize=False)


def _table() -> dict[str, StoreType]:
    local = {"local": ("local", False), "local_update_cpu": ("local", False), "local_allreduce_cpu": ("local", False),
             "device": ("device", True), "local_allreduce_device": ("device", True)}
    dist = {"dist": ("dist_sync", True, False), "dist_sync": ("dist_sync", True, False),
            "dist_sync_device": ("dist_sync_device", True, True), "dist_device_sync": ("dist_sync_device", True, True),
            "dist_async": ("dist_async", False, False), "dist_async_device": ("dist_async_device", False, True)}
    table = {n: StoreType(n, c, distributed=False, on_device=d) for n, (c, d) in local.items()}
    table.update({n: StoreType(n, c, distributed=True, sync=s, on_device=d) for n, (c, s, d) in dist.items()})
    table["byteps"] = StoreType("byteps", "byteps", distributed=True, servers_optimize=False, summation_only=True)
    for name, gpu in (("horovod", False), ("nccl", True)):
        table[name] = StoreType(name, name, distributed=False, on_device=gpu, servers_optimize=False,
                                summation_only=True, allreduce=True)
    return table


_TYPES = _table()

#: Every built-in store type name, aliases included (a custom store may not take one).
BUILTIN_TYPES: frozenset[str] = frozenset(_TYPES)
