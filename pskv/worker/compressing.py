"""A worker's compression of its pushes (``set_gradient_compression`` on a distributed store).

The store's :class:`~pskv.kvstore.compressing.GradientCompression` holds what the user
asked for — the compressor, ``both_ways``, ``min_size`` and the rule of which keys it
covers; :class:`PushCompression` applies it to this worker's messages:

* which keys' pushes are compressed (:meth:`PushCompression.adopt`: float32 keys the
  store's rule covers; others were refused before they could be pushed);
* each part's payload, compressed with this worker's residual of the part
  (:mod:`pskv.compression.residuals`) on the worker's own two threads, while the first
  messages of a call go out (:meth:`PushCompression.payloads`). Through a socket a message
  carries the payloads (:data:`~pskv.protocol.Flag.COMPRESSED`, the compression named in
  its body, :attr:`PushCompression.body`); through shared memory the slot gets the values
  they decode to (:meth:`PushCompression.write_slots`);
* ``both_ways``: pulls and pushpulls of those keys through a socket ask the servers to
  compress the values they send back (:data:`~pskv.protocol.Flag.COMPRESS_REPLY`; the
  servers do when the values are sums: no optimizer on them), which
  :meth:`PushCompression.decoder` decodes;
* the residuals in server checkpoints (:meth:`PushCompression.save`,
  :meth:`PushCompression.restore`, the policy in :mod:`pskv.worker.residuals`).

:class:`NoCompression` is every worker's until then: nothing compressed, and a
compressed reply is a protocol error.

**A key's own compression** (``init(..., compression=)``, :func:`pskv.kvstore.compressing.key_compressions`;
what ``pskv.torch``'s ``Compression.twobit()`` and the like use) is held by either owner: such a key's
pushes are compressed by its compression, whatever the store's — ``summed`` keys too, since the
servers sum what they decode — with residuals of its own. Each compression is a
:class:`KeyCompression` (its residuals per part, its two threads; the store's is one too), and
a message carries the parts of one compression (:meth:`NoCompression.push_groups`), so the servers
decode each message by the compression its body names: nothing about it is sent at init. Its
replies travel uncompressed, and its residuals are not in server checkpoints (a resumed job's
start at zero).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np

from pskv.arrays import ArrayMeta
from pskv.compression import Compressor, Residuals
from pskv.compression.residuals import SavedResiduals, write_worker_file
from pskv.errors import ProtocolError
from pskv.protocol import Flag, Header, node_name
from pskv.protocol.bodies import CompressionParams
from pskv.worker.layout import KeyLayout, Part, part_view
from pskv.worker.observe import CallObserver
from pskv.worker.residuals import RestoredResiduals

__all__ = ["KeyCompression", "NoCompression", "PushCompression", "Settings"]


class Settings(Protocol):
    """What a worker takes from the store's :class:`~pskv.kvstore.compressing.GradientCompression`."""

    compressor: Compressor
    both_ways: bool
    min_size: int

    @property
    def params(self) -> dict[str, Any]: ...

    def applies(self, meta: ArrayMeta, summed: bool = False) -> bool: ...


class KeyCompression:
    """One compression of pushes: its compressor, the residual of each part it compressed, two threads.

    Args:
        compressor: what the parts' payloads are made with.
        observe: the worker's observer (the ``compress`` spans).
        both_ways: the replies of its keys come compressed too (the store's ``both_ways``).
    """

    def __init__(self, compressor: Compressor, observe: CallObserver, both_ways: bool = False) -> None:
        self.compressor = compressor
        self.both_ways = both_ways
        self.body = CompressionParams(compressor.params).encode()  # every message it compresses names it
        self._observe = observe
        self.residuals = Residuals()  # per (server key, offset): what compression left out
        self._pool: ThreadPoolExecutor | None = None  # made at the first compressed push

    def payloads(self, items: Sequence[Part]) -> Future[list[np.ndarray[Any, Any]]]:
        """The payloads of a message's parts ``items``, being made on a compressing thread."""
        if self._pool is None:  # NumPy's and Numba's loops let go of the GIL: two threads compress
            self._pool = ThreadPoolExecutor(2, thread_name_prefix="pskv-compress")
        return self._pool.submit(self._compress, items)

    def _compress(self, items: Sequence[Part]) -> list[np.ndarray[Any, Any]]:
        """Each part's payload, compressed with this worker's residual of the part (which it updates)."""
        start = self._observe.now()
        payloads = [self.compressor.compress(part_view(rec, rec.outgoing, i),
                                             self.residuals.get((rec.skey, rec.parts[i][1]), 0, rec.parts[i][2]))
                    for rec, i in items]
        self._observe.compressed(start, items)
        return payloads

    def write_slots(self, items: Sequence[Part], payloads: Future[list[np.ndarray[Any, Any]]]) -> None:
        """Write into each part's shared-memory slot what its payload decodes to (what the server would
        decode: no network to save on)."""
        for (rec, i), payload in zip(items, payloads.result()):
            np.copyto(rec.shm[i].slot, self.compressor.decompress(payload, rec.parts[i][2]))  # type: ignore[union-attr]

    def close(self) -> None:
        """Stop the compressing threads (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


Groups = list[tuple["KeyCompression | None", list[KeyLayout]]]


class NoCompression:
    """A worker without the store's compression: only keys initialised with their own are compressed,
    and no reply may be."""

    on = False
    both_ways = False  # replies of compressed keys' sums come compressed too
    body = ""  # the compression, as every compressed message names it in its body

    def __init__(self) -> None:
        self._own: dict[int, KeyCompression] = {}  # server key -> the compression it was initialised with
        self._by: dict[Compressor, KeyCompression] = {}  # one per distinct compression (its messages, its threads)
        self._kept: list[tuple[KeyCompression, dict[Any, np.ndarray[Any, Any]]]] = []  # the residuals at the last commit

    @property
    def params(self) -> dict[str, Any]:
        """The compression as ``set_gradient_compression`` got it (complete), or ``{}``."""
        return {}

    def adopt(self, layouts: Sequence[KeyLayout], summed: bool, observe: CallObserver | None = None) -> None:
        """Mark which of the new keys ``layouts`` have their pushes compressed: those with a compression of
        their own (``rec.own``: its :class:`KeyCompression` observed by ``observe``) and those the store's rule covers."""
        for rec in layouts:
            rec.compress = rec.own is not None or self._covers(rec, summed)
            if rec.own is not None:
                sender = self._by.get(rec.own)
                if sender is None:
                    assert observe is not None, "a key's own compression needs the worker's observer"
                    sender = self._by[rec.own] = KeyCompression(rec.own, observe)
                self._own[rec.skey] = sender

    def _covers(self, rec: KeyLayout, summed: bool) -> bool:
        """Whether the store's compression covers a new key (no: there is none)."""
        return False

    def _compressions(self) -> list[KeyCompression]:
        return list(self._by.values())

    def committed(self) -> None:
        """An elastic job's commit: keep a copy of every residual, which :meth:`restored` puts back (call it
        between operations: compressing pushes change them)."""
        self._kept = [(c, c.residuals.copy()) for c in self._compressions()]

    def restored(self) -> None:
        """An elastic job's restore: every residual as at the last commit (the voided steps' never happened)."""
        kept = {id(c): res for c, res in self._kept}
        for compression in self._compressions():
            compression.residuals.reset(kept.get(id(compression), {}))

    def _sender(self, rec: KeyLayout) -> KeyCompression | None:
        """The compression of a key whose pushes are compressed."""
        return self._own.get(rec.skey)

    def push_groups(self, layouts: Sequence[KeyLayout]) -> Groups:
        """``layouts`` by the compression of their pushes: each compression's keys, then the plain ones (None)."""
        groups: dict[int, tuple[KeyCompression | None, list[KeyLayout]]] = {}
        for rec in layouts:
            sender = self._sender(rec) if rec.compress else None
            groups.setdefault(id(sender), (sender, []))[1].append(rec)
        return sorted(groups.values(), key=lambda g: g[0] is None)

    def pull_groups(self, layouts: Sequence[KeyLayout]) -> list[tuple[Sequence[KeyLayout], bool]]:
        """``layouts`` as ``(keys, whether their replies come compressed)``: none here."""
        return [(layouts, False)]

    def decoder(self, header: Header, node: int) -> Compressor | None:
        """The compressor a reply's values are decoded with (None: not compressed).

        Raises:
            ProtocolError: a compressed reply this worker did not ask for, or under another compression.
        """
        if not header.flags & Flag.COMPRESSED:
            return None
        raise ProtocolError(f"{node_name(node)} answered with values compressed as {header.body[:200]!r}, which "
                            "this worker did not ask for")

    def save(self, directory: str | os.PathLike[str], num_workers: int) -> str | None:
        """Write the residuals into a server checkpoint ``directory``; the file's name (None: nothing to save)."""
        return None

    def restore(self, directory: str | os.PathLike[str], manifest: Mapping[str, Any], num_workers: int) -> None:
        """Take residuals from a server checkpoint ``directory``: none to take."""

    def close(self) -> None:
        """Stop the compressing threads (idempotent)."""
        for sender in self._by.values():
            sender.close()


class PushCompression(NoCompression):
    """Compresses the pushes of one worker, with its residuals and its own two compressing threads.

    Args:
        settings: the store's compression (:class:`~pskv.kvstore.compressing.GradientCompression`).
        rank: this worker's rank (its residuals file); ``num_servers``: the job's (saved with them).
        observe: the worker's observer (the ``compress`` spans).
    """

    on = True

    def __init__(self, settings: Settings, rank: int, num_servers: int, observe: CallObserver) -> None:
        super().__init__()
        self._settings = settings
        self._store = KeyCompression(settings.compressor, observe, settings.both_ways)
        self.compressor = settings.compressor
        self.both_ways = settings.both_ways
        self.body = self._store.body
        self._rank = rank
        self._num_servers = num_servers
        self._restored = RestoredResiduals(rank)

    @property
    def params(self) -> dict[str, Any]:
        return self._settings.params

    def adopt(self, layouts: Sequence[KeyLayout], summed: bool, observe: CallObserver | None = None) -> None:
        """Mark which of the new keys ``layouts`` have their pushes compressed (their own compression, or
        float32 keys the store's rule covers), and give the latter the residuals restored for them."""
        super().adopt(layouts, summed, observe)
        if self._restored:
            self._restored.take([rec for rec in layouts if rec.skey not in self._own], self._store.residuals)

    def _covers(self, rec: KeyLayout, summed: bool) -> bool:
        return rec.meta.dtype == "float32" and self._settings.applies(rec.meta, summed)

    def _sender(self, rec: KeyLayout) -> KeyCompression | None:
        return self._own.get(rec.skey, self._store)

    def _compressions(self) -> list[KeyCompression]:
        return [self._store, *self._by.values()]

    def pull_groups(self, layouts: Sequence[KeyLayout]) -> list[tuple[Sequence[KeyLayout], bool]]:
        """``both_ways``: the store's compressed keys (their replies come compressed), then the others."""
        squeezed = [rec for rec in layouts if rec.compress and rec.skey not in self._own] if self.both_ways else []
        if not squeezed:
            return [(layouts, False)]
        return [(squeezed, True), ([rec for rec in layouts if not rec.compress or rec.skey in self._own], False)]

    # -- pushes ----------------------------------------------------------------------------
    def payloads(self, items: Sequence[Part]) -> Future[list[np.ndarray[Any, Any]]]:
        """The payloads of a message's parts ``items`` under the store's compression (:meth:`KeyCompression.payloads`)."""
        return self._store.payloads(items)

    def write_slots(self, items: Sequence[Part], payloads: Future[list[np.ndarray[Any, Any]]]) -> None:
        """:meth:`KeyCompression.write_slots` of the store's compression."""
        self._store.write_slots(items, payloads)

    def decoder(self, header: Header, node: int) -> Compressor | None:
        if header.flags & Flag.COMPRESSED and header.body == self.body:
            return self.compressor
        return super().decoder(header, node)

    # -- checkpoints -------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike[str], num_workers: int) -> str | None:
        """Write this worker's residuals into the server checkpoint ``directory``; the file's name.

        Call it between operations (the residuals change while pushes are compressed).

        Raises:
            CheckpointError: the file could not be written.
        """
        parts = {where: residual.copy() for (where, _), residual in self._store.residuals.items()}
        saved = SavedResiduals(self._rank, num_workers, self._num_servers, self.params, parts)
        return write_worker_file(directory, saved).name

    def restore(self, directory: str | os.PathLike[str], manifest: Mapping[str, Any], num_workers: int) -> None:
        """Take this worker's residuals from the server checkpoint ``directory`` (whose manifest is
        ``manifest``); each key's are installed when it is created again (:meth:`adopt`) if its parts match.

        Raises:
            CheckpointError: this worker's file there is unreadable or damaged.
        """
        self._restored.read(directory, manifest, num_workers, self.params)

    def close(self) -> None:
        super().close()
        self._store.close()
