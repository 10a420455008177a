"""StoreType: every built-in name parsed once, aliases resolved, no substring tests."""

from __future__ import annotations

import numpy as np
import pytest

import pskv
from pskv.errors import InvalidArgumentError
from pskv.kvstore import DIST_TYPES, KVStoreBase, StoreType, known_types
from pskv.kvstore.types import BUILTIN_TYPES
from pskv.optimizer import SGD


@pytest.mark.parametrize(("name", "canonical", "distributed", "sync", "on_device", "optimize"), [
    ("local", "local", False, True, False, True),
    ("local_update_cpu", "local", False, True, False, True),
    ("local_allreduce_device", "device", False, True, True, True),
    ("dist", "dist_sync", True, True, False, True),
    ("dist_device_sync", "dist_sync_device", True, True, True, True),
    ("dist_async", "dist_async", True, False, False, True),
    ("dist_async_device", "dist_async_device", True, False, True, True),
    ("byteps", "byteps", True, True, False, False),
])
def test_each_builtin_name_means_what_its_table_row_says(name, canonical, distributed, sync, on_device, optimize):
    t = StoreType.parse(name.upper())
    assert (t.name, t.canonical, t.distributed, t.sync, t.on_device, t.servers_optimize) == (
        name, canonical, distributed, sync, on_device, optimize)


def test_the_type_lists_come_from_one_table():
    assert set(DIST_TYPES) == {n for n in BUILTIN_TYPES if StoreType.parse(n).distributed}
    assert BUILTIN_TYPES <= set(known_types())


def test_an_unknown_name_is_refused_with_the_known_ones():
    with pytest.raises(InvalidArgumentError, match="dist_sync"):
        StoreType.parse("dist_syncc")


def test_a_store_exposes_its_parsed_type():
    with pskv.create("local_allreduce_device") as kv:
        assert kv.store_type == StoreType.parse("local_allreduce_device")
        assert kv.store_type.canonical == "device" and kv.store_type.on_device


def test_a_custom_store_is_one_synchronous_process_without_optimizer():
    class Typesstorecustom(KVStoreBase):
        type = "typesstorecustom"  # type: ignore[assignment]
        rank = 0  # type: ignore[assignment]
        num_workers = 1  # type: ignore[assignment]

        def broadcast(self, *a, **k): ...
        def pushpull(self, *a, **k): ...
        def set_optimizer(self, optimizer): ...
        @classmethod
        def is_capable(cls, capability): return False
        def save_optimizer_states(self, fname, dump_optimizer=False): ...
        def load_optimizer_states(self, fname): ...

    t = Typesstorecustom().store_type
    assert (t.distributed, t.sync, t.servers_optimize) == (False, True, False)


def test_local_summed_keys_store_the_sum_while_others_run_the_optimizer():
    with pskv.create("local") as kv:
        kv.init("w", np.ones(3, np.float32))
        kv.init("count", np.zeros(2, np.float64), summed=True)
        kv.set_optimizer(SGD(learning_rate=0.5))
        kv.push(["w", "count"], [np.ones(3, np.float32), np.array([1.0, 4.0])])
        np.testing.assert_allclose(kv.pull("w"), np.full(3, 0.5, np.float32))
        np.testing.assert_allclose(kv.pull("count"), [1.0, 4.0])
