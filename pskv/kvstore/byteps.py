"""The ``byteps`` store: a BytePS-style summation service on pskv's servers.

Servers only sum (no optimizer: ``is_capable`` is False for everything); workers use
``pushpull`` (an allreduce: every worker receives the sum of all workers' values) and
``broadcast`` (rank 0's value to everyone). A key is declared on its first use — the
first ``pushpull`` or ``broadcast`` of a key is collective, like BytePS's first blocking
push. ``local_rank`` (inherited from :class:`DistStore`) is the worker's rank on its host,
set by ``pskv launch``.
"""

from __future__ import annotations

from typing import Any

from pskv.arrays import describe, empty
from pskv.errors import NotSupportedError
from pskv.kvstore.dist import DistStore
from pskv.kvstore.engine import OpHandle
from pskv.kvstore.keys import as_key_list, pair_up

__all__ = ["BytePSStore"]


class BytePSStore(DistStore):
    """Summation-only distributed store (``pskv.create('byteps')``)."""

    @classmethod
    def is_capable(cls, capability: str) -> bool:
        """False for every capability: the servers only sum.

        Raises:
            InvalidArgumentError: unknown capability.
        """
        cls._capability(capability)
        return False

    def _declare(self, key: Any, value: Any) -> None:
        keys, single = as_key_list(key)
        fresh = [(k, vals[0]) for k, vals in pair_up(keys, single, value, "value") if k not in self._keys]
        if fresh:
            zeros = []
            for _, v in fresh:
                z = empty(describe(v), device="cpu")
                z[...] = 0
                zeros.append(z)
            super().init([k for k, _ in fresh], zeros)

    def pushpull(self, key: Any, value: Any, out: Any = None, priority: int = 0, *, block: bool = True,
                 timeout: float | None = None) -> OpHandle | None:
        """Sum ``value`` over all workers into ``out`` (into ``value`` if out is None).

        The first call for a key declares it (collective).
        """
        self._declare(key, value)
        return super().pushpull(key, value, out, priority, block=block, timeout=timeout)

    def init(self, key: Any, value: Any, *, summed: bool = False) -> None:
        """Not part of the BytePS API: keys are declared by their first pushpull/broadcast."""
        raise NotSupportedError("the byteps store declares keys on first use; call pushpull or broadcast")

    def push(self, key: Any, value: Any, priority: int = 0, **kwargs: Any) -> Any:
        """Not part of the BytePS API; use :meth:`pushpull`."""
        raise NotSupportedError("the byteps store offers pushpull and broadcast, not push")

    def pull(self, key: Any, out: Any = None, priority: int = 0, **kwargs: Any) -> Any:
        """Not part of the BytePS API; use :meth:`pushpull`."""
        raise NotSupportedError("the byteps store offers pushpull and broadcast, not pull")

    def broadcast(self, key: Any, value: Any, out: Any = None, priority: int = 0, *, block: bool = True,
                  timeout: float | None = None) -> OpHandle | None:
        """Rank 0's ``value`` into every ``out`` (into ``value`` if out is None)."""
        self._declare(key, value)
        DistStore.broadcast(self, key, value, None, priority, block=True, timeout=timeout)
        target = value if out is None else out
        return DistStore.pull(self, key, out=target, priority=priority, block=block, timeout=timeout)

    def set_optimizer(self, optimizer: Any) -> None:
        """Not available: BytePS servers only sum; run the optimizer on the workers."""
        raise NotSupportedError("byteps servers only sum; run the optimizer on the workers")

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Not available: the servers hold no optimizer state."""
        raise NotSupportedError("byteps servers hold no optimizer state")

    def load_optimizer_states(self, fname: str) -> None:
        """Not available: the servers hold no optimizer state."""
        raise NotSupportedError("byteps servers hold no optimizer state")
