"""A distributed call's arrays on the worker: what it sends, where its replies go, and when.

The distributed store (:mod:`pskv.kvstore.dist`) asks the servers for every key of a
call in one exchange; around it, on this worker, the values of a key are reduced into
what is sent (:func:`reduce_outgoing`, MXNet's local reduction) and the values received
are copied into the caller's outs or new arrays (:func:`deliver`). Two decisions depend
on those arrays: whether a call is small enough to run from the caller's thread
(:func:`is_quick`), and whether it writes a key's own buffers, which the previous push
of the key must have released (:func:`reuses_buffers`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pskv.arrays import CpuKernels, describe, empty, fan_out_many, is_torch, sum_into_many, wire_view
from pskv.kvstore.keys import Key
from pskv.worker import KeyLayout

__all__ = ["QUICK_BYTES", "Pairs", "deliver", "fan_out_rest", "is_quick", "landing", "reduce_outgoing",
           "reuses_buffers"]

#: Calls on CPU values of at most this many bytes are "quick": with block=False they send
#: from the caller's thread, and their replies are handled on the network thread — a
#: thread hand-off (~0.1-0.4 ms) costs more than their copies.
QUICK_BYTES = 256 << 10

#: ``(key, its layout, its values)`` per distinct key of a call (``StoreFrontEnd._push_pairs``).
Pairs = Sequence[tuple[Key, KeyLayout, list[Any]]]


def reduce_outgoing(pairs: Pairs, kernels: CpuKernels, on_device: bool) -> None:
    """Set each key's outgoing buffer: its one CPU value as is, else the sum of its values.

    A single CPU value is sent without a copy (which is why a value given to a
    non-blocking push must not change before its handle is done); several values, or
    values on a GPU, are summed into the key's CPU send buffer — first on their device
    when ``on_device`` (the ``_device`` store types).
    """
    to_sum = []
    for _, rec, vals in pairs:
        if len(vals) == 1 and describe(vals[0]).device == "cpu":
            rec.outgoing = vals[0]
            continue
        if rec.send is None:
            rec.send = empty(rec.meta, device="cpu")
        rec.outgoing = rec.send
        if on_device and len(vals) > 1 and describe(vals[0]).device != "cpu":
            acc = empty(rec.meta, device=describe(vals[0]).device)  # sum where the values live
            sum_into_many([(acc, vals)], kernels)
            vals = [acc]
        to_sum.append((rec.send, vals))
    sum_into_many(to_sum, kernels)


def is_quick(recs: Sequence[KeyLayout], arrays: Sequence[Any] = ()) -> bool:
    """True if a call on ``recs`` (with these values / outs) is small and all on the CPU."""
    total = 0
    for rec in recs:
        if rec.meta.device != "cpu":
            return False
        total += rec.nbytes
    if total > QUICK_BYTES:
        return False
    for a in arrays:
        if not isinstance(a, np.ndarray) and describe(a).device != "cpu":
            return False
    return True


def reuses_buffers(pairs: Pairs) -> bool:
    """True if pushing ``pairs`` writes a key's own buffers (shared slot, reduce buffer).

    Those must not change before the key's previous push was answered. A single CPU
    value over sockets is sent from the caller's array itself.
    """
    for _, rec, vals in pairs:
        if rec.shared or len(vals) != 1 or not (isinstance(vals[0], np.ndarray)
                                                 or describe(vals[0]).device == "cpu"):
            return True
    return False


def landing(recs: Sequence[KeyLayout], outs: Sequence[Sequence[Any]] | None) -> dict[int, tuple[Any, np.ndarray]]:
    """Where each key's received parts may land directly: ``id(layout) -> (out, flat view of it)``.

    Only for a key of several parts (pieces, or slices of several servers) with exactly
    one out that is a contiguous, writable CPU array of the key's kind, dtype and size:
    its parts are then written into it as they arrive, not assembled elsewhere and
    copied again.
    """
    views: dict[int, tuple[Any, np.ndarray]] = {}
    for rec, o in zip(recs, outs or ()):
        # a one-part key is copied once either way (from its reply): nothing to save there
        if len(o) == 1 and len(rec.parts) > 1 and id(rec) not in views:
            view = _flat_out(o[0], rec)
            if view is not None:
                views[id(rec)] = (o[0], view)
    return views


def _flat_out(out: Any, rec: KeyLayout) -> np.ndarray | None:
    meta = rec.meta
    if type(out) is np.ndarray:
        fits = (out.flags.c_contiguous and out.flags.writeable and meta.backend == "numpy"
                and out.dtype.name == meta.dtype and out.size == meta.size)
        return out.reshape(-1) if fits else None
    if is_torch(out) and not out.requires_grad and out.is_contiguous():
        have = describe(out)
        if have.device == "cpu" and (have.backend, have.dtype, have.size) == (meta.backend, meta.dtype, meta.size):
            return wire_view(out)
    return None


def fan_out_rest(pairs: Sequence[tuple[Sequence[Any], Any]], kernels: CpuKernels) -> None:
    """``fan_out_many`` without the outs that already are the value (landed there, :func:`landing`)."""
    rest = [(dsts, v) for dsts, v in ((tuple(d for d in o if d is not v), v) for o, v in pairs) if dsts]
    if rest:
        fan_out_many(rest, kernels)


def deliver(recs: Sequence[KeyLayout], values: dict[int, Any], outs: list[list[Any]] | None, single: bool,
            kernels: CpuKernels) -> Any:
    """The received ``values`` (by ``id`` of the layout) into ``outs``; None.

    With ``outs`` None: new arrays of the kind and device each key was initialised with,
    one for one key (``single``), else a list.
    """
    if outs is None:
        arrays = []
        for rec in recs:
            new = empty(rec.meta)
            fan_out_many([([new], values[id(rec)])], kernels)
            arrays.append(new)
        return arrays[0] if single else arrays
    if len(outs) == 1 and len(outs[0]) == 1 and type(outs[0][0]) is np.ndarray and recs[0].nbytes <= QUICK_BYTES:
        if outs[0][0] is not values[id(recs[0])]:
            np.copyto(outs[0][0], values[id(recs[0])])  # the usual small case, directly
        return None
    fan_out_rest([(o, values[id(rec)]) for rec, o in zip(recs, outs)], kernels)
    return None
