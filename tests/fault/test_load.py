"""Load and soak: 10,000 keys, many small keys per call, and thousands of iterations with flat memory and fds."""

from __future__ import annotations

import os
import resource
import time

import numpy as np

from pskv.testing import InProcessCluster

DEADLINE = 120.0


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def open_fds() -> dict[str, str]:
    """fd number -> what it points at (``socket:[...]``, a path, ...)."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (listdir's own fd, another thread's)
            pass
    return out


def run(servers: int, workers: int, fn, store: str = "dist_sync"):
    with InProcessCluster(servers, workers, deadline=DEADLINE) as cluster:
        return cluster.run_stores(fn, store)


def test_ten_thousand_keys_in_one_call_and_key_by_key():
    keys = list(range(10_000))

    def fn(kv):
        kv.init(keys, [np.full(3, float(k), np.float32) for k in keys])
        kv.push(keys, [np.full(3, kv.rank + 1.0, np.float32) for _ in keys])
        outs = [np.empty(3, np.float32) for _ in keys]
        kv.pull(keys, out=outs)
        assert all(np.all(o == 3.0) for o in outs)  # 1 + 2 from the two workers
        for k in keys[:200]:  # and one at a time
            kv.push(k, np.full(3, 1.0, np.float32))
            assert np.all(kv.pull(k) == 2.0)
        many = keys[:5_000]  # many small keys in one fused call
        outs = [np.empty(3, np.float32) for _ in many]
        kv.pushpull(many, [np.ones(3, np.float32)] * len(many), out=outs)
        assert all(np.all(o == 2.0) for o in outs)
        return True

    assert run(2, 2, fn) == [True, True]


def test_soak_memory_and_file_descriptors_stay_flat():
    keys = list(range(32))
    iterations, warmup = 2000, 200

    def fn(kv):
        kv.init(keys, [np.zeros(256, np.float32) for _ in keys])
        vals = [np.full(256, 1.0, np.float32) for _ in keys]
        outs = [np.empty(256, np.float32) for _ in keys]
        samples = []
        for i in range(iterations):
            if i % 2:
                kv.push(keys, vals)
                kv.pull(keys, out=outs)
            else:
                kv.pushpull(keys, vals, out=outs)
            assert outs[-1][0] == 2.0
            if i == warmup or i == iterations - 1:
                kv.barrier()  # both workers at the same point: measure the whole process
                # the fewest descriptors of a few looks: a ZeroMQ I/O thread's transient socket
                # (a reconnect attempt, an accept) is not a leak; a leak stays in every look
                looks = []
                for _ in range(5):
                    looks.append(open_fds())
                    time.sleep(0.02)
                samples.append((rss_bytes(), min(looks, key=len)))
        return samples

    results = run(2, 2, fn)
    (rss0, fd0), (rss1, fd1) = results[0]
    new = sorted(target for fd, target in fd1.items() if fd0.get(fd) != target)
    assert len(fd1) <= len(fd0), (f"file descriptors grew from {len(fd0)} to {len(fd1)} over {iterations} "
                                  f"iterations; new: {new}")
    growth = rss1 - rss0
    assert growth < 16 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB over {iterations - warmup} iterations"
