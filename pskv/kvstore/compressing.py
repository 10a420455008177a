"""A store's gradient compression: ``set_gradient_compression`` and what a compressed push sums.

MXNet's rules, kept: the call comes before the first ``init`` (the residuals are sized
and zeroed with the keys; MXNet's ``device`` store silently mixed states when it came
later — pskv refuses with a clear error), compression applies to float32 values only
(MXNet checks it in its ``dist`` stores), and ``init`` itself is never compressed. Each
value a push carries — one per device — is compressed with its own residual (per key
and device, as MXNet's ``device`` store does), and the store sums what the receiver
decodes. Beyond MXNet: the ``local`` store and ``pushpull`` compress too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pskv.arrays import ArrayMeta, clone, describe, from_wire, to_numpy
from pskv.compression import Compressor, Residuals, create, ontorch
from pskv.errors import InvalidArgumentError

__all__ = ["GradientCompression"]


class GradientCompression:
    """A compressor and the residuals of one store (per key and device).

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

    @property
    def params(self) -> dict[str, Any]:
        """The compressor's parameters, complete (JSON-able), and ``both_ways`` / ``min_size`` if set."""
        return {**self.compressor.params, **({"both_ways": True} if self.both_ways else {}),
                **({"min_size": self.min_size} if self.min_size else {})}

    def applies(self, meta: ArrayMeta, summed: bool = False) -> bool:
        """Whether pushes of a key like ``meta`` are compressed (not ``summed``, at least ``min_size`` elements)."""
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
                    residual = self._on_device[(key, device)] = flat.new_zeros(flat.numel())
                payload = ontorch.compress(self.compressor, flat, residual)
                out.append(ontorch.decompress(self.compressor, payload, flat.numel()).reshape(meta.shape))
                continue
            flat = np.ascontiguousarray(to_numpy(value), np.float32).reshape(-1)
            payload = self.compressor.compress(flat, self.residuals.get(key, device, flat.size))
            decoded = from_wire(self.compressor.decompress(payload, flat.size).reshape(meta.shape), meta)
            out.append(decoded if meta.device == "cpu" else clone(decoded, device=meta.device))
        return out
