"""Every store keeps MXNet's KVStore semantics: the contracts of ``pskv.testing.contracts``.

Each test id names the store and the contract (``dist_sync-2s2w-push_then_pull_gives_sum``).
Distributed stores run in-process (scheduler, servers, workers as threads), and over the
loopback (one worker, servers called directly: no sockets, no scheduler); the checks
that leave a store as they found it share one cluster per store for this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib.util import find_spec

import pytest

from pskv.testing.contracts import CONTRACTS, Contract, contracts_for, run_contract
from pskv.testing.store_model import run_store_machine
from pskv.testing.stores import StorePool, StoreSpec, cluster_store, local_store, loopback_spec

# bigarray_bound 32: the contracts' 12x8 arrays are split over both servers.
SPECS = [
    local_store("local", engine_threads=2),
    local_store("device", engine_threads=2),
    cluster_store("dist_sync", 1, 2),
    cluster_store("dist_sync", 2, 2, bigarray_bound=32),
    cluster_store("dist_async", 1, 2),
    loopback_spec("dist_sync", 2, bigarray_bound=32),  # no sockets: servers in this process
    loopback_spec("dist_async", 1),
    *([local_store("horovod")] if find_spec("torch") else []),  # a group of one process (torch.distributed, Gloo)
    cluster_store("byteps", 2, 2, bigarray_bound=32),
]

# (store id, contract name) -> why it fails today. Each one is a finding to fix in the store.
KNOWN_FAILURES: dict[tuple[str, str], str] = {}


def _cases() -> list[object]:
    cases = []
    for spec in SPECS:
        for c in contracts_for(spec.store_type):
            reason = KNOWN_FAILURES.get((spec.id, c.name))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            cases.append(pytest.param(spec, c, id=f"{spec.id}-{c.name}", marks=marks))
    return cases


@pytest.fixture(scope="module")
def pool() -> Iterator[StorePool]:
    """One open store group per spec, shared by the tests of this module."""
    shared = StorePool()
    yield shared
    shared.close()


@pytest.mark.parametrize(("spec", "contract"), _cases())
def test_contract(spec: StoreSpec, contract: Contract, pool: StorePool) -> None:
    run_contract(spec, contract, pool)


def test_every_contract_is_checked_on_some_store() -> None:
    checked = {c.name for spec in SPECS for c in contracts_for(spec.store_type)}
    assert checked == {c.name for c in CONTRACTS}


def test_byteps_promises_only_pushpull_and_broadcast() -> None:
    byteps = {c.name for c in contracts_for(SPECS[-1].store_type)}
    assert byteps == {"store_properties", "pushpull_in_place", "pushpull_into_out", "broadcast_new_key",
                      "broadcast_existing_key", "non_blocking_pushpull", "key_kind_mixing", "closed_store",
                      "summation_only_refuses_the_rest", "summation_only_refuses_row_sparse_pull"}


@pytest.mark.parametrize("spec", [
    local_store("local", engine_threads=2),
    local_store("device", engine_threads=2),
    cluster_store("dist_sync", 2, 2, bigarray_bound=4),  # (2, 2) and (3, 2) values are split
    loopback_spec("dist_sync", 2, bigarray_bound=4),
], ids=lambda spec: spec.id)
def test_random_operations_match_a_dict_model(spec: StoreSpec) -> None:
    run_store_machine(spec, max_examples=25 if not spec.store_type.distributed else 12, steps=20)
