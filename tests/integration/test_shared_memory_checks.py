"""The shared-memory data path checks what it sums exactly as the socket path does.

A push through shared memory names its parts in the header's specs (key, dtype, size;
protocol 2), and the server checks them with the same ``ServerShard.check`` as a push
whose data travels in the message. Workers that disagree on a key's dtype or size get a
typed error on either path instead of raw bytes mixed into the sum.
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import pskv
from pskv.testing import InProcessCluster


@pytest.mark.parametrize("shm", [1, 0], ids=["shared-memory", "sockets"])
def test_a_worker_pushing_another_dtype_is_refused_on_both_paths(shm, monkeypatch):
    # init's agreement would refuse the disagreeing init first (InitMismatchError); the
    # servers' own check is the second line, tested here without the first
    monkeypatch.setattr("pskv.cluster.meetings._disagreement", lambda meetings: None)

    def worker(cfg):
        kv = pskv.create("dist_sync", cluster=cfg)
        try:
            mine = np.ones(8, np.float32) if kv.rank == 0 else np.ones(8, np.int32)  # they disagree
            kv.init("w", mine)  # rank 0's value is the key's: float32
            assert kv._keys["w"].shared is bool(shm)  # the path under test is the one taken
            if kv.rank == 1:
                with pytest.raises(pskv.RemoteError, match="DTypeMismatchError"):
                    kv.push("w", np.ones(8, np.int32))
                return None
            kv.push("w", np.ones(8, np.float32))
            return None
        finally:
            kv.set_barrier_before_exit(False)
            kv.close()

    with InProcessCluster(1, 2, deadline=30, shm=shm) as cluster:
        cluster.run_workers(worker)


def test_closing_a_store_unmaps_its_shared_memory_even_while_the_store_object_lives():
    def mapped() -> int:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
            return sum(1 for line in f if "/dev/shm/" in line and "pskv" in line)

    def worker(cfg):
        kv = pskv.create("dist_sync", cluster=cfg)
        kv.init(list(range(20)), [np.ones(16, np.float32)] * 20)
        assert all(kv._keys[k].shared for k in range(20))
        kv.barrier()
        before = mapped()
        kv.barrier()
        kv.close()
        return kv, before  # the store object stays referenced

    with InProcessCluster(1, 2, deadline=30, shm=1) as cluster:
        results = cluster.run_workers(worker)
        after = mapped()  # both workers closed; the server still holds its own maps
    stores, before = zip(*results)
    assert all(rec.shm == [] for kv in stores for rec in kv._keys.values())
    assert after <= before[0] - 2 * 20 * 3, (before, after)  # each worker's slot and two value maps per key



@pytest.mark.parametrize("left, server_keys, worker_keys", [(4 * 10, 10, 0), (4 * 30 + 3 * 5, 30, 5)],
                         ids=["server-runs-out", "workers-run-out"])
def test_keys_past_the_processes_map_budget_use_sockets_with_the_same_values(left, server_keys, worker_keys,
                                                                              monkeypatch):
    # every shared map counts against the kernel's per-process limit (vm.max_map_count); at it,
    # every mmap of the process fails (a new thread's start too): keys past pskv's budget use sockets.
    # A server's key costs 4 maps here (two values, two slots), a worker's 3 (two values, its slot)
    from pskv.transport import shm

    gc.collect()  # earlier tests' maps unmapped
    monkeypatch.setattr(shm, "MAP_BUDGET", shm.MAP_BUDGET - shm.maps_left() + left)
    keys = list(range(30))
    on_server: set[int] = set()

    def worker(cfg):
        kv = pskv.create("dist_sync", cluster=cfg)
        try:
            kv.init(keys, [np.full(4, float(k), np.float32) for k in keys])
            shared = [k for k in keys if kv._keys[k].shared]
            on_server.update(int(name.split("_")[0]) for name in os.listdir(directory) if name.endswith("_v0"))
            kv.push(keys, [np.full(4, kv.rank + 1.0, np.float32)] * len(keys))
            outs = [np.empty(4, np.float32) for _ in keys]
            kv.pull(keys, out=outs)
            assert all(np.all(o == 3.0) for o in outs)
            return shared
        finally:
            kv.close()

    with InProcessCluster(1, 2, deadline=30, shm=1) as cluster:
        directory = cluster.servers[0]._shm_dir.path
        shared = cluster.run_workers(worker)
    assert on_server == set(range(server_keys))
    assert sum(len(s) for s in shared) == worker_keys
    assert all(k < server_keys for s in shared for k in s)  # a worker shares only keys the server shares
    cluster.servers.clear()
    gc.collect()
    assert shm.maps_left() == left  # every map made was unmapped again
