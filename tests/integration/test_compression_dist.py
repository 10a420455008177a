"""Gradient compression on the distributed stores: compressed bytes on the wire, MXNet's values.

As in MXNet's ``dist_sync`` store, each worker first sums its devices' values, then
compresses that with its own residual per key; the servers decode each push and sum
over workers; pulls are full precision.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import pskv
from pskv.compression import create
from pskv.testing import InProcessCluster
from pskv.worker.client import WorkerClient

DEADLINE = 60.0
REPO = Path(__file__).resolve().parents[2]
PIECES = dict(bigarray_bound=1000, part_bytes=64 << 10)  # the big key: over both servers, in pieces
SIZES = {"w": 37, "big": 100_000}


def grads(rank, step, devices):
    rng = np.random.default_rng(1000 * rank + step)
    return {k: [rng.uniform(-0.8, 0.8, n).astype(np.float32) for _ in range(devices)] for k, n in SIZES.items()}


def expected(kind, threshold, workers, devices, steps):
    """Per step, the pulled values: the sum over workers of each worker's (device-summed) gradient,
    compressed with that worker's residual and decoded (pskv.compression, checked against MXNet
    in tests/unit/test_compression.py)."""
    comp = create({"type": kind, "threshold": threshold})
    residual = {(r, k): np.zeros(n, np.float32) for r in range(workers) for k, n in SIZES.items()}
    out = []
    for step in range(steps):
        total = {k: np.zeros(n, np.float32) for k, n in SIZES.items()}
        for r in range(workers):
            for k, vals in grads(r, step, devices).items():
                summed = vals[0].copy()
                for v in vals[1:]:
                    summed += v
                total[k] += comp.decompress(comp.compress(summed, residual[(r, k)]), summed.size)
        out.append(total)
    return out


@pytest.mark.parametrize("shm", [0, 1], ids=["sockets", "shared-memory"])
@pytest.mark.parametrize("kind", ["2bit", "1bit"])
def test_dist_sync_pulls_the_sum_of_what_each_workers_compressed_push_decodes_to(shm, kind):
    steps, devices, threshold = 4, 2, 0.5
    want = expected(kind, threshold, 2, devices, steps)

    def fn(kv):
        kv.set_gradient_compression({"type": kind, "threshold": threshold})
        kv.init(list(SIZES), [np.zeros(n, np.float32) for n in SIZES.values()])
        kv.init("count", np.zeros(3, np.float32), summed=True)  # summed: never compressed
        got = []
        for step in range(steps):
            g = grads(kv.rank, step, devices)
            if step % 2:
                kv.push(list(g), list(g.values()))
                got.append(dict(zip(SIZES, kv.pull(list(SIZES)))))
            else:  # pushpull is compressed too
                outs = [np.zeros(n, np.float32) for n in SIZES.values()]
                kv.pushpull(list(g), list(g.values()), out=outs)
                got.append(dict(zip(SIZES, outs)))
            kv.push("count", np.full(3, 0.25, np.float32))
        return got, kv.pull("count").tolist()

    with InProcessCluster(2, 2, deadline=DEADLINE, shm=shm, **PIECES) as cluster:
        results = cluster.run_workers(lambda cfg: _run(cfg, fn))
    for got, count in results:
        assert count == [0.5, 0.5, 0.5]
        for step, (mine, theirs) in enumerate(zip(got, want)):
            for k in SIZES:
                np.testing.assert_allclose(mine[k], theirs[k], rtol=0, atol=1e-6, err_msg=f"{k} step {step}")


def _run(cfg, fn):
    kv = pskv.create("dist_sync", cluster=cfg)
    try:
        return fn(kv)
    finally:
        kv.close()


def test_a_compressed_push_sends_its_payload_not_its_values(monkeypatch):
    """2-bit: a push of 100,000 float32 (400 kB) leaves as 25 kB of payload frames; the servers
    decode it (the same values as above)."""
    sent = []
    request = WorkerClient.request

    def spy(self, server, command, arrays=(), data=None, *args, **kwargs):
        if command.name == "PUSH":
            sent.append(sum(memoryview(d).nbytes for d in data or ()))
        return request(self, server, command, arrays, data, *args, **kwargs)
    monkeypatch.setattr(WorkerClient, "request", spy)

    def fn(kv):
        kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
        kv.init("big", np.zeros(100_000, np.float32))
        kv.push("big", np.ones(100_000, np.float32))
        return float(kv.pull("big")[0])

    with InProcessCluster(2, 1, deadline=DEADLINE, shm=0, **PIECES) as cluster:
        assert cluster.run_workers(lambda cfg: _run(cfg, fn)) == [0.5]
    assert sum(sent) == 100_000 // 4  # 2 bits a value, over both servers


def test_compression_on_a_dist_store_after_init_or_of_another_dtype_is_refused():
    def fn(kv):
        kv.set_gradient_compression({"type": "2bit"})
        kv.init("i", np.zeros(4, np.float64))
        with pytest.raises(pskv.InvalidArgumentError, match="before the first init"):
            kv.set_gradient_compression({"type": "1bit"})
        with pytest.raises(pskv.InvalidArgumentError, match="float32 values only"):
            kv.push("i", np.ones(4))
        return kv.is_capable("gradient_compression")

    with InProcessCluster(1, 1, deadline=DEADLINE, shm=0) as cluster:
        assert cluster.run_workers(lambda cfg: _run(cfg, fn)) == [True]


WORKER = textwrap.dedent("""
    import sys
    import numpy as np
    import pskv
    kv = pskv.create("dist_sync")
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5, "both_ways": sys.argv[1] == "both"})
    kv.init("w", np.zeros(50_000, np.float32))
    for step in range(3):
        kv.push("w", np.full(50_000, 0.3, np.float32))
        out = kv.pull("w")
        print(f"rank={kv.rank} step={step} value={out.min()},{out.max()}", flush=True)
    kv.close()
""")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("direction, values", [("push", (0.0, 1.0, 0.0)), ("both", (0.0, 0.5, 0.5))])
def test_a_launched_job_compresses_between_hosts(direction, values):
    """Through pskv launch, without shared memory: 0.3 per push stays below the threshold once
    (residual 0.3), then 0.6 sends 0.5 (residual 0.1), then 0.4 sends nothing: the sums are
    0, 1, 0. Both ways, each server compresses those sums with its own residual: 0, 0.5 (0.5
    kept), 0.5."""
    argv = [sys.executable, "-m", "pskv", "launch", "-n", "2", "-s", "2", "--stop-grace", "2", "--timeout", "60",
            "--env", "PSKV_SHM=0", "--env", "MXNET_KVSTORE_BIGARRAY_BOUND=1000", "--env", "PSKV_PART_BYTES=65536",
            "--", sys.executable, "-c", WORKER, direction]
    res = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=80,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    for rank in (0, 1):
        for step, value in enumerate(values):
            assert f"rank={rank} step={step} value={value},{value}" in out, out


@pytest.mark.timeout(120)
def test_the_digits_example_trains_with_2bit_compression_to_its_accuracy_bar(tmp_path):
    """The README's main job with ``--compression 2bit`` through pskv launch: the MLP reaches 95 % (the CNN
    trains through the same calls; the README's job, which trains both, is CI's main job)."""
    argv = [sys.executable, "-m", "pskv", "launch", "-n", "2", "-s", "2", "--stop-grace", "2", "--timeout", "100",
            "--", sys.executable, str(REPO / "examples" / "train_digits.py"), "--compression", "2bit",
            "--model", "mlp"]
    res = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=110,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "compression {'type': '2bit', 'threshold': 0.5}" in out and "test accuracy: mlp" in out, out


@pytest.mark.parametrize("shm", [0, 1], ids=["sockets", "shared-memory"])
@pytest.mark.parametrize("kind", ["2bit", "1bit"])
def test_both_ways_the_servers_compress_the_sums_they_send_back_with_their_own_residual(kind, shm, monkeypatch):
    """``both_ways``: each round's sum is compressed once on its server (a residual per part) and every
    worker decodes the same values; a reply then carries payloads, not float32 values — also to a
    worker on the server's host, whose pulls then skip shared memory (or it would see other values)."""
    steps, threshold = 4, 0.5
    comp = create({"type": kind, "threshold": threshold})
    pushed = expected(kind, threshold, 2, 1, steps)  # what the servers sum each step
    server_res = {k: np.zeros(n, np.float32) for k, n in SIZES.items()}
    want = [{k: comp.decompress(comp.compress(step[k].copy(), server_res[k]), SIZES[k]) for k in SIZES}
            for step in pushed]
    replies = []
    from pskv.worker.compressing import PushCompression
    decoder = PushCompression.decoder

    def spy(self, header, node):
        replies.append(bool(header.flags & 16))
        return decoder(self, header, node)
    monkeypatch.setattr(PushCompression, "decoder", spy)

    def fn(kv):
        kv.set_gradient_compression({"type": kind, "threshold": threshold, "both_ways": True})
        kv.init(list(SIZES), [np.zeros(n, np.float32) for n in SIZES.values()])
        got = []
        for step in range(steps):
            g = {k: v[0] for k, v in grads(kv.rank, step, 1).items()}
            if step % 2:
                kv.push(list(g), list(g.values()))
                got.append(dict(zip(SIZES, kv.pull(list(SIZES)))))
            else:
                outs = [np.zeros(n, np.float32) for n in SIZES.values()]
                kv.pushpull(list(g), list(g.values()), out=outs)
                got.append(dict(zip(SIZES, outs)))
        return got

    with InProcessCluster(2, 2, deadline=DEADLINE, shm=shm, **PIECES) as cluster:
        results = cluster.run_workers(lambda cfg: _run(cfg, fn))
    for got in results:
        for step, (mine, theirs) in enumerate(zip(got, want)):
            for k in SIZES:
                np.testing.assert_array_equal(mine[k], theirs[k], err_msg=f"{k} step {step}")
    assert replies and all(replies)  # every value reply came compressed


def test_both_ways_with_an_optimizer_on_the_servers_sends_the_weights_uncompressed():
    """The servers' values are weights then, not sums of gradients: they travel as they are."""
    from pskv.optimizer import SGD

    def fn(kv):
        kv.set_gradient_compression({"type": "2bit", "threshold": 0.5, "both_ways": True})
        kv.set_optimizer(SGD(learning_rate=0.1))
        kv.init("w", np.full(1000, 0.123, np.float32))
        kv.push("w", np.full(1000, 0.7, np.float32))
        return kv.pull("w").tolist()

    with InProcessCluster(1, 2, deadline=DEADLINE, shm=0) as cluster:
        for w in cluster.run_workers(lambda cfg: _run(cfg, fn)):
            np.testing.assert_allclose(w, np.float32(0.123) - np.float32(0.1) * np.float32(1.0), rtol=1e-6)


def test_min_size_leaves_small_keys_uncompressed_on_the_wire():
    def fn(kv):
        kv.set_gradient_compression({"type": "2bit", "threshold": 0.5, "min_size": 1000})
        kv.init(["bias", "weight"], [np.zeros(10, np.float32), np.zeros(5000, np.float32)])
        kv.push(["bias", "weight"], [np.full(10, 0.3, np.float32), np.full(5000, 0.3, np.float32)])
        bias, weight = kv.pull(["bias", "weight"])
        return float(bias[0]), float(weight[0])

    with InProcessCluster(2, 2, deadline=DEADLINE, shm=0) as cluster:
        assert cluster.run_workers(lambda cfg: _run(cfg, fn)) == [(pytest.approx(0.6), 0.0)] * 2
