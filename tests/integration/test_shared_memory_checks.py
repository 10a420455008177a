"""The shared-memory data path checks what it sums exactly as the socket path does.

A push through shared memory names its parts in the header's specs (key, dtype, size;
protocol 2), and the server checks them with the same ``ServerShard.check`` as a push
whose data travels in the message. Workers that disagree on a key's dtype or size get a
typed error on either path instead of raw bytes mixed into the sum.
"""

from __future__ import annotations

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
