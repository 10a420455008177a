"""A store's gradient compression: ``set_gradient_compression`` and what a compressed push sums.

MXNet's rules, kept: the call comes before the first ``init`` (the residuals are sized
and zeroed with the keys; MXNet's ``device`` store silently mixed states when it came
later — pskv refuses with a clear error), compression applies to float32 values only
(MXNet checks it in its ``dist`` stores), and ``init`` itself is never compressed. In the
single-process stores each value a push carries — one per device — is compressed with its
own residual (per key and device, as MXNet's ``device`` store does), and the store sums what
it decodes; a ``dist_*`` store first sums a worker's device values, then compresses each part
with one residual per part and worker, and the servers sum what they decode. Beyond MXNet: the ``local`` store and ``pushpull`` compress too.

Beyond MXNet too: a key of a distributed store may be initialised with a compression of its
own (``init(keys, values, compression=)``, :func:`key_compressions`), whenever the store's is
set or not and even if the key is ``summed`` (the servers sum what they decode): what
``pskv.torch``'s ``Compression.twobit()`` and the like ask for, since a Horovod script
broadcasts its parameters (an ``init``) before anything could set the store's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from pskv.arrays import ArrayMeta, clone, describe, from_wire, to_numpy
from pskv.compression import Compressor, Residuals, create, ontorch
from pskv.errors import InvalidArgumentError, NotSupportedError

__all__ = ["GradientCompression", "agreed", "key_compressions"]


class GradientCompression:
    """A compressor and the residuals of one store (per key and device, :mod:`pskv.compression.residuals`).

    A distributed store hands it to its worker (:class:`pskv.worker.compressing.PushCompression`),
    which compresses per part of each key with residuals of its own.

    Args:
        params: what the user passed to ``set_gradient_compression``.

    Raises:
        InvalidArgumentError, InvalidTypeError: ``params`` names no known type or a bad value.
    """

    def __init__(self, params: Mapping[str, Any]) -> None:
        if not isinstance(params, Mapping):
            self.compressor: Compressor = create(params)  # raises the type error
        rest = dict(params)
        both_ways = rest.pop("both_ways", False)
        if not isinstance(both_ways, bool):
            raise InvalidArgumentError(f"gradient compression: both_ways must be True or False, got {both_ways!r}")
        #: the servers also compress what they send back (sums of gradients; the distributed stores)
        self.both_ways = both_ways
        min_size = rest.pop("min_size", 0)
        if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 0:
            raise InvalidArgumentError(f"gradient compression: min_size must be an int >= 0 (elements), got {min_size!r}")
        #: keys of fewer elements travel uncompressed (BytePS's BYTEPS_MIN_COMPRESS_BYTES; 0: every key, as MXNet)
        self.min_size = min_size
        self.compressor = create(rest)
        self.residuals = Residuals()
        self._on_device: dict[tuple[Any, int], Any] = {}  # residuals of tensors on an accelerator
        self._saved_on_device: dict[tuple[Any, int], np.ndarray[Any, Any]] = {}  # load_residuals: moved there at use

    @property
    def params(self) -> dict[str, Any]:
        """The compressor's parameters, complete (JSON-able), and ``both_ways`` / ``min_size`` if set."""
        return {**self.compressor.params, **({"both_ways": True} if self.both_ways else {}),
                **({"min_size": self.min_size} if self.min_size else {})}

    def applies(self, meta: ArrayMeta, summed: bool = False) -> bool:
        """Whether pushes of a key like ``meta`` are compressed (not ``summed``, at least ``min_size`` elements):
        the one rule, for these stores and for each worker's (:mod:`pskv.worker.compressing`)."""
        return not summed and meta.size >= self.min_size

    def check(self, key: Any, meta: ArrayMeta, op: str) -> None:
        """Refuse a value compression cannot carry (before anything runs).

        Raises:
            InvalidArgumentError: the key's dtype is not float32 (a key compression applies to).
        """
        if meta.dtype != "float32" and self.applies(meta):
            raise InvalidArgumentError(f"{op} of key {key!r}: gradient compression {self.compressor.type!r} takes "
                                       f"float32 values only (as MXNet's); the key holds {meta.dtype}")

    def exchange(self, key: Any, values: list[Any]) -> list[Any]:
        """What a receiver sums for ``values`` (one per device): each compressed with its
        device's residual, then decoded; same kind, shape and device as each value.

        A tensor on an accelerator is compressed there, with a residual on that device
        (:mod:`pskv.compression.ontorch`: every registered type, in the NumPy classes' wire format).
        """
        out = []
        for device, value in enumerate(values):
            meta = describe(value)
            if meta.device != "cpu" and ontorch.supports(self.compressor):
                flat = value.detach().reshape(-1)
                residual = self._on_device.get((key, device))
                if residual is None:
                    residual = self._on_device[(key, device)] = self._device_residual(key, device, flat)
                payload = ontorch.compress(self.compressor, flat, residual)
                out.append(ontorch.decompress(self.compressor, payload, flat.numel()).reshape(meta.shape))
                continue
            flat = np.ascontiguousarray(to_numpy(value), np.float32).reshape(-1)
            payload = self.compressor.compress(flat, self.residuals.get(key, device, flat.size))
            decoded = from_wire(self.compressor.decompress(payload, flat.size).reshape(meta.shape), meta)
            out.append(decoded if meta.device == "cpu" else clone(decoded, device=meta.device))
        return out

    # -- state for checkpoints ---------------------------------------------------------------
    def residual_state(self) -> list[tuple[Any, int, np.ndarray[Any, Any], bool]]:
        """Every residual as ``(key, device, values, on_device)``: float32 CPU copies, ``on_device``
        for those kept on an accelerator (and those loaded for one, not used yet)."""
        out = [(key, device, res.copy(), False) for (key, device), res in self.residuals.items()]
        out += [(key, device, np.array(to_numpy(res), np.float32).reshape(-1), True)
                for (key, device), res in self._on_device.items()]
        out += [(key, device, res.copy(), True) for (key, device), res in self._saved_on_device.items()
                if (key, device) not in self._on_device]
        return out

    def load_residuals(self, saved: list[tuple[Any, int, np.ndarray[Any, Any], bool]]) -> None:
        """Replace every residual by ``saved`` (as :meth:`residual_state` gives them; the caller checked
        them against the keys): CPU ones at once, accelerator ones on that device at their next use."""
        self.residuals.clear()
        self._on_device.clear()
        self._saved_on_device.clear()
        for key, device, values, on_device in saved:
            if on_device:
                self._saved_on_device[(key, device)] = np.array(values, np.float32)
            else:
                self.residuals.load(key, device, values)

    def _device_residual(self, key: Any, device: int, flat: Any) -> Any:
        """A new residual on ``flat``'s device: a loaded one of its size, else zeros."""
        saved = self._saved_on_device.pop((key, device), None)
        if saved is not None and saved.size == flat.numel():
            return flat.new_tensor(saved)
        return flat.new_zeros(flat.numel())


class _NewKey(Protocol):
    """What :func:`key_compressions` reads and sets of a new key's layout (:class:`pskv.worker.layout.KeyLayout`)."""

    meta: ArrayMeta
    own: Compressor | None

    @property
    def sparse(self) -> bool: ...


def key_compressions(compression: Any, keys: Sequence[Any], layouts: Sequence[_NewKey]) -> None:
    """Give each new key's layout the compression an ``init(keys, ..., compression=)`` names for it (``own``).

    ``compression``: None (no key's own), one dict of parameters for every key
    (``{'type': '2bit', 'threshold': 0.5}``: :func:`pskv.compression.create`), or a list of
    them (or None), one per key. ``layouts``: the keys', in ``keys``' order. Every worker must
    give a key the same (:func:`agreed`: the init's meeting compares it).

    Raises:
        InvalidArgumentError, InvalidTypeError: a list of another length, an unknown type or a bad
            parameter (``both_ways`` and ``min_size`` are the store's, not a key's), a key that is
            not float32 (compression takes float32 values only).
        NotSupportedError: a row-sparse key (its pushes are rows).
    """
    if compression is None:
        return
    listed = list(compression) if isinstance(compression, (list, tuple)) else [compression] * len(keys)
    if len(listed) != len(keys):
        raise InvalidArgumentError(f"init: {len(listed)} compressions for {len(keys)} keys; give one per key, or "
                                   "one dict for all")
    for key, params, rec in zip(keys, listed, layouts):
        if params is None:
            continue
        compressor = create(params)
        if rec.sparse:
            raise NotSupportedError(f"init of key {key!r}: compression {compressor.type!r} does not take row-sparse "
                                    "keys (their pushes are rows)")
        if rec.meta.dtype != "float32":
            raise InvalidArgumentError(f"init of key {key!r}: compression {compressor.type!r} takes float32 values "
                                       f"only; the key holds {rec.meta.dtype}")
        rec.own = compressor  # equal ones (same parameters) share one KeyCompression on the worker


def agreed(own: Compressor | None) -> str:
    """What a key's own compression adds to the description of the key every worker's ``init`` must agree on."""
    return "" if own is None else f" compressed {own.params}"
