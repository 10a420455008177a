"""MXNet KVStore semantics, written once and checked against every store.

torch.distributed keeps one test suite that every backend inherits; this is pskv's.
Each :class:`Contract` is a function of one store, run on every worker's store at once
(:meth:`~pskv.testing.stores.StoreGroup.run`), that asserts one semantic through the
public API only. In a distributed store a sum "over workers" is written in terms of
``kv.num_workers`` and ``kv.rank``: worker ``r`` contributes ``(r + 1) * x``, so the
servers must return ``x * n (n + 1) / 2`` — every worker counted once.

Which contracts apply follows from the :class:`~pskv.kvstore.StoreType`, through the
tags of :func:`abilities`:

* ``keys`` — ``init`` / ``push`` / ``pull`` / ``row_sparse_pull`` (not ``byteps``,
  which only offers ``pushpull`` and ``broadcast``);
* ``sync`` — a push joins one round per step, so "push then pull gives the sum" holds
  without an optimizer (``dist_async`` applies each push on arrival through an
  optimizer it requires: only checks that hold after ``wait`` + ``barrier`` apply);
* ``async`` — the opposite of ``sync``;
* ``optimizer`` — ``set_optimizer`` runs on the store (``servers_optimize``);
* ``summation_only`` — the BytePS contract.

Contracts marked ``own_store`` change something store-wide (an optimizer, the key kind,
closing) and get a fresh store; the others share one (keys come from
:meth:`~pskv.testing.stores.StoreGroup.next_key_base`, so no two checks meet).

Usage (pytest)::

    from pskv.testing.contracts import CONTRACTS, contracts_for, run_contract
    from pskv.testing.stores import StorePool, local_store

    @pytest.mark.parametrize("contract", contracts_for(local_store().store_type), ids=str)
    def test_my_store(contract): run_contract(local_store(), contract)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from pskv.errors import (
    DTypeMismatchError,
    DuplicateKeyError,
    InvalidArgumentError,
    KeyTypeError,
    NotSupportedError,
    RemoteError,
    ShapeMismatchError,
    StoreClosedError,
    UnknownKeyError,
)
from pskv.kvstore import KVStoreBase, StoreType
from pskv.optimizer import SGD
from pskv.testing.checks import create_keys, full, mine, over_workers, raises, same
from pskv.testing.stores import StoreGroup, StorePool, StoreSpec

__all__ = ["CONTRACTS", "Contract", "Keys", "abilities", "check_contract", "contracts_for", "run_contract"]

#: Seconds any single wait inside a check may take.
TIMEOUT = 20.0

#: A shape big enough to be split over every server when ``bigarray_bound`` is small (96 elements).
BIG = (12, 8)


@dataclasses.dataclass(frozen=True)
class Keys:
    """Fresh keys for one run of one contract: ``keys(i)`` is the ``i``-th (int or str)."""

    base: int
    kind: type = int

    def __call__(self, i: int = 0) -> int | str:
        return self.base + i if self.kind is int else f"k{self.base + i}"


Check = Callable[[KVStoreBase, Keys], Any]


@dataclasses.dataclass(frozen=True)
class Contract:
    """One semantic every applicable store must keep.

    Attributes:
        name: the test id (``'push_then_pull_gives_sum'``).
        check: ``check(store, keys)``, run on every worker's store at once.
        needs: tags of :func:`abilities` the store type must have.
        own_store: the check changes the store for good; it gets a fresh one.
        key_kind: ``int`` or ``str`` keys.
        across: checks the workers' results together (e.g. distinct ranks).
    """

    name: str
    check: Check
    needs: frozenset[str] = frozenset()
    own_store: bool = False
    key_kind: type = int
    across: Callable[[list[Any]], None] | None = None

    def applies(self, store_type: StoreType) -> bool:
        """Whether stores of ``store_type`` promise this semantic."""
        return self.needs <= abilities(store_type)

    def __str__(self) -> str:
        return self.name


def abilities(store_type: StoreType) -> frozenset[str]:
    """The contract tags a store type has (see the module docstring)."""
    tags = {"sync" if store_type.sync else "async"}
    tags.add("summation_only" if store_type.summation_only else "keys")
    if store_type.servers_optimize:
        tags.add("optimizer")
    return frozenset(tags)


#: Every contract, in the order they are run.
CONTRACTS: list[Contract] = []


def contract(*needs: str, own_store: bool = False, key_kind: type = int,
             across: Callable[[list[Any]], None] | None = None) -> Callable[[Check], Check]:
    """Register the decorated check as a contract named after the function."""
    def register(check: Check) -> Check:
        CONTRACTS.append(Contract(check.__name__, check, frozenset(needs), own_store, key_kind, across))
        return check
    return register


def contracts_for(store_type: StoreType) -> list[Contract]:
    """The contracts stores of ``store_type`` promise."""
    return [c for c in CONTRACTS if c.applies(store_type)]


def check_contract(group: StoreGroup, c: Contract) -> None:
    """Run ``c`` on every store of ``group`` (fresh keys), then its ``across`` check.

    Raises:
        AssertionError: the contract does not hold (the note names the worker).
        Exception: whatever the store raised where the contract expected success.
    """
    keys = Keys(group.next_key_base(), c.key_kind)

    def one(kv: KVStoreBase) -> Any:
        return c.check(kv, keys)
    one.__name__ = c.name
    results = group.run(one)
    if c.across is not None:
        c.across(results)


def run_contract(spec: StoreSpec, c: Contract, pool: StorePool | None = None) -> None:
    """Check ``c`` on a store of ``spec``: the shared group of ``pool``, or a fresh one.

    A contract that needs its own store, or a call without a pool, opens a new group
    and closes it afterwards.
    """
    if pool is not None and not c.own_store:
        check_contract(pool.get(spec), c)
        return
    group = spec.open()
    try:
        check_contract(group, c)
    finally:
        group.close()


# -- contracts: identity -------------------------------------------------------------------------
def _distinct_ranks(results: list[Any]) -> None:
    n = len(results)
    ranks, workers, local_ranks = zip(*results)
    assert sorted(ranks) == list(range(n)), f"ranks {ranks} of {n} workers"
    assert set(workers) == {n}, f"num_workers {workers} of {n} workers"
    # The harness starts every worker of a job on one host: local ranks are distinct too.
    assert sorted(local_ranks) == list(range(n)), f"local_ranks {local_ranks} of {n} workers on one host"


@contract(across=_distinct_ranks)
def store_properties(kv: KVStoreBase, keys: Keys) -> tuple[int, int, int]:
    """``type``/``store_type``/``rank``/``local_rank``/``num_workers``/``is_capable`` agree with each other."""
    t = kv.store_type
    assert kv.type == t.name, f"type {kv.type!r} but store_type.name {t.name!r}"
    assert StoreType.parse(kv.type) == t
    assert 0 <= kv.rank < kv.num_workers
    assert 0 <= kv.local_rank < kv.num_workers
    assert t.distributed or kv.num_workers == 1
    assert kv.is_capable("optimizer") == t.servers_optimize
    assert kv.is_capable("ROW_SPARSE_PULL") == (not t.summation_only)
    raises(InvalidArgumentError, lambda: kv.is_capable("teleport"), "is_capable of an unknown capability")
    return kv.rank, kv.num_workers, kv.local_rank


# -- contracts: init, push, pull --------------------------------------------------------------------
def _init_push_pull(kv: KVStoreBase, key: Any) -> None:
    kv.init(key, full((2, 3), 10.0 + kv.rank))  # rank 0's value counts
    same(kv.pull(key), full((2, 3), 10.0), "pull after init (rank 0's value)")
    out = full((2, 3), -1.0)
    kv.pull(key, out=out)
    same(out, full((2, 3), 10.0), "pull into out after init")
    if kv.store_type.sync:
        kv.push(key, mine(kv, full((2, 3), 1.0)))
        same(kv.pull(key), over_workers(kv, full((2, 3), 1.0)), "pull after push")


@contract("keys")
def int_keys(kv: KVStoreBase, keys: Keys) -> None:
    """init uses rank 0's value; pull returns it (new array or into out); a push's sum replaces it."""
    _init_push_pull(kv, keys(0))
    _init_push_pull(kv, np.int64(keys(1)))  # NumPy integers are int keys


@contract("keys", own_store=True, key_kind=str)
def str_keys(kv: KVStoreBase, keys: Keys) -> None:
    """The same with str keys (a store holds one kind of key: this one gets its own store)."""
    _init_push_pull(kv, keys(0))
    _init_push_pull(kv, keys(1))


@contract("keys", "sync")
def push_then_pull_gives_sum(kv: KVStoreBase, keys: Keys) -> None:
    """Several values per key are summed locally, then over workers; the sum replaces the value."""
    small, big = keys(0), keys(1)
    kv.init([small, big], [full((3,), 100.0), full(BIG, 100.0)])
    ramp = np.arange(np.prod(BIG), dtype=np.float32).reshape(BIG)
    kv.push(big, [mine(kv, ramp), mine(kv, ramp), mine(kv, 2 * ramp)])  # three devices
    same(kv.pull(big), over_workers(kv, 4 * ramp), "big key after one push")
    for step in (1.0, 2.0):
        kv.push(small, [mine(kv, full((3,), step))] * 2)
        same(kv.pull(small), over_workers(kv, full((3,), 2 * step)), f"small key after push {step:g} (no optimizer)")


@contract("keys")
def key_and_value_lists(kv: KVStoreBase, keys: Keys) -> None:
    """Key lists: one value (or a list of per-device values) per key; outs per key; results per key."""
    ks = [keys(0), keys(1), keys(2)]
    kv.init(ks, [full((2,), 1.0), full((3,), 2.0), full(BIG, 3.0)])
    pulled = kv.pull(ks)
    assert isinstance(pulled, list) and len(pulled) == 3, f"pull of a key list returned {type(pulled).__name__}"
    for got, initial in zip(pulled, [full((2,), 1.0), full((3,), 2.0), full(BIG, 3.0)]):
        same(got, initial, "pull of a key list")
    if kv.store_type.sync:
        x = mine(kv, full((2,), 1.0))
        kv.push(ks, [[x, x], mine(kv, full((3,), 1.0)), [mine(kv, full(BIG, 1.0))] * 3])
        kv.push([ks[1], ks[1]], [mine(kv, full((3,), 1.0))] * 2)  # a key listed twice: summed
        want = [over_workers(kv, full((2,), 2.0)), over_workers(kv, full((3,), 2.0)), over_workers(kv, full(BIG, 3.0))]
    else:
        want = [full((2,), 1.0), full((3,), 2.0), full(BIG, 3.0)]
    outs: list[Any] = [[full((2,), -1.0), full((2,), -1.0)], full((3,), -1.0), [full(BIG, -1.0)]]
    kv.pull(ks, out=outs)
    same(outs[0][0], want[0], "first out of key 0")
    same(outs[0][1], want[0], "second out of key 0")
    same(outs[1], want[1], "out of key 1")
    same(outs[2][0], want[2], "out of key 2 (big)")


# -- contracts: pushpull, broadcast -------------------------------------------------------------------
@contract("sync")
def pushpull_in_place(kv: KVStoreBase, keys: Keys) -> None:
    """``pushpull(k, values)`` writes the sum over devices and workers back into every value."""
    k, big = keys(0), keys(1)
    create_keys(kv, [k, big], [full((4,), 0.0), full(BIG, 0.0)])
    values = [mine(kv, full((4,), 1.0)), mine(kv, full((4,), 2.0))]
    kv.pushpull(k, values)
    for v in values:
        same(v, over_workers(kv, full((4,), 3.0)), "value after pushpull in place")
    value = mine(kv, full(BIG, 5.0))
    kv.pushpull(big, value)
    same(value, over_workers(kv, full(BIG, 5.0)), "big value after pushpull in place")


@contract("sync")
def pushpull_into_out(kv: KVStoreBase, keys: Keys) -> None:
    """``pushpull(k, value, out)`` fills every out and leaves the value alone; key lists too."""
    k0, k1 = keys(0), keys(1)
    create_keys(kv, [k0, k1], [full((3,), 0.0), full(BIG, 0.0)])
    value = mine(kv, full((3,), 1.0))
    outs = [full((3,), -1.0), full((3,), -1.0)]
    kv.pushpull(k0, value, out=outs)
    same(value, mine(kv, full((3,), 1.0)), "value after pushpull into out (unchanged)")
    for o in outs:
        same(o, over_workers(kv, full((3,), 1.0)), "out after pushpull")
    out0, out1 = full((3,), -1.0), full(BIG, -1.0)
    kv.pushpull([k0, k1], [mine(kv, full((3,), 2.0)), mine(kv, full(BIG, 3.0))], out=[out0, out1])
    same(out0, over_workers(kv, full((3,), 2.0)), "out of key 0 after list pushpull")
    same(out1, over_workers(kv, full(BIG, 3.0)), "out of key 1 after list pushpull")
    first, second = full((3,), -1.0), full((3,), -1.0)  # a key listed twice: its values summed, both outs filled
    kv.pushpull([k0, k0], [mine(kv, full((3,), 1.0))] * 2, out=[first, second])
    same(first, over_workers(kv, full((3,), 2.0)), "first out of a key listed twice")
    same(second, over_workers(kv, full((3,), 2.0)), "second out of a key listed twice")


@contract()
def broadcast_new_key(kv: KVStoreBase, keys: Keys) -> None:
    """Broadcast creates keys with rank 0's value and fills every out; key lists too."""
    out = full((2, 2), -1.0)
    kv.broadcast(keys(0), full((2, 2), 1.0 + kv.rank), out=out)
    same(out, full((2, 2), 1.0), "out of a broadcast to a new key")
    outs: list[Any] = [full((3,), -1.0), [full(BIG, -1.0), full(BIG, -1.0)]]
    kv.broadcast([keys(1), keys(2)], [full((3,), 4.0 + kv.rank), full(BIG, 5.0 + kv.rank)], out=outs)
    same(outs[0], full((3,), 4.0), "out of key 1 of a list broadcast")
    same(outs[1][0], full(BIG, 5.0), "first out of key 2 of a list broadcast")
    same(outs[1][1], full(BIG, 5.0), "second out of key 2 of a list broadcast")
    if not kv.store_type.summation_only:
        same(kv.pull(keys(0)), full((2, 2), 1.0), "pull after broadcast")


@contract()
def broadcast_existing_key(kv: KVStoreBase, keys: Keys) -> None:
    """Broadcast to an existing key (made by broadcast, or by init) overwrites it, any number of times."""
    k, inited = keys(0), keys(1)
    out = full((3,), -1.0)
    for value in (1.0, 7.0, 8.0):
        kv.broadcast(k, full((3,), value + kv.rank), out=out)
        same(out, full((3,), value), f"out of broadcast number {value:g}")
    if kv.store_type.summation_only:
        return
    kv.init(inited, full(BIG, 0.0))
    outs = [full(BIG, -1.0), full(BIG, -1.0)]
    kv.broadcast(inited, full(BIG, 9.0 + kv.rank), out=outs)
    for o in outs:
        same(o, full(BIG, 9.0), "out of a broadcast to an initialised key")
    same(kv.pull(inited), full(BIG, 9.0), "pull after broadcast to an initialised key")


@contract("keys")
def row_sparse_pull_rows(kv: KVStoreBase, keys: Keys) -> None:
    """Chosen rows (de-duplicated, any order) into full-shaped outs (other rows zero) or compact ones."""
    k = keys(0)
    value = np.arange(np.prod(BIG), dtype=np.float32).reshape(BIG)
    kv.init(k, value + 1000 * kv.rank)  # rank 0's value
    rows = [11, 0, 5, 5]
    dense = full(BIG, 99.0)
    kv.row_sparse_pull(k, out=dense, row_ids=rows)
    want = np.zeros_like(value)
    want[[0, 5, 11]] = value[[0, 5, 11]]
    same(dense, want, "full-shaped out of row_sparse_pull")
    compact = full((3, BIG[1]), 99.0)
    kv.row_sparse_pull(k, out=compact, row_ids=np.array(rows))
    same(compact, value[[0, 5, 11]], "compact out of row_sparse_pull")
    outs = [full(BIG, 99.0), full(BIG, 99.0)]
    kv.row_sparse_pull(k, out=outs, row_ids=[[1], [2, 3]])
    same(outs[1][2:4], value[2:4], "second out with its own row ids")
    same(outs[1][1], np.zeros(BIG[1], np.float32), "a row the second out did not ask for")
    same(kv.row_sparse_pull(k, row_ids=[4]), np.where(np.arange(BIG[0])[:, None] == 4, value, 0),
         "row_sparse_pull without out")
    raises(InvalidArgumentError, lambda: kv.row_sparse_pull(k, out=dense, row_ids=[BIG[0]]), "a row out of range")


# -- contracts: non-blocking calls ----------------------------------------------------------------------
@contract("keys")
def non_blocking_pull(kv: KVStoreBase, keys: Keys) -> None:
    """``pull(block=False)`` returns a handle whose ``wait()`` gives the value; ``kv.wait()`` waits for all."""
    k = keys(0)
    kv.init(k, full((5,), 3.0))
    handle = kv.pull(k, block=False)
    same(handle.wait(TIMEOUT), full((5,), 3.0), "result of a non-blocking pull")
    assert handle.done()
    out = full((5,), -1.0)
    handle = kv.pull(k, out=out, block=False)
    kv.wait(timeout=TIMEOUT)
    assert handle.done()
    same(out, full((5,), 3.0), "out of a non-blocking pull after wait()")


@contract("keys", "sync")
def non_blocking_push(kv: KVStoreBase, keys: Keys) -> None:
    """Non-blocking pushes (any priorities) are in every later pull; ``wait()`` completes their handles."""
    ks = [keys(i) for i in range(4)]
    kv.init(ks, [full((2,), 0.0)] * 4)
    handles = [kv.push(k, mine(kv, full((2,), 1.0 + i)), priority=-i, block=False) for i, k in enumerate(ks)]
    pulled = kv.pull(ks, block=False).wait(TIMEOUT)  # per-key order: sees the pushes
    for i, p in enumerate(pulled):
        same(p, over_workers(kv, full((2,), 1.0 + i)), f"pull of key {i} behind a non-blocking push")
    kv.wait(timeout=TIMEOUT)
    assert all(h.done() and h.exception() is None for h in handles)


@contract("sync")
def non_blocking_pushpull(kv: KVStoreBase, keys: Keys) -> None:
    """``pushpull(block=False)`` returns a handle; after ``wait`` the out holds the sum."""
    k = keys(0)
    create_keys(kv, [k], [full((3,), 0.0)])
    out = full((3,), -1.0)
    kv.pushpull(k, mine(kv, full((3,), 2.0)), out=out, block=False).wait(TIMEOUT)
    same(out, over_workers(kv, full((3,), 2.0)), "out of a non-blocking pushpull")
    value = mine(kv, full((3,), 1.0))
    handle = kv.pushpull(k, value, block=False)
    kv.wait(timeout=TIMEOUT)
    assert handle.done()
    same(value, over_workers(kv, full((3,), 1.0)), "value of a non-blocking pushpull after wait()")


# -- contracts: errors ------------------------------------------------------------------------------
@contract("keys")
def unknown_key(kv: KVStoreBase, keys: Keys) -> None:
    """push / pull / pushpull / row_sparse_pull of a key never initialised: UnknownKeyError (a KeyError)."""
    kv.init(keys(0), full((2, 2), 0.0))
    k = keys(1)
    x = full((2, 2), 1.0)
    exc = raises(UnknownKeyError, lambda: kv.push(k, x), "push of an unknown key")
    assert isinstance(exc, KeyError)
    raises(UnknownKeyError, lambda: kv.pull(k), "pull of an unknown key")
    raises(UnknownKeyError, lambda: kv.pull([keys(0), k], out=[x, x.copy()]), "pull of a list with an unknown key")
    raises(UnknownKeyError, lambda: kv.pushpull(k, x), "pushpull of an unknown key")
    raises(UnknownKeyError, lambda: kv.row_sparse_pull(k, out=x, row_ids=[0]), "row_sparse_pull of an unknown key")
    same(kv.pull(keys(0)), full((2, 2), 0.0), "a known key after the failed calls")


def _mismatch(kv: KVStoreBase, keys: Keys, error: type[BaseException], bad: np.ndarray[Any, Any]) -> None:
    k = keys(0)
    kv.init(k, full((2, 3), 5.0))
    good = mine(kv, full((2, 3), 1.0))
    raises(error, lambda: kv.push(k, bad), "push of a wrong value")
    raises(error, lambda: kv.push(k, [good, bad]), "push of a device list with one wrong value")
    raises(error, lambda: kv.pull(k, out=bad), "pull into a wrong out")
    raises(error, lambda: kv.pull(k, out=[full((2, 3), 0.0), bad]), "pull into a list with one wrong out")
    raises(error, lambda: kv.pushpull(k, bad), "pushpull of a wrong value")
    raises(error, lambda: kv.pushpull(k, good, out=bad), "pushpull into a wrong out")
    raises(error, lambda: kv.broadcast(k, bad), "broadcast of a wrong value to an existing key")
    same(kv.pull(k), full((2, 3), 5.0), "the value after the refused calls (unchanged)")
    if kv.store_type.sync:
        kv.push(k, good)
        same(kv.pull(k), over_workers(kv, full((2, 3), 1.0)), "a push after the refused calls")


@contract("keys")
def shape_mismatch(kv: KVStoreBase, keys: Keys) -> None:
    """A value or out of another shape: ShapeMismatchError (a ValueError), the store unchanged."""
    _mismatch(kv, keys, ShapeMismatchError, full((3, 2), 1.0))


@contract("keys")
def dtype_mismatch(kv: KVStoreBase, keys: Keys) -> None:
    """A value or out of an integer dtype for a float key: DTypeMismatchError (a ValueError), the store unchanged.

    (An out of another floating dtype is cast into by the single-process stores: tests/unit/test_sparse.py.)
    """
    _mismatch(kv, keys, DTypeMismatchError, full((2, 3), 1.0, "int32"))


@contract("keys")
def duplicate_init(kv: KVStoreBase, keys: Keys) -> None:
    """A second init of a key, or a key listed twice: DuplicateKeyError, nothing created or changed."""
    k, twice = keys(0), keys(1)
    kv.init(k, full((2,), 1.0))
    exc = raises(DuplicateKeyError, lambda: kv.init(k, full((2,), 2.0)), "second init of a key")
    assert isinstance(exc, KeyError)
    raises(DuplicateKeyError, lambda: kv.init([twice, twice], [full((2,), 3.0)] * 2), "init of a key listed twice")
    raises(DuplicateKeyError, lambda: kv.init([keys(2), k], [full((2,), 3.0)] * 2), "init of a list with an old key")
    same(kv.pull(k), full((2,), 1.0), "the key after the refused init")
    raises(UnknownKeyError, lambda: kv.pull(twice), "a key whose init was refused")
    raises(UnknownKeyError, lambda: kv.pull(keys(2)), "a new key of a list whose init was refused")


@contract()
def key_kind_mixing(kv: KVStoreBase, keys: Keys) -> None:
    """A store holds int keys or str keys: mixing them, or a key of another type, is KeyTypeError."""
    k = keys(0)
    create_keys(kv, [k], [full((2,), 0.0)])
    x = full((2,), 1.0)
    kv.broadcast(k, x, out=x.copy())  # every store has used an int key now
    if kv.store_type.summation_only:
        raises(KeyTypeError, lambda: kv.pushpull("name", x), "pushpull of a str key in an int-key store")
    else:
        raises(KeyTypeError, lambda: kv.init("name", x), "init of a str key in an int-key store")
        raises(KeyTypeError, lambda: kv.pull("name"), "pull of a str key in an int-key store")
    raises(KeyTypeError, lambda: kv.broadcast([k, "name"], [x, x]), "a key list mixing int and str")
    raises(KeyTypeError, lambda: kv.broadcast(1.5, x), "a float key")  # type: ignore[call-overload]  # on purpose
    raises(KeyTypeError, lambda: kv.broadcast(True, x), "a bool key")


@contract(own_store=True)
def closed_store(kv: KVStoreBase, keys: Keys) -> None:
    """After ``close`` (idempotent) every call raises StoreClosedError (a RuntimeError)."""
    k = keys(0)
    x = full((2,), 1.0)
    create_keys(kv, [k], [x])
    kv.close()
    kv.close()
    exc = raises(StoreClosedError, lambda: kv.pushpull(k, x), "pushpull after close")
    assert isinstance(exc, RuntimeError)
    raises(StoreClosedError, lambda: kv.broadcast(k, x), "broadcast after close")
    if not kv.store_type.summation_only:
        raises(StoreClosedError, lambda: kv.init(keys(1), x), "init after close")
        raises(StoreClosedError, lambda: kv.push(k, x), "push after close")
        raises(StoreClosedError, lambda: kv.pull(k), "pull after close")


@contract("summation_only")
def summation_only_refuses_the_rest(kv: KVStoreBase, keys: Keys) -> None:
    """A summation-only store refuses init/push/pull and the optimizer calls with NotSupportedError."""
    k = keys(0)
    x = full((2,), 1.0)
    kv.pushpull(k, x)  # the key exists now
    for name, call in [("init", lambda: kv.init(keys(1), x)), ("push", lambda: kv.push(k, x)),
                       ("pull", lambda: kv.pull(k)), ("set_optimizer", lambda: kv.set_optimizer(SGD())),
                       ("set_updater", lambda: kv.set_updater(lambda *a: None)),
                       ("save_optimizer_states", lambda: kv.save_optimizer_states("never-written")),
                       ("load_optimizer_states", lambda: kv.load_optimizer_states("never-read"))]:
        exc = raises(NotSupportedError, call, name)
        assert isinstance(exc, NotImplementedError)


@contract("summation_only")
def summation_only_refuses_row_sparse_pull(kv: KVStoreBase, keys: Keys) -> None:
    """``is_capable('row_sparse_pull')`` is False, so ``row_sparse_pull`` raises NotSupportedError."""
    k = keys(0)
    kv.pushpull(k, full((3, 2), 1.0))
    assert not kv.is_capable("row_sparse_pull")
    raises(NotSupportedError, lambda: kv.row_sparse_pull(k, out=full((3, 2), 0.0), row_ids=[0]), "row_sparse_pull")


# -- contracts: optimizer -----------------------------------------------------------------------------
def _settle(kv: KVStoreBase) -> None:
    """Every worker's pushes are applied (async stores apply them as they arrive)."""
    kv.wait(timeout=TIMEOUT)
    kv.barrier()


@contract("optimizer", own_store=True)
def sgd_optimizer(kv: KVStoreBase, keys: Keys) -> None:
    """With ``set_optimizer(SGD(lr))`` a push of gradients ``g`` makes the value ``w - lr * sum(g)``."""
    w, big = keys(0), keys(1)
    kv.set_optimizer(SGD(learning_rate=0.5))
    kv.init([w, big], [full((4,), 3.0 + kv.rank), full(BIG, 1.0)])
    kv.push(w, [mine(kv, full((4,), 1.0))] * 2)
    kv.push(big, mine(kv, full(BIG, 2.0)))
    _settle(kv)
    w1 = full((4,), 3.0) - 0.5 * over_workers(kv, full((4,), 2.0))
    same(kv.pull(w), w1, "weight after one SGD step")
    same(kv.pull(big), full(BIG, 1.0) - 0.5 * over_workers(kv, full(BIG, 2.0)), "big weight after one SGD step")
    if kv.store_type.sync:
        out = full((4,), 0.0)
        kv.pushpull(w, mine(kv, full((4,), 1.0)), out=out)
        same(out, w1 - 0.5 * over_workers(kv, full((4,), 1.0)), "pushpull out after a second SGD step")


@contract("optimizer", own_store=True)
def summed_keys_ignore_the_optimizer(kv: KVStoreBase, keys: Keys) -> None:
    """``init(..., summed=True)`` keys store the plain sum of a round even with an optimizer.

    (``dist_async`` has no rounds: there a summed key adds each push to its value.)
    """
    w, counter = keys(0), keys(1)
    kv.set_optimizer(SGD(learning_rate=0.5))
    kv.init(w, full((3,), 1.0))
    kv.init(counter, full((3,), 5.0), summed=True)
    kv.push([w, counter], [mine(kv, full((3,), 2.0)), [mine(kv, full((3,), 1.0))] * 2])
    _settle(kv)
    start = 0.0 if kv.store_type.sync else 5.0
    same(kv.pull(counter), start + over_workers(kv, full((3,), 2.0)), "summed key after a push")
    same(kv.pull(w), full((3,), 1.0) - 0.5 * over_workers(kv, full((3,), 2.0)), "weight next to a summed key")
    kv.barrier()  # every worker has read before anyone pushes again (async applies a push on arrival)
    kv.push(counter, mine(kv, full((3,), 4.0)))
    _settle(kv)
    if kv.store_type.sync:
        same(kv.pull(counter), over_workers(kv, full((3,), 4.0)), "summed key after a second push")
    else:
        same(kv.pull(counter), 5.0 + over_workers(kv, full((3,), 6.0)), "summed key after a second push")


@contract("async", own_store=True)
def async_push_needs_an_optimizer(kv: KVStoreBase, keys: Keys) -> None:
    """An async store applies pushes through an optimizer: without one a push is refused."""
    k = keys(0)
    kv.init(k, full((2,), 1.0))
    raises(RemoteError, lambda: kv.push(k, full((2,), 1.0)), "push to an async store without an optimizer")
    kv.barrier()
    same(kv.pull(k), full((2,), 1.0), "the value after the refused push")
