"""The embedding tables a :class:`~pskv.parallel.Trainer` drives, and their part in its steps.

A model's :class:`~pskv.parallel.Embedding` tables live in the store, not in its
parameters: their rows are pulled and their gradients pushed by the modules themselves.
The trainer only keeps them in step with its buckets, through :class:`TrainerTables`:
its store is theirs, its optimizer runs in that store (``update_on_kvstore``), every step
pushes each table once (an empty push when no row was touched: synchronous rounds need
one push per worker), its gradients are scaled as the buckets', and ``step()`` waits for
those pushes. A model without tables holds an empty one: every call is a loop over nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from pskv.errors import InvalidArgumentError
from pskv.kvstore import KVStoreBase
from pskv.parallel.embedding import StoreTable, store_tables

__all__ = ["TrainerTables"]


class TrainerTables:
    """The store tables of the modules ``modules`` (a group's replicas, or the one module)."""

    def __init__(self, modules: Iterable[torch.nn.Module]) -> None:
        self._tables: list[StoreTable] = store_tables(modules)

    def __bool__(self) -> bool:
        return bool(self._tables)

    @property
    def tables(self) -> list[StoreTable]:
        """The tables (a copy of the list)."""
        return list(self._tables)

    def store(self, kvstore: str | KVStoreBase | None) -> KVStoreBase:
        """The store of the tables (a store name or None given: theirs).

        Raises:
            InvalidArgumentError: tables in several stores, or ``kvstore`` is another store.
        """
        stores = {id(t.kv): t.kv for t in self._tables}
        if len(stores) > 1:
            raise InvalidArgumentError(f"the model's embedding tables {self._keys()} live in "
                                       f"{len(stores)} stores; a Trainer drives one")
        kv = next(iter(stores.values()))
        if isinstance(kvstore, KVStoreBase) and kvstore is not kv:
            raise InvalidArgumentError(f"kvstore is not the store holding the embedding tables "
                                       f"{self._keys()} (a {kv.type!r} store): pass that one")
        return kv

    def check_update_on_kvstore(self, update_on_kvstore: bool) -> None:
        """The store's optimizer updates the tables' rows: there must be one.

        Raises:
            InvalidArgumentError: tables and ``update_on_kvstore`` False.
        """
        if self._tables and not update_on_kvstore:
            raise InvalidArgumentError(f"the embedding tables {self._keys()} live in the store, so "
                                       "its optimizer updates them: update_on_kvstore must be True")

    def attach(self, overlap: bool) -> None:
        """Pushed in backward like the buckets (``overlap``), else at ``step()`` (a plain module's
        batch size is known only then; ``grad_req`` 'add' accumulates till then)."""
        for table in self._tables:
            table.auto_push = overlap

    def begin_step(self, optimizer_batch: int | None, batch: int | None) -> None:
        """Start a step; gradients scaled by ``optimizer_batch / batch`` as the buckets' (the store's
        ``rescale_grad`` is for ``optimizer_batch``)."""
        for table in self._tables:
            table.scale = optimizer_batch / batch if optimizer_batch and batch else 1.0
            table.begin_step()

    def push(self) -> None:
        """Push each table's gradients not pushed yet (an empty push if it got none: every step pushes
        once, as sync rounds need)."""
        for table in self._tables:
            table.flush(push_empty=True)

    def finish(self) -> None:
        """Wait for the tables' pushes; the next forward opens a new step.

        Raises:
            The first push's error, once every table's step is ended.
        """
        failure: BaseException | None = None
        for table in self._tables:
            try:
                table.wait()
            except BaseException as exc:
                failure = failure or exc
            table.end_step()
        if failure is not None:
            raise failure

    def detach(self) -> None:
        """The trainer is closing: the tables push by themselves again."""
        for table in self._tables:
            table.auto_push = True

    def _keys(self) -> list[object]:
        return [t.key for t in self._tables]
