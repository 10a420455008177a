"""Horovod's collectives on the job's store: allreduce, grouped allreduce, broadcast, handles, join.

Semantics are Horovod's (``horovod/torch/mpi_ops.py``), on pskv's ``pushpull`` (a sum over
the workers) and ``broadcast(root_rank=)``:

* **Names are keys.** Each call is keyed by its ``name`` (``allreduce.<name>``,
  ``broadcast.<name>``); an unnamed call gets ``<op>.noname.<n>``, numbered in call order,
  so the same on every rank that makes the same calls. On a store with servers
  (``dist_sync``, ``byteps``) the first use of a name declares its key: an ``init`` of
  every rank at once whose shapes and dtypes the store checks alike, so a mismatch fails
  on every rank (``InitMismatchError``). The key keeps that dtype and size: a later
  call with another dtype or number of elements is refused on this rank and fails the
  round of every other rank (the servers refuse it: ``kv.refuse_push``; the round changes
  nothing and the name works on afterwards); another shape of the same size is summed through a
  view. Ranks that name different new keys fail together too (a checksum of the names,
  summed). Horovod's all-reduce store (``horovod``) keeps no keys: every call's names,
  shapes and dtypes are agreed on (``CollectiveMismatchError`` on every rank). Give tensors
  reduced every step a name: on the servers every new unnamed call is a new key (a meeting).
* **Ops.** ``op=Sum`` or ``Average`` (the default; ``average=`` is the deprecated form).
  Average divides the sum by :func:`~pskv.torch.runtime.size` after it arrives, with
  ``postscale_factor``; ``prescale_factor`` scales what is sent. Integer tensors are
  scaled in float64 and truncated toward zero, as Horovod's C++ does. ``Adasum`` and
  Horovod's ``Min``/``Max``/``Product`` raise :class:`~pskv.errors.NotSupportedError`.
* **Handles.** The ``_async`` calls return an int; the store works meanwhile
  (``block=False``); :func:`poll` asks, :func:`synchronize` waits, scales and returns the
  output (a list for the grouped calls). A store with servers declares a new key before
  the call returns (a meeting of every rank).

BytePS's names (``push_pull``, ``push_pull_async``, ``push_pull_inplace``, ``declare``) call
these functions (:mod:`pskv.torch.byteps`). Unlike Horovod, two calls of one name in flight
on a rank are not refused: the store runs them in call order.
"""

from __future__ import annotations

import enum
import itertools
import warnings
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pskv.errors import DTypeMismatchError, InvalidArgumentError, NotSupportedError, ShapeMismatchError
from pskv.torch.compression import NoneCompressor, on_store
from pskv.torch.runtime import Runtime, current

__all__ = ["ReduceOp", "Average", "Sum", "Adasum", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
           "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
           "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "grouped_broadcast_async_", "poll",
           "synchronize", "join", "barrier", "declare", "declare_groups", "reduce_op", "scale_"]


class ReduceOp(enum.IntEnum):
    """Horovod's reduction ops; pskv sums (and averages), the others are refused."""

    Average = 0
    Sum = 1
    Adasum = 2
    Min = 3
    Max = 4
    Product = 5


Average, Sum, Adasum = ReduceOp.Average, ReduceOp.Sum, ReduceOp.Adasum

_NAMES_KEY = "pskv.torch.names"  # the servers' key of the names check (:func:`_declare`)


@dataclass
class _Names:
    """One runtime's keys: auto-name counters, and the (dtype, shape) each server key was declared with."""

    counters: dict[str, itertools.count[int]]
    keys: dict[str, tuple[torch.dtype, tuple[int, ...]]]
    handles: dict[int, _Pending]
    next_handle: itertools.count[int]


@dataclass
class _Pending:
    """An operation under way: the store's handle (None: already done) and what makes its output."""

    handle: Any
    finish: Callable[[], Any]


def _names(job: Runtime) -> _Names:
    found = job.state.get("names")
    if found is None:
        found = job.state["names"] = _Names({}, {}, {}, itertools.count(1))
    assert isinstance(found, _Names)
    return found


def _key(job: Runtime, op: str, name: str | None) -> str:
    """The store key of a call: ``<op>.<name>``; unnamed calls are numbered in call order."""
    if name is None:
        names = _names(job)
        n = next(names.counters.setdefault(op, itertools.count()))
        return job.key(f"{op}.noname.{n}")
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"{op}: name must be a non-empty string, got {name!r}")
    return job.key(f"{op}.{name}")


def _group_keys(job: Runtime, name: str | None, count: int) -> list[str]:
    """The keys of a grouped all-reduce of ``count`` tensors: ``allreduce.<name>`` for one, else ``.<i>`` after it."""
    base = _key(job, "allreduce", name)
    return [base] if count == 1 else [f"{base}.{i}" for i in range(count)]


def reduce_op(op: Any, average: bool | None, function: str) -> ReduceOp:
    """Horovod's rule for ``op`` and the deprecated ``average`` (default: Average).

    Raises:
        ValueError: both given (Horovod's message).
        NotSupportedError: Adasum, Min, Max or Product, naming ``function``.
    """
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        chosen = ReduceOp(op)
    elif average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                      DeprecationWarning, stacklevel=3)
        chosen = ReduceOp.Average if average else ReduceOp.Sum
    else:
        chosen = ReduceOp.Average
    if chosen not in (ReduceOp.Average, ReduceOp.Sum):
        raise NotSupportedError(f"{function}(op={chosen.name}): pskv sums (op=Sum) and averages (op=Average); "
                                f"{chosen.name} is not offered")
    return chosen


def scale_(tensor: torch.Tensor, factor: float) -> torch.Tensor:
    """``tensor *= factor`` in place; integers in float64, truncated toward zero (Horovod's ScaleBuffer)."""
    if factor == 1.0:
        return tensor
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        return tensor.mul_(factor)
    return tensor.copy_(tensor.double().mul_(factor).trunc_())


def _check_tensor(tensor: Any, function: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"{function} takes a torch.Tensor, got {type(tensor).__qualname__}")
    if not tensor.is_contiguous():
        raise InvalidArgumentError(f"{function}: tensor is required to be contiguous (call .contiguous())")
    return tensor


def _fit(job: Runtime, keys: list[str], sends: list[torch.Tensor], outs: list[torch.Tensor], op: str,
         squeeze: dict[str, Any] | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """On a store with servers: declare new keys, view reused ones in the shape they were declared with,
    and refuse a dtype or size other than the key's on every rank (the servers fail the round).

    A ``byteps`` store declares its keys by their first use (and refuses misfits on every
    rank itself). A broadcast's new keys are declared here too, so that the store's broadcast
    always meets to agree on ``root_rank`` (it skips that meeting for new keys from rank 0).
    ``squeeze``: the compression of keys (:func:`~pskv.torch.compression.on_store`) they are declared with.
    """
    if not job.servers:
        return sends, outs
    known = _names(job).keys
    fresh = {k: t for k, t in zip(keys, sends) if k not in known}
    if fresh and not job.kind.summation_only:
        _declare(job, fresh, squeeze or {})
    for k, t in fresh.items():
        known[k] = (t.dtype, tuple(t.shape))
    for i, (k, t) in enumerate(zip(keys, sends)):
        dtype, shape = known[k]
        if t.dtype == dtype and t.numel() == _numel(shape):
            sends[i], outs[i] = t.view(shape), outs[i].view(shape)
        elif not job.kind.summation_only or op != "allreduce":
            _refuse(job, k, t, dtype, shape, op)
    return sends, outs


def _declare(job: Runtime, fresh: dict[str, torch.Tensor], squeeze: dict[str, Any]) -> None:
    """Create ``fresh`` keys on the servers (an ``init`` of every rank: their shapes and dtypes must agree),
    then check that every rank named the same keys (the ``init`` compares only keys that every rank names).

    The check is a sum every rank reads alike: each pushes ``[c, c*c]`` for a checksum ``c`` of
    its names; they agree iff ``size * sum(c*c) == sum(c) ** 2``, so all ranks raise, or none.
    """
    declared = _names(job).keys
    values = {k: torch.zeros(t.shape, dtype=t.dtype) for k, t in fresh.items()}
    check = job.key(_NAMES_KEY)
    if check not in declared:
        values[check] = torch.zeros(2, dtype=torch.int64)
    own = {"compression": [squeeze.get(k) for k in values]} if squeeze else {}  # the keys' compression (only dist_*)
    job.store.init(list(values), list(values.values()), summed=True, **own)  # sums even when the servers run an optimizer
    declared[check] = (torch.int64, (2,))
    if job.joining:  # a worker that joined a running elastic job registers the members' keys (the servers check them)
        return
    c = (zlib.crc32("\n".join(fresh).encode()) & 0xFFFFF) + 1
    probe = torch.tensor([c, c * c], dtype=torch.int64)
    job.store.pushpull(check, probe)
    total, squares = int(probe[0]), int(probe[1])
    if job.store.num_workers * squares != total * total:
        raise InvalidArgumentError(f"the ranks' calls name different tensors: this rank's new names are "
                                   f"{list(fresh)[:4]}; every rank must use the same names, in the same order")


def _refuse(job: Runtime, key: str, tensor: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...], op: str) -> None:
    """A tensor that does not fit its key: the servers refuse it for the round (every rank's pushpull
    fails, as in the ``byteps`` store); a broadcast's own check fails it on every rank."""
    if op != "allreduce":
        return  # DistStore.broadcast checks the value against the key at its meeting: every rank fails
    what = f"{op} (a name keeps the dtype and size of its first use on a store with servers: use another name)"
    error: Exception = ShapeMismatchError(key, what, shape, tuple(tensor.shape))
    if tensor.dtype != dtype:
        error = DTypeMismatchError(key, what, str(dtype).removeprefix("torch."), str(tensor.dtype).removeprefix("torch."))
    job.store.refuse_push(key, error, tensor)  # the others' pushpull of this round fails too; raises ``error``


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _submit(job: Runtime, run: Callable[[], Any], finish: Callable[[], Any]) -> int:
    names = _names(job)
    handle = next(names.next_handle)
    names.handles[handle] = _Pending(run(), finish)
    return handle


def _grouped_start(tensors: Sequence[torch.Tensor], outputs: list[torch.Tensor], name: str | None, op: ReduceOp,
                   prescale_factor: float, postscale_factor: float, function: str, priority: int = 0,
                   compression: Any = NoneCompressor) -> int:
    """Sum ``tensors`` into ``outputs`` (the same list when in place) under one store call; a handle.

    ``priority``: the store's (a higher one is sent first where the store can reorder, as BytePS's).
    ``compression``: pskv's own compresses the keys on the store (:func:`~pskv.torch.compression.on_store`).
    """
    job = current()
    tensors = [_check_tensor(t, function) for t in tensors]
    if not tensors:
        raise InvalidArgumentError(f"{function}: no tensors")
    keys, squeeze = on_store(compression, job, _group_keys(job, name, len(tensors)), function)
    sends: list[torch.Tensor] = []
    for t, out in zip(tensors, outputs):  # the sum is made in the output (the all-reduce store sums in place)
        if out is not t:
            out.copy_(t)
        sends.append(scale_(out, prescale_factor))
    sends, _ = _fit(job, keys, sends, list(sends), "allreduce", squeeze)
    factor = postscale_factor / job.store.num_workers if op == ReduceOp.Average else postscale_factor

    def run() -> Any:
        key: Any = keys[0] if len(keys) == 1 else keys
        return job.store.pushpull(key, sends[0] if len(sends) == 1 else sends, priority=priority, block=False)

    def finish() -> list[torch.Tensor]:
        for out in outputs:
            scale_(out, factor)
        return outputs
    return _submit(job, run, finish)


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: Any = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    """Start summing (averaging) ``tensor`` over the ranks into a new tensor; a handle for :func:`synchronize`."""
    chosen = reduce_op(op, average, "allreduce_async")
    return _one(_grouped_start([tensor], [torch.empty_like(tensor)], name, chosen, prescale_factor, postscale_factor,
                               "allreduce_async"))


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: Any = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0, *, priority: int = 0) -> int:
    """Start summing (averaging) ``tensor`` over the ranks in place; a handle for :func:`synchronize`.

    ``priority`` (pskv's, keyword only): a higher one is sent first where the store can reorder.
    """
    chosen = reduce_op(op, average, "allreduce_async_")
    return _one(_grouped_start([tensor], [tensor], name, chosen, prescale_factor, postscale_factor,
                               "allreduce_async_", priority))


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: Any = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Sum (average) ``tensor`` over the ranks in place; returns it."""
    chosen = reduce_op(op, average, "allreduce_")
    handle = _one(_grouped_start([tensor], [tensor], name, chosen, prescale_factor, postscale_factor, "allreduce_"))
    result: torch.Tensor = synchronize(handle)
    return result


def _one(handle: int) -> int:
    """A grouped handle of one tensor made a plain one: :func:`synchronize` returns the tensor."""
    pending = _names(current()).handles[handle]
    finish = pending.finish
    pending.finish = lambda: finish()[0]
    return handle


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                            op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    """Start summing (averaging) each tensor of ``tensors`` into new tensors, in one store call; a handle."""
    chosen = reduce_op(op, average, "grouped_allreduce_async")
    return _grouped_start(tensors, [torch.empty_like(t) for t in tensors], name, chosen, prescale_factor,
                          postscale_factor, "grouped_allreduce_async")


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                             op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0, *,
                             priority: int = 0, compression: Any = NoneCompressor) -> int:
    """Start summing (averaging) each tensor of ``tensors`` in place, in one store call; a handle
    (:func:`synchronize` returns the list). ``priority`` as :func:`allreduce_async_`'s; ``compression``
    (pskv's, keyword only): one of pskv's own (:class:`~pskv.torch.compression.StoreCompressor`) the store applies."""
    chosen = reduce_op(op, average, "grouped_allreduce_async_")
    return _grouped_start(tensors, list(tensors), name, chosen, prescale_factor, postscale_factor,
                          "grouped_allreduce_async_", priority, compression)


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                       op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0
                       ) -> list[torch.Tensor]:
    """Sum (average) each tensor of ``tensors`` in place; returns them."""
    handle = grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor)
    result: list[torch.Tensor] = synchronize(handle)
    return result


def _broadcast_start(tensors: Sequence[torch.Tensor], outputs: list[torch.Tensor], root_rank: int,
                     names: Sequence[str | None], function: str) -> int:
    """Copy root's ``tensors`` into every rank's ``outputs`` (the same tensors when in place), one store call."""
    job = current()
    tensors = [_check_tensor(t, function) for t in tensors]
    keys = [_key(job, "broadcast", n) for n in names]
    if isinstance(root_rank, bool) or not isinstance(root_rank, int):
        raise InvalidArgumentError(f"{function}: root_rank must be an int, got {root_rank!r}")
    sends, outs = _fit(job, keys, list(tensors), list(outputs), "broadcast")
    in_place = all(o is t for o, t in zip(outputs, tensors)) and not job.servers
    single = len(keys) == 1

    def run() -> Any:  # with servers, the servers' value is root's: every rank (root too) pulls it into its output
        return job.store.broadcast(keys[0] if single else keys, sends[0] if single else sends,
                                   out=None if in_place else (outs[0] if single else outs), root_rank=root_rank,
                                   block=False)
    return _submit(job, run, lambda: outputs[0] if single else outputs)


def grouped_broadcast_async_(tensors: Sequence[torch.Tensor], root_rank: int,
                             names: Sequence[str | None] | None = None) -> int:
    """Start copying rank ``root_rank``'s ``tensors`` into them on every rank, in one store call; a handle
    (:func:`synchronize` returns the list). ``names``: one per tensor (None: numbered in call order)."""
    names = [None] * len(tensors) if names is None else list(names)
    if len(names) != len(tensors):
        raise InvalidArgumentError(f"grouped_broadcast_async_: {len(names)} names for {len(tensors)} tensors")
    return _broadcast_start(tensors, list(tensors), root_rank, names, "grouped_broadcast_async_")


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> int:
    """Start copying rank ``root_rank``'s ``tensor`` into a new tensor on every rank; a handle."""
    return _broadcast_start([tensor], [torch.empty_like(tensor)], root_rank, [name], "broadcast_async")


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> int:
    """Start copying rank ``root_rank``'s ``tensor`` into ``tensor`` on every rank; a handle."""
    return _broadcast_start([tensor], [tensor], root_rank, [name], "broadcast_async_")


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    """Copy rank ``root_rank``'s ``tensor`` into ``tensor`` on every rank; returns it."""
    result: torch.Tensor = synchronize(_broadcast_start([tensor], [tensor], root_rank, [name], "broadcast_"))
    return result


def poll(handle: int) -> bool:
    """True once the operation of ``handle`` finished: :func:`synchronize` then returns at once.

    Raises:
        InvalidArgumentError: not a handle of this process (or already synchronized).
    """
    pending = _names(current()).handles.get(handle)
    if pending is None:
        raise InvalidArgumentError(f"poll: {handle!r} is not the handle of an operation under way")
    return pending.handle is None or bool(pending.handle.done())


def synchronize(handle: int) -> Any:
    """Wait for the operation of ``handle``; its output (a tensor; a list for grouped calls).

    Like Horovod, an unknown (or already synchronized) handle returns None. The store's
    error (e.g. ``CollectiveMismatchError`` when the ranks' calls differ) is raised here,
    and the handle is forgotten either way.
    """
    pending = _names(current()).handles.pop(handle, None)
    if pending is None:
        return None
    if pending.handle is not None:
        pending.handle.wait()
    return pending.finish()


def join(device: int = -1) -> int:
    """This rank has no more data: wait until every rank joined (Horovod's ``join``).

    On a store with servers the rounds of the ranks still training go on without this
    one meanwhile (``DistStore.join``); on the all-reduce store every rank must make the
    same collectives before joining. pskv does not track which rank joined last: returns -1.
    """
    job = current()
    for handle in list(_names(job).handles):
        synchronize(handle)
    if job.servers:
        job.store.join()
    else:
        job.store.barrier()
    return -1


def barrier() -> None:
    """Wait until every rank reached the barrier."""
    current().store.barrier()


def declare(name: str | Sequence[str], tensors: torch.Tensor | Sequence[torch.Tensor] | None = None) -> None:
    """BytePS's ``declare``: name tensors to all-reduce; with ``tensors``, a store with servers
    declares their keys now, in one meeting of every rank (instead of one at each first use).

    ``name`` a string and ``tensors`` a list: the keys of ``grouped_allreduce*(tensors, name=name)``;
    a list of names: one per tensor, the keys of ``allreduce*(tensor, name=n)``. Without
    tensors it does nothing: a key is declared by its first use anyway.
    """
    if tensors is None:
        return
    values = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    if isinstance(name, str):
        declare_groups([(name, values)])
        return
    names = list(name)
    if len(names) != len(values):
        raise InvalidArgumentError(f"declare: {len(names)} names for {len(values)} tensors")
    declare_groups([(n, [t]) for n, t in zip(names, values)])


def declare_groups(groups: Sequence[tuple[Any, ...]]) -> None:
    """Declare the keys of several ``grouped_allreduce*(tensors, name=name)`` calls in one meeting
    (a store with servers; nothing on the all-reduce store). A collective: every rank, the same groups.
    A group is ``(name, tensors)``, or ``(name, tensors, compression)`` for calls made with one of pskv's own."""
    job = current()
    keys: list[str] = []
    values: list[torch.Tensor] = []
    squeeze: dict[str, Any] = {}
    for name, tensors, *how in groups:
        group, own = on_store(how[0] if how else NoneCompressor, job, _group_keys(job, name, len(tensors)), "declare")
        keys += group
        squeeze.update(own)
        values += [_check_tensor(t, "declare") for t in tensors]
    _fit(job, keys, values, list(values), "allreduce", squeeze)


# -- the blocking, differentiable forms (Horovod's autograd functions) ------------------------
def _grad_name(name: str | None) -> str | None:
    """The name of a named call's gradient reduction (unnamed: numbered in call order, like Horovod's)."""
    return None if name is None else f"{name}.grad"


class _Allreduce(torch.autograd.Function):
    """The sum (average) over the ranks; its gradient is the same reduction of the output's gradient."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: ReduceOp, name: str | None, prescale: float,
                postscale: float, compression: Any = NoneCompressor) -> torch.Tensor:
        ctx.reduction = (op, prescale, postscale, _grad_name(name))
        handle = _one(_grouped_start([tensor], [torch.empty_like(tensor)], name, op, prescale, postscale, "allreduce",
                                     compression=compression))
        result: torch.Tensor = synchronize(handle)
        return result

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        op, prescale, postscale, name = ctx.reduction
        return (_Allreduce.apply(grads[0].contiguous(), op, name, prescale, postscale), None, None, None, None, None)


class _GroupedAllreduce(torch.autograd.Function):
    """:class:`_Allreduce` of a list of tensors in one store call."""

    @staticmethod
    def forward(ctx: Any, op: ReduceOp, name: str | None, prescale: float, postscale: float, compression: Any,
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.reduction = (op, prescale, postscale, _grad_name(name))
        outs = [torch.empty_like(t) for t in tensors]
        return tuple(synchronize(_grouped_start(tensors, outs, name, op, prescale, postscale, "grouped_allreduce",
                                                compression=compression)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        op, prescale, postscale, name = ctx.reduction
        reduced = _GroupedAllreduce.apply(op, name, prescale, postscale, NoneCompressor, *[g.contiguous() for g in grads])
        return (None, None, None, None, None, *reduced)


class _Broadcast(torch.autograd.Function):
    """Root's tensor on every rank; its gradient reaches the root's input only (averaged, as Horovod's)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None) -> torch.Tensor:
        ctx.root_rank, ctx.grad_name = root_rank, _grad_name(name)
        result: torch.Tensor = synchronize(_broadcast_start([tensor], [torch.empty_like(tensor)], root_rank, [name],
                                                            "broadcast"))
        return result

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        reduced = _Allreduce.apply(grads[0].contiguous(), ReduceOp.Average, ctx.grad_name, 1.0, 1.0)
        if current().store.rank != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: Any = NoneCompressor, op: Any = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0) -> torch.Tensor:
    """The sum (average: the default ``op``) of ``tensor`` over the ranks, a new tensor; ``tensor`` is not changed.

    ``compression`` (:class:`~pskv.torch.compression.Compression`) is what travels (pskv's own: the
    store compresses the key, :mod:`pskv.torch.compression`). Differentiable; the gradient travels plain.

    Raises:
        NotSupportedError: ``op`` Adasum, Min, Max or Product.
        InitMismatchError, CollectiveMismatchError, ShapeMismatchError, DTypeMismatchError: the ranks'
            tensors differ, or a name is reused with another dtype or size (see the module docstring).
    """
    chosen = reduce_op(op, average, "allreduce")
    sent, ctx = compression.compress(tensor)
    summed = _Allreduce.apply(_check_tensor(sent, "allreduce"), chosen, name, prescale_factor, postscale_factor,
                              compression)
    result: torch.Tensor = compression.decompress(summed, ctx)
    return result


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                      compression: Any = NoneCompressor, op: Any = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """:func:`allreduce` of each tensor, in one store call; new tensors. Differentiable."""
    chosen = reduce_op(op, average, "grouped_allreduce")
    pairs = [compression.compress(t) for t in tensors]
    summed = _GroupedAllreduce.apply(chosen, name, prescale_factor, postscale_factor, compression,
                                     *[s for s, _ in pairs])
    return [compression.decompress(s, ctx) for s, (_, ctx) in zip(summed, pairs)]


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    """Rank ``root_rank``'s ``tensor``, a new tensor on every rank; ``tensor`` is not changed. Differentiable.

    Raises:
        InvalidArgumentError: ``root_rank`` is not a rank (on every rank).
        CollectiveMismatchError, InitMismatchError: the ranks' tensors or root ranks differ (on every rank).
    """
    result: torch.Tensor = _Broadcast.apply(tensor, root_rank, name)
    return result
