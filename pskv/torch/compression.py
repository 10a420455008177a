"""``Compression``: what a tensor is sent as in ``allreduce(compression=)`` (Horovod's interface).

A compressor's ``compress(tensor)`` returns ``(sent, ctx)`` and ``decompress(received, ctx)``
the tensor the caller gets back. ``Compression.none`` sends the tensor as it is;
``Compression.fp16`` sends floating-point tensors as float16 (half the bytes) and casts
the result back, as Horovod's does.

pskv's own gradient compressors (:mod:`pskv.compression`) are :class:`StoreCompressor` objects:
``Compression.twobit(threshold=0.5)``, ``onebit()``, ``topk(k=0.01)``, ``randomk()``,
``dithering()``, or any registered type by name (``Compression.named('1bit', threshold=0.5)``).
They do not change the tensor: the call's keys are initialised with the compression
(``init(..., compression=)`` of a store with servers), so each worker compresses what it
pushes with a residual per key and part (error feedback) and the servers sum the decoded
pushes (:mod:`pskv.worker.compressing`). A name used with a compression is a key of its own
(:func:`on_store`: ``<key>~2bit(threshold=0.5)``), so the same name without it, or with another,
never mixes residuals or sums. They take float32 tensors only (``InvalidArgumentError``
otherwise, as the stores' compression), and need servers: the all-reduce store (``-s 0``) and
the ``byteps`` store refuse them (``NotSupportedError``).
"""

from __future__ import annotations

from typing import Any

import torch

from pskv.compression import create
from pskv.errors import InvalidArgumentError, NotSupportedError

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "StoreCompressor", "Compression", "on_store"]


class Compressor:
    """The interface: compress a tensor with the context needed to decompress it."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The tensor to send and a context for :meth:`decompress`."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The received tensor as the caller's."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression (the default): the tensor itself."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """``(tensor, None)``."""
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """``tensor``."""
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16; others as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """A float16 copy of a floating-point tensor (the tensor itself otherwise), and its dtype."""
        sent = tensor.to(torch.float16) if tensor.dtype.is_floating_point else tensor
        return sent, tensor.dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """The received tensor cast back to the dtype it was compressed from."""
        return tensor.to(ctx) if ctx.is_floating_point else tensor


class StoreCompressor:
    """One of pskv's gradient compressions: the keys of the calls it is given to are compressed by the store.

    ``compress`` and ``decompress`` leave the tensor as it is (the worker compresses, the
    servers decode); ``compress`` checks it is float32.

    Raises:
        InvalidArgumentError: an unknown type, parameter or bad value (:func:`pskv.compression.create`).
    """

    def __init__(self, params: dict[str, Any]) -> None:
        #: the compression's parameters, complete (the store's ``init(compression=)``)
        self.params = create(params).params
        rest = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()) if k != "type")
        #: what the keys of the calls it compresses end with
        self.suffix = f"~{self.params['type']}({rest})"

    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """``(tensor, None)``.

        Raises:
            InvalidArgumentError: ``tensor`` is not float32.
        """
        if tensor.dtype != torch.float32:
            raise InvalidArgumentError(f"{self!r} takes float32 tensors only (as pskv's gradient compression); "
                                       f"got {tensor.dtype}: use Compression.none or fp16 for it")
        return tensor, None

    def decompress(self, tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """``tensor``: the servers' sum of the decoded pushes."""
        return tensor

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StoreCompressor) and self.params == other.params

    def __hash__(self) -> int:
        return hash(self.suffix)

    def __repr__(self) -> str:
        return f"Compression.named({self.params['type']!r}{''.join(f', {k}={v!r}' for k, v in self.params.items() if k != 'type')})"


class Compression:
    """The compressors by name, as Horovod's ``hvd.Compression``, and pskv's own (:class:`StoreCompressor`)."""

    none = NoneCompressor
    fp16 = FP16Compressor

    @staticmethod
    def named(type: str, **params: Any) -> StoreCompressor:  # noqa: A002 (pskv.compression's key)
        """pskv's compression ``type`` (:data:`pskv.compression.COMPRESSORS`) with ``params``."""
        return StoreCompressor({"type": type, **params})

    @staticmethod
    def twobit(threshold: float = 0.5) -> StoreCompressor:
        """MXNet's ``2bit``: ``-threshold``, 0 or ``+threshold`` per element, with residuals."""
        return StoreCompressor({"type": "2bit", "threshold": threshold})

    @staticmethod
    def onebit(ef: bool = True) -> StoreCompressor:
        """BytePS's ``onebit``: the signs scaled by the mean magnitude (``ef``: error feedback)."""
        return StoreCompressor({"type": "onebit", "ef": ef})

    @staticmethod
    def topk(k: float = 0.01, ef: bool = True) -> StoreCompressor:
        """``topk``: the ``k`` largest magnitudes (a fraction < 1, or a count), with their indices."""
        return StoreCompressor({"type": "topk", "k": k, "ef": ef})

    @staticmethod
    def randomk(k: float = 0.01, seed: int = 0, ef: bool = True) -> StoreCompressor:
        """``randomk``: ``k`` values chosen by a seeded generator, with their indices."""
        return StoreCompressor({"type": "randomk", "k": k, "seed": seed, "ef": ef})

    @staticmethod
    def dithering(s: int = 2, norm: str = "max", seed: int = 0, ef: bool = True) -> StoreCompressor:
        """BytePS's ``dithering``: ``s`` levels, stochastically rounded."""
        return StoreCompressor({"type": "dithering", "s": s, "norm": norm, "seed": seed, "ef": ef})


def on_store(compression: Any, job: Any, keys: list[str], function: str) -> tuple[list[str], dict[str, Any]]:
    """The keys of a call made with ``compression`` on ``job``'s store, and each one's compression
    (``{key: params}``: empty unless ``compression`` is a :class:`StoreCompressor`).

    Raises:
        NotSupportedError: a :class:`StoreCompressor` on a store without servers (the all-reduce
            store) or on the ``byteps`` store (its keys are declared by their first use, without one).
    """
    if not isinstance(compression, StoreCompressor):
        return keys, {}
    if not job.servers or job.kind.summation_only:
        why = ("its keys are declared by their first use, without a compression: use the dist_sync store"
               if job.servers else "it has no servers to decode them (pskv launch -s 0): launch with servers "
               "(-s N) or use Compression.none or Compression.fp16")
        raise NotSupportedError(f"{function}(compression={compression!r}): the {job.kind.name} store does not "
                                f"take pskv's gradient compression: {why}")
    keys = [k + compression.suffix for k in keys]
    return keys, dict.fromkeys(keys, compression.params)
