"""``StoreFrontEnd``: what every pskv store does before its own backend touches a value.

MXNet's ``KVStoreDist`` inherits grouping and merging from ``KVStoreLocal``; pskv's
stores share this front end instead. It is written once for ``local``, ``device``, the
``dist_*`` stores and the all-reduce stores (``horovod``, ``nccl``):

* the store's parsed :class:`~pskv.kvstore.types.StoreType`, its engine and CPU kernels;
* argument normalisation — one key or a list, values and outs paired with keys, a key
  listed twice in a push summed — and the key-kind rule (int or str, one per store);
* validation before anything runs: unknown keys, shapes and dtypes of values and outs
  (:func:`~pskv.kvstore.checks.check_like`), exactly one value per key for ``init``
  and ``broadcast``, duplicate keys, a closed store;
* engine submission: per-key order, priorities, ``block=False`` handles, timeouts.

A store supplies its key records (:meth:`_lookup`; each record has a ``meta``, the
:class:`~pskv.arrays.ArrayMeta` values must match) and, if not ``PSKV_DEFAULT_TIMEOUT``,
its default timeout (the distributed stores use ``PSKV_REQUEST_TIMEOUT``).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

from pskv.arrays import ArrayMeta, CpuKernels
from pskv.arrays.rowsparse import is_row_sparse
from pskv.config import Config
from pskv.errors import DuplicateKeyError, InvalidArgumentError, NotSupportedError, StoreClosedError, UnknownKeyError
from pskv.kvstore.base import KVStoreBase
from pskv.kvstore.checks import check_like, check_priority
from pskv.kvstore.compressing import GradientCompression
from pskv.kvstore.engine import Engine
from pskv.kvstore.keys import SERVERS_DENSE, Key, KeyKind, as_key_list, merge_repeats, pair_up
from pskv.kvstore.types import StoreType

__all__ = ["StoreFrontEnd"]


class _Record(Protocol):
    """What the front end needs of a store's key record."""

    @property
    def meta(self) -> ArrayMeta: ...


R = TypeVar("R", bound=_Record)


class StoreFrontEnd(KVStoreBase, Generic[R]):
    """Shared set-up, normalisation, validation and submission of pskv's stores.

    Row-sparse values (:class:`~pskv.arrays.rowsparse.RowSparse`, torch sparse COO
    tensors) are refused with ``NotSupportedError`` saying :attr:`_sparse_refusal`,
    unless a store sets it to None (the single-process stores); those stores also set
    :attr:`_casts_outs`: outs of another floating dtype are cast into.

    Args:
        name: the store type name (lower-cased; aliases allowed).
        config: local settings (default: from the environment).
        default_timeout: seconds an operation, ``wait()`` or a handle's ``wait()`` waits
            when given no timeout (default: ``config.default_timeout``).
        engine_threads: the engine's threads (default: ``config.engine_threads``; the
            all-reduce stores run one collective at a time).
    """

    #: Why row-sparse values are refused (None: accepted).
    _sparse_refusal: str | None = SERVERS_DENSE
    #: Whether a pull's out may have another floating dtype than its key (the copy casts).
    _casts_outs: bool = False

    def __init__(self, name: str, config: Config | None, default_timeout: float | None = None,
                 engine_threads: int | None = None) -> None:
        self._type = name
        self._store_type = StoreType.parse(name)
        self._config = Config.from_env() if config is None else config
        self._kernels = CpuKernels(self._config.kernel_threads, self._config.kernel_parallel_bytes)
        self._default_timeout = self._config.default_timeout if default_timeout is None else default_timeout
        threads = self._config.engine_threads if engine_threads is None else engine_threads
        self._engine = Engine(threads, name=f"pskv-{name}", default_timeout=self._default_timeout)
        self._key_kind = KeyKind()
        self._closed = False
        self._barrier_before_exit = True
        self._compression: GradientCompression | None = None  # set_gradient_compression

    # -- what a store supplies -------------------------------------------------------------
    @abc.abstractmethod
    def _lookup(self, key: Key) -> R | None:
        """The record of ``key``, or None if it does not exist."""

    @abc.abstractmethod
    def _holds_keys(self) -> bool:
        """Whether any key was initialised."""

    def _compression_set(self, compression: GradientCompression) -> None:
        """Hook: ``set_gradient_compression`` chose ``compression`` (the distributed stores tell the servers)."""

    def _timeout(self, timeout: float | None) -> float:
        """``timeout``, or the store's default for operations."""
        return self._default_timeout if timeout is None else timeout

    # -- properties ------------------------------------------------------------------------
    @property
    def type(self) -> str:
        """The type name given to ``create`` (lower-cased)."""
        return self._type

    @property
    def store_type(self) -> StoreType:
        """What the type means (parsed once)."""
        return self._store_type

    @classmethod
    def is_capable(cls, capability: str) -> bool:
        """True for ``'optimizer'``, ``'row_sparse_pull'`` and ``'gradient_compression'``: pskv's own stores offer them.

        Raises:
            InvalidArgumentError: unknown capability.
        """
        cls._capability(capability)
        return True

    # -- gradient compression ----------------------------------------------------------------
    def set_gradient_compression(self, compression_params: Mapping[str, Any]) -> None:
        """Compress every pushed gradient (MXNet's ``set_gradient_compression``).

        ``{'type': '2bit', 'threshold': 0.5}`` (MXNet's 2-bit quantization, threshold
        default 0.5) or ``{'type': '1bit', 'threshold': t}`` (MXNet 2.0's); the types are
        in :data:`pskv.compression.COMPRESSORS`. In the single-process stores each value a
        push carries (one per device) is compressed with its own residual — what earlier
        pushes left out — and the sum is made of the decoded values; the ``dist_*`` stores
        first sum a worker's device values, then compress that with one residual per part
        of the key per worker, and the servers sum what they decode. Pulls return full
        precision; ``init`` is never compressed; keys made with ``init(summed=True)``
        are not compressed. Float32 keys only. Besides the compressor's own parameters:
        ``'min_size': n`` leaves keys of fewer than ``n`` elements uncompressed (default 0);
        ``'both_ways': True`` has the servers compress the sums they send back (the
        distributed stores; not with an optimizer on the servers).

        Calling it again with the same parameters changes nothing.

        Raises:
            InvalidArgumentError: called after ``init`` with other parameters (MXNet's
                rule: the residuals are made with the keys), or bad parameters (unknown type or parameter, a
                threshold not > 0 for ``2bit``).
            InvalidTypeError: ``compression_params`` is not a dict.
        """
        self._check_open("set_gradient_compression")
        compression = GradientCompression(compression_params)
        if self._compression is not None and self._compression.params == compression.params:
            return  # the same again (a second Trainer on this store): nothing changes
        if self._holds_keys():
            raise InvalidArgumentError("set_gradient_compression must be called before the first init (as in "
                                       "MXNet): this store holds keys already")
        self._compression_set(compression)
        self._compression = compression

    def _check_compressible(self, pairs: Sequence[tuple[Key, R, list[Any]]], op: str) -> None:
        """With compression set, refuse a push of values it cannot carry (before anything runs)."""
        if self._compression is not None:
            for k, rec, vals in pairs:
                if not getattr(rec, "summed", False):
                    self._refuse_sparse_compression(k, rec.meta, getattr(rec, "rows", None) is not None
                                                    or any(is_row_sparse(v) for v in vals), op)
                    self._compression.check(k, rec.meta, op)

    def _refuse_sparse_compression(self, key: Key, meta: ArrayMeta, sparse: bool, op: str) -> None:
        """MXNet's rule: gradient compression does not take row-sparse keys or values.

        Raises:
            NotSupportedError: compression is set, applies to ``key``, and it is row-sparse.
        """
        if sparse and self._compression is not None and self._compression.applies(meta):
            raise NotSupportedError(f"{op} of key {key!r}: gradient compression {self._compression.compressor.type!r} "
                                    "does not take row-sparse keys or values (as MXNet's); push dense values, "
                                    "or init the key with summed=True or below 'min_size'")

    # -- normalisation and checks ----------------------------------------------------------
    def _check_open(self, op: str) -> None:
        if self._closed:
            raise StoreClosedError(f"cannot {op}: the store is closed")

    def _key_list(self, key: Any, creates: bool = False) -> tuple[list[Key], bool]:
        """``key`` as a list, and whether one key (not a list) was given; checks the key kind."""
        keys, single = as_key_list(key)
        self._key_kind.check(keys, fix=creates)
        return keys, single

    def _record(self, key: Key, op: str) -> R:
        """The record of an existing key.

        Raises:
            UnknownKeyError: ``key`` was never initialised.
        """
        rec = self._lookup(key)
        if rec is None:
            raise UnknownKeyError(key, op)
        return rec

    @staticmethod
    def _check_like(key: Key, rec: R, arrays: Sequence[Any], op: str, casts: bool = False) -> None:
        check_like(key, rec.meta, arrays, op, casts)

    def _new_values(self, key: Any, value: Any, op: str) -> tuple[list[Key], list[tuple[Key, Any]]]:
        """``(keys, [(key, its one value)])`` for ``init``: new, distinct keys with one value each.

        Raises:
            InvalidArgumentError: a key got several values.
            DuplicateKeyError: a key exists already or is listed twice.
        """
        keys, staged = self._one_value_each(key, value, op)
        seen: set[Key] = set()
        for k, _ in staged:
            if k in seen or self._lookup(k) is not None:
                raise DuplicateKeyError(k)
            seen.add(k)
        return keys, staged

    def _one_value_each(self, key: Any, value: Any, op: str) -> tuple[list[Key], list[tuple[Key, Any]]]:
        """``(keys, [(key, its one value)])`` for ``init`` and ``broadcast``.

        Raises:
            InvalidArgumentError: a key got several values.
        """
        keys, single = self._key_list(key)
        staged = []
        for k, vals in pair_up(keys, single, value, "value", self._sparse_refusal):
            if len(vals) != 1:
                raise InvalidArgumentError(f"{op} of key {k!r} got {len(vals)} values; give exactly one")
            staged.append((k, vals[0]))
        return keys, staged

    def _push_pairs(self, key: Any, value: Any, op: str, listed: tuple[list[Key], bool] | None = None,
                    refusal: str | None = None) -> list[tuple[Key, R, list[Any]]]:
        """``(key, record, values)`` per distinct key; a key listed twice gets all its values (summed).

        ``listed``: ``key`` as :meth:`_key_list` gave it already; ``refusal``: why this call
        refuses row-sparse values (default: the store's :attr:`_sparse_refusal`).

        Raises:
            UnknownKeyError, ShapeMismatchError, DTypeMismatchError: before anything runs.
        """
        keys, single = self._key_list(key) if listed is None else listed
        out = []
        lookup = self._lookup  # every push comes here: the lookup and the check without their wrappers
        refused = self._sparse_refusal if refusal is None else refusal
        pairs = pair_up(keys, single, value, "value", refused)
        for k, vals in (pairs if single else merge_repeats(pairs)):
            rec = lookup(k)
            if rec is None:
                raise UnknownKeyError(k, op)
            check_like(k, rec.meta, vals, op)
            out.append((k, rec, vals))
        return out

    def _out_targets(self, key: Any, out: Any, op: str, listed: tuple[list[Key], bool] | None = None,
                     refusal: str | None = None) -> list[tuple[Key, R, list[Any]]]:
        """``(key, record, outs)`` per listed key, the outs checked against the record (pull, pushpull);
        ``listed`` and ``refusal`` as :meth:`_push_pairs`'."""
        keys, single = self._key_list(key) if listed is None else listed
        targets = []
        lookup = self._lookup
        for k, outs in pair_up(keys, single, out, "out", self._sparse_refusal if refusal is None else refusal):
            rec = lookup(k)
            if rec is None:
                raise UnknownKeyError(k, op)
            check_like(k, rec.meta, outs, op, self._casts_outs)
            targets.append((k, rec, outs))
        return targets

    # -- engine ----------------------------------------------------------------------------
    def _submit(self, op: str, keys: Sequence[Key], priority: int, fn: Callable[[], Any], block: bool,
                timeout: float | None, quick: bool = False) -> Any:
        """Run ``fn`` under the engine (per-key order, priority); a handle when not ``block``."""
        limit = self._default_timeout if timeout is None else timeout
        return self._engine.submit(op, keys, check_priority(priority), fn, block, limit, quick)

    def wait(self, keys: Any = None, timeout: float | None = None) -> None:
        """Wait for outstanding operations (on ``keys``, if given).

        Raises:
            OperationTimeoutError: still pending after ``timeout`` seconds.
            Exception: the first error of a non-blocking operation whose handle nobody
                waited on.
        """
        wanted = None if keys is None else as_key_list(keys)[0]
        self._engine.wait_all(wanted, self._timeout(timeout))

    def __enter__(self) -> StoreFrontEnd[R]:
        return self
