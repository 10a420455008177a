"""The ``horovod`` and ``nccl`` stores: an all-reduce store on torch.distributed (no servers).

``pskv.create('horovod')`` (MXNet 2.0's name) sums over the job's processes with Gloo
(CPU tensors and NumPy arrays) and NCCL (CUDA tensors: a second group, made by the first
call with CUDA values); ``pskv.create('nccl')`` with NCCL only (CPU values are staged on
the rank's GPU, ``cuda:<local_rank>``), only where CUDA is present. The surface is what
makes sense without servers, MXNet's ``Horovod`` store's:

* ``pushpull(key, value, out=None)`` — every rank gets the sum of all ranks' values (in
  place when ``out`` is None). A key's list of values (one per device) is summed on this
  rank first and every out gets the total, as in the other pskv stores (MXNet's horovod
  store all-reduces each list element on its own);
* ``broadcast(key, value, out=None, root_rank=0)`` — rank ``root_rank``'s value into every
  out (into ``value`` when ``out`` is None; the root's ``value`` is never changed);
* ``refuse_push(key, error)`` — this rank's share of the others' ``pushpull`` is a refusal:
  they raise CollectiveMismatchError naming ``error``, this rank raises ``error``;
* ``rank``, ``num_workers``, ``local_rank``, ``barrier()``, ``is_capable()`` (False for
  every known capability: no optimizer, no row-sparse pulls, no compression; an unknown one raises);
* ``init``, ``push``, ``pull``, ``row_sparse_pull``, the optimizer and checkpoint calls raise
  :class:`~pskv.errors.NotSupportedError` naming the call: nothing is stored between calls.

Every call is a collective: every rank makes the same calls in the same order (keys,
shapes, dtypes and ``root_rank`` alike), else every rank raises
:class:`~pskv.errors.CollectiveMismatchError` (:mod:`pskv.kvstore.torchgroup`). A rank whose
arguments are refused (a shape, an out, a ``root_rank``) still meets the others, who then
raise CollectiveMismatchError naming its error; it raises its own. The keys of
one call travel together: one all-reduce per dtype, one broadcast per call. Calls run
one at a time in call order on the store's engine thread (``priority`` is checked but
cannot reorder collectives); ``block=False`` returns a handle. Every wait is bounded by
the store's ``default_timeout`` (``PSKV_DEFAULT_TIMEOUT``), which is also the group's
rendezvous and collective timeout; a rank that dies fails the others' calls with
:class:`~pskv.errors.NodeFailedError` naming it.

Ranks come from :func:`pskv.config.rank_env` (``pskv launch``, torchrun, SLURM, Open MPI);
without rank variables the store is a group of one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Protocol

import numpy as np

from pskv.arrays import describe
from pskv.config import Config
from pskv.errors import (
    CollectiveMismatchError,
    InvalidArgumentError,
    KVStoreError,
    NotSupportedError,
    UnsupportedValueError,
)
from pskv.kvstore.checks import check_like, check_priority
from pskv.kvstore.frontend import StoreFrontEnd
from pskv.kvstore.keys import Key, merge_repeats, pair_up
from pskv.kvstore.torchgroup import GroupSpec, TorchGroup, load_torch
from pskv.kvstore.types import StoreType
from pskv.optimizer import Optimizer

__all__ = ["AllreduceStore", "Ranks"]

_WHOLE = "collectives"  # the engine key every call holds: one call at a time, in call order


class Ranks(Protocol):
    """Where this process is in the job (:class:`pskv.config.RankEnv` has these fields)."""

    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def local_rank(self) -> int: ...
    @property
    def master_addr(self) -> str | None: ...
    @property
    def master_port(self) -> int | None: ...


class AllreduceStore(StoreFrontEnd[Any]):
    """An all-reduce store (``pskv.create('horovod')`` / ``pskv.create('nccl')``).

    On the store front end (:mod:`~pskv.kvstore.frontend`: arguments, the key kind, a
    closed store, the engine) like pskv's other stores; it keeps no key records (nothing
    is stored between calls), and every call holds one engine key: one collective at a
    time, in call order.

    Args:
        name: ``'horovod'`` (Gloo; NCCL for CUDA values) or ``'nccl'`` (NCCL for every value).
        config: local settings; ``default_timeout`` bounds the rendezvous and every call.
        ranks: this process's rank, world size, local rank and rendezvous address; None
            (or a world of one without an address): a group of one process.

    Raises:
        NotSupportedError: ``'nccl'`` without CUDA, or no torch.distributed.
        InvalidArgumentError: ranks out of range.
        NodeFailedError: the other ranks did not meet within the timeout.
    """

    def __init__(self, name: str = "horovod", config: Config | None = None, ranks: Ranks | None = None) -> None:
        store_type = StoreType.parse(name)
        if not store_type.allreduce:
            raise InvalidArgumentError(f"{name!r} is not an all-reduce store type (horovod, nccl)")
        config = Config.from_env() if config is None else config
        self._rank, self._size = (0, 1) if ranks is None else (ranks.rank, ranks.world_size)
        self._local_rank = 0 if ranks is None else ranks.local_rank
        if not 0 <= self._rank < self._size:
            raise InvalidArgumentError(f"rank {self._rank} is not in [0, {self._size}) (world size {self._size})")
        master = None if ranks is None or ranks.master_addr is None or ranks.master_port is None \
            else (ranks.master_addr, ranks.master_port)
        if master is None and self._size > 1:
            raise InvalidArgumentError(f"the {name!r} store of rank {self._rank} of {self._size} needs a rendezvous "
                                       "address: set MASTER_ADDR and MASTER_PORT (torchrun and pskv launch do)")
        nccl = store_type.canonical == "nccl"
        device = "cpu"
        torch = load_torch()
        if nccl:
            if not torch.cuda.is_available():
                raise NotSupportedError("the 'nccl' store needs CUDA (torch.cuda.is_available() is False here); "
                                        "use 'horovod' (Gloo on the CPU)")
            device = f"cuda:{self._local_rank % torch.cuda.device_count()}"
        spec = GroupSpec(self._rank, self._size, None if master is None else master[0],
                         0 if master is None else master[1], "nccl" if nccl else "gloo",
                         config.default_timeout, device)
        self._spec = spec
        self._group = TorchGroup(spec)  # every call's agreement; the data of values on its device
        self._cuda: TorchGroup | None = self._group if nccl else None  # horovod: made by the first CUDA call
        self._torch = torch
        self._device = device
        super().__init__(store_type.name, config, engine_threads=1)

    def _lookup(self, key: Key) -> None:
        return None  # no key records: nothing is stored between calls

    def _holds_keys(self) -> bool:
        return False

    # -- properties ----------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank (torchrun's ``RANK``, ``pskv launch``'s worker rank, ...)."""
        return self._rank

    @property
    def num_workers(self) -> int:
        """Number of processes in the job (``WORLD_SIZE``)."""
        return self._size

    @property
    def local_rank(self) -> int:
        """This process's rank on its host (``LOCAL_RANK``): the GPU it uses."""
        return self._local_rank

    @classmethod
    def is_capable(cls, capability: str) -> bool:
        """False for every known capability: no optimizer, row-sparse pull or compression.

        Raises:
            InvalidArgumentError: unknown capability, as for every store.
        """
        cls._capability(capability)
        return False

    # -- collectives ---------------------------------------------------------------------
    def pushpull(self, key: Any, value: Any, out: Any = None, priority: int = 0, *, block: bool = True,
                 timeout: float | None = None) -> Any:  # KVStoreBase's overloads type the calls
        """Sum ``value`` over every rank into ``out`` (into ``value`` if out is None). Collective.

        Raises:
            ShapeMismatchError, DTypeMismatchError: a key's values or outs differ in shape or dtype.
            UnsupportedValueError: not a NumPy array / tensor of a supported dtype.
            CollectiveMismatchError: the ranks' calls differ (every rank raises).
            NodeFailedError: a rank died (named); OperationTimeoutError: no result in time.
        """
        self._check_open("pushpull")
        try:
            keys, values, outs = self._pairs(key, value, out, "pushpull")
            description = "pushpull " + ", ".join(_describe(k, vals[0]) for k, vals in values)
        except KVStoreError as exc:
            self._refuse("pushpull", exc, timeout)

        def run() -> None:
            self._group.agree(description, timeout)
            buckets: dict[tuple[str, str], list[tuple[Key, Any, list[Any]]]] = {}  # (device, dtype) -> keys
            for (k, vals), (_, k_outs) in zip(values, outs):
                meta = describe(vals[0])
                device = self._work_device(meta.device)
                buckets.setdefault((device, str(meta.dtype)), []).append(
                    (k, self._local_sum(vals, device, in_place=out is None), k_outs if out is not None else vals))
            for (device, _), items in buckets.items():
                works = [work for _, work, _ in items]
                flat = works[0].reshape(-1) if len(works) == 1 else self._torch.cat([w.reshape(-1) for w in works])
                self._group_on(device).allreduce(_names(k for k, _, _ in items), flat, timeout)
                offset = 0
                for _, work, targets in items:
                    self._copy_into(targets, flat[offset:offset + work.numel()].view(work.shape))
                    offset += work.numel()
        return self._submit("pushpull", keys, priority, run, block, timeout)

    def broadcast(self, key: Any, value: Any, out: Any = None, priority: int = 0, *, block: bool = True,
                  timeout: float | None = None, root_rank: int = 0) -> Any:  # KVStoreBase's overloads type the calls
        """Rank ``root_rank``'s ``value`` into every ``out`` (into ``value`` if out is None). Collective.

        Every rank passes a value of the same shape and dtype (the root's is sent, the
        others' are overwritten only when ``out`` is None) and the same ``root_rank``.

        Raises:
            InvalidArgumentError: ``root_rank`` not in ``[0, num_workers)``, or not one value per key.
            ShapeMismatchError, DTypeMismatchError: an out differs from its value.
            CollectiveMismatchError: the ranks' calls (keys, shapes, dtypes, root_rank) differ.
            NodeFailedError, OperationTimeoutError: as :meth:`pushpull`.
        """
        self._check_open("broadcast")
        try:
            root = self._root_rank(root_rank)
            keys, values, outs = self._pairs(key, value, out, "broadcast", writes_values=self._rank != root)
            for k, vals in values:
                if len(vals) != 1:
                    raise InvalidArgumentError(f"broadcast of key {k!r} got {len(vals)} values; give exactly one")
            description = f"broadcast root_rank {root} " + ", ".join(_describe(k, vals[0]) for k, vals in values)
        except KVStoreError as exc:
            self._refuse("broadcast", exc, timeout)

        def run() -> None:
            self._group.agree(description, timeout)
            buckets: dict[str, list[tuple[Key, Any, list[Any], list[Any]]]] = {}  # device -> keys
            for (k, vals), (_, k_outs) in zip(values, outs):
                device = self._work_device(describe(vals[0]).device)
                buckets.setdefault(device, []).append((k, self._tensor(vals[0]), vals, k_outs))
            for device, items in buckets.items():
                self._broadcast_bucket(device, items, root, out is not None, timeout)
        return self._submit("broadcast", keys, priority, run, block, timeout)

    def _broadcast_bucket(self, device: str, items: list[tuple[Key, Any, list[Any], list[Any]]], root: int,
                          outs_given: bool, timeout: float | None) -> None:
        """One broadcast of the keys whose values live on ``device``: root's bytes into every rank's targets."""
        sources = [s for _, s, _, _ in items]
        sends = self._rank == root
        if len(sources) == 1 and (sends or not outs_given) and _in_place(sources[0], device):
            flat, offsets = sources[0].reshape(-1).view(self._torch.uint8), [0]  # sent or received in place
        else:
            flat, offsets = self._packed(sources, device, fill=sends)
        self._group_on(device).broadcast(f"{_names(k for k, _, _, _ in items)} from rank {root}", flat, root, timeout)
        for (_, s, vals, k_outs), offset in zip(items, offsets):
            if sends:  # the root's value is the result
                self._copy_into(k_outs, s)
                continue
            got = flat[offset:offset + s.numel() * s.element_size()].view(s.dtype).reshape(s.shape)
            self._copy_into(k_outs if outs_given else vals, got)

    def refuse_push(self, key: Any, error: BaseException, value: Any = None) -> NoReturn:
        """:meth:`KVStoreBase.refuse_push`: this rank's call in the others' ``pushpull`` is a refusal; they raise
        CollectiveMismatchError naming ``error``, this rank ``error`` (in its order of calls)."""
        self._check_open("pushpull")
        self._refuse("pushpull", error, None)

    def _refuse(self, op: str, error: BaseException, timeout: float | None) -> NoReturn:
        """This rank refuses its call: the others' same call fails at once (their agreement names
        this rank's error, CollectiveMismatchError) instead of waiting for it; then ``error`` is raised."""
        said = f"{op} refused on rank {self._rank}: {type(error).__name__}: {error}"

        def run() -> None:
            try:
                self._group.agree(said, timeout)
            except CollectiveMismatchError:
                pass  # the others learnt it; this rank raises its own error
            raise error
        self._submit(op, [], 0, run, True, timeout)  # in this rank's order of calls; raises ``error``
        raise error

    def barrier(self) -> None:
        """Wait until every rank reached the barrier (bounded by the default timeout)."""
        self._check_open("barrier")
        self._submit("barrier", [], 0, lambda: self._group.agree("barrier"), True, None)

    def wait(self, keys: Any = None, timeout: float | None = None) -> None:
        """Wait for this rank's outstanding non-blocking calls (all of them, whatever ``keys``).

        Raises:
            OperationTimeoutError: still pending after ``timeout`` seconds.
            Exception: the first error of a call nobody waited on.
        """
        super().wait(None, timeout)  # every call holds the one engine key: waiting for some is waiting for all

    def close(self) -> None:
        """Finish queued calls and leave the group; idempotent. Not a collective."""
        if self._closed:
            return
        self._closed = True
        try:
            self._engine.close(self._default_timeout)
        finally:
            self._group.close()
            if self._cuda is not None and self._cuda is not self._group:
                self._cuda.close()

    # -- not offered ---------------------------------------------------------------------
    def _unsupported(self, op: str) -> NotSupportedError:
        return NotSupportedError(f"the {self.type!r} store is an all-reduce without servers: it offers pushpull "
                                 f"and broadcast, not {op}")

    def set_gradient_compression(self, compression_params: Any) -> None:
        """Not available: the values are summed as they are."""
        raise self._unsupported("set_gradient_compression")

    def set_optimizer(self, optimizer: Optimizer) -> None:
        """Not available: nothing runs an optimizer; update on each rank after ``pushpull``."""
        raise self._unsupported("set_optimizer (update the parameters on each rank after pushpull)")

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Not available: the store holds no optimizer state."""
        raise self._unsupported("save_optimizer_states (the store holds no optimizer state)")

    def load_optimizer_states(self, fname: str) -> None:
        """Not available: the store holds no optimizer state."""
        raise self._unsupported("load_optimizer_states (the store holds no optimizer state)")

    # -- helpers -------------------------------------------------------------------------
    def _check_open(self, op: str) -> None:
        """The front end's check; then a group that failed (a rank died) fails every later call."""
        super()._check_open(op)
        if self._group.failed is not None:
            raise self._group.failed

    def _pairs(self, key: Any, value: Any, out: Any, op: str, writes_values: bool = True
               ) -> tuple[list[Key], list[tuple[Key, list[Any]]], list[tuple[Key, list[Any]]]]:
        """(keys, values per key, outs per key), every array checked against its key's first value,
        and every array the result goes to (the outs; the values if ``out`` is None and
        ``writes_values``) writable — before the collective, so no rank fails after it."""
        keys, single = self._key_list(key, creates=True)
        values = pair_up(keys, single, value, "value", self._sparse_refusal)
        outs = pair_up(keys, single, out, "out", self._sparse_refusal) if out is not None else [(k, []) for k in keys]
        if len(set(keys)) != len(keys):  # a key listed twice: its values summed, every out of it filled
            if op == "broadcast":
                raise InvalidArgumentError(f"broadcast: key listed twice in {keys!r}; give one value per key")
            keys = list(dict.fromkeys(keys))
            values, outs = merge_repeats(values), merge_repeats(outs)
        for (k, vals), (_, k_outs) in zip(values, outs):
            check_like(k, describe(vals[0]), vals[1:] + k_outs, op)
            written = k_outs if out is not None else vals if writes_values else []
            if any(isinstance(a, np.ndarray) and not a.flags.writeable for a in written):
                raise InvalidArgumentError(f"{op} of key {k!r}: the result cannot be written into a read-only "
                                           "NumPy array")
        return keys, values, outs

    def _submit(self, op: str, keys: Sequence[Key], priority: int, fn: Callable[[], Any], block: bool,
                timeout: float | None, quick: bool = False) -> Any:
        """The front end's submission under the one engine key (``priority`` is checked, cannot reorder); a
        timeout and :meth:`wait`'s listing name the call's own keys (a barrier's, none: the engine key)."""
        check_priority(priority)
        result = self._engine.submit(op, [_WHOLE], 0, fn, block, self._timeout(timeout), shown=keys or None)
        return None if block else result

    def _tensor(self, array: Any) -> Any:
        """``array`` (checked by ``describe``) as a tensor sharing its memory (NumPy: ``torch.from_numpy``)."""
        if isinstance(array, np.ndarray):
            try:
                return self._torch.from_numpy(array if array.flags.writeable else array.copy())
            except TypeError:  # NumPy's bfloat16 (ml_dtypes) has no torch counterpart to share memory with
                raise UnsupportedValueError(f"a NumPy {array.dtype} array: use a torch.bfloat16 tensor in the "
                                            f"{self.type!r} store") from None
        return array.detach()

    def _work_device(self, value_device: str) -> str:
        """Where a value's collective runs: the nccl store's GPU; in horovod the CPU or the value's GPU."""
        return self._device if self._device != "cpu" or value_device == "cpu" else value_device

    def _group_on(self, device: str) -> TorchGroup:
        """The group for values on ``device``: Gloo for the CPU, NCCL for CUDA.

        The horovod store makes its NCCL group at its first call with CUDA values: every
        rank is in that call (its description, devices included, was agreed on).
        """
        if device == "cpu":
            return self._group
        if self._cuda is None:
            self._cuda = TorchGroup(dataclasses.replace(self._spec, backend="nccl", device=device))
        return self._cuda

    def _local_sum(self, vals: list[Any], device: str, in_place: bool) -> Any:
        """This rank's contribution on ``device``: the value itself (summed in place, only if ``in_place``:
        with an ``out`` the value is left as it was) or a new sum of the values."""
        tensors = [self._tensor(v) for v in vals]
        if in_place and len(tensors) == 1 and _in_place(tensors[0], device):
            return tensors[0]
        work = tensors[0].to(device=device, copy=True).contiguous()
        for t in tensors[1:]:
            work += t.to(device=device)
        return work

    def _packed(self, sources: list[Any], device: str, fill: bool) -> tuple[Any, list[int]]:
        """One byte buffer on the group's device for ``sources`` (each at an 8-aligned offset; copied in if ``fill``)."""
        torch = self._torch
        offsets, total = [], 0
        for s in sources:
            offsets.append(total)
            total += -(-s.numel() * s.element_size() // 8) * 8
        flat = torch.empty(total, dtype=torch.uint8, device=device)
        if fill:
            for s, offset in zip(sources, offsets):
                n = s.numel() * s.element_size()
                flat[offset:offset + n].view(s.dtype).copy_(s.reshape(-1))
        return flat, offsets

    def _copy_into(self, targets: list[Any], got: Any) -> None:
        for t in targets:
            dest = self._tensor(t)
            if dest.data_ptr() != got.data_ptr():
                dest.copy_(got.reshape(dest.shape))

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"rank {self._rank} of {self._size}"
        return f"<pskv.kvstore.AllreduceStore type={self.type!r} {state}>"


def _in_place(tensor: Any, device: str) -> bool:
    """The collective can run on ``tensor``'s own memory."""
    return bool(tensor.is_contiguous()) and str(tensor.device) == device


def _describe(key: Key, value: Any) -> str:
    meta = describe(value)
    where = "" if meta.device == "cpu" else " cuda"  # the kind only: each rank has its own GPU
    return f"key {key!r} {meta.dtype}{tuple(meta.shape)}{where}"


def _names(keys: Any) -> str:
    names = [repr(k) for k in keys]
    return "key " + names[0] if len(names) == 1 else f"keys {', '.join(names)}"
