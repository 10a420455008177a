"""Gradient-compression residuals in server checkpoints: each worker's (``worker-<rank>.safetensors``)
and each server's reply residuals (``both_ways``, in its shard file) come back when a job resumes, so
a resumed compressed job ends bitwise equal to an uninterrupted one; residuals that cannot come back
start at zero with a WARNING naming what was dropped and why."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from pskv.checkpoints import read_manifest, worker_file
from pskv.compression.residuals import read_worker_file
from pskv.config import ClusterConfig
from pskv.errors import CheckpointError
from pskv.kvstore.dist import DistStore
from pskv.server.snapshot import read_shard
from pskv.testing import InProcessCluster
from pskv.testing.loopback import LoopbackNetwork
from pskv.worker import KVWorker

DEADLINE = 30.0
N = 3000  # split over both servers (bigarray bound 1000 below)
TWO_BIT = {"type": "2bit", "threshold": 0.5}
BOTH_WAYS = {**TWO_BIT, "both_ways": True}


def grad(step: int, rank: int) -> np.ndarray:
    return (0.3 * np.sin(np.arange(N, dtype=np.float32) * 0.01 * (step + 1) + rank)).astype(np.float32)


def train(kv, params, steps, save_at=()):
    """Compressed pushes and pulls of a key with no optimizer on the servers (so both_ways compresses the
    pulled sums); the workers add up what they pull (the same on every worker; kept in the meta, exactly)."""
    kv.set_gradient_compression(params)
    kv.init("w", np.zeros(N, np.float32))
    acc = np.zeros(N, np.float32) if kv.resumed is None else np.array(kv.resumed["meta"]["acc"], np.float32)
    for step in steps:
        kv.push("w", grad(step, kv.rank))
        acc += kv.pull("w")
        if step in save_at:
            kv.save_checkpoint(meta={"step": step, "acc": acc.tolist()})
    return acc


def run(fn, workers=2, **settings):
    with InProcessCluster(2, workers, deadline=DEADLINE, shm=0, bigarray_bound=1000, **settings) as cluster:
        return cluster.run_stores(fn)


@pytest.mark.parametrize("params", [TWO_BIT, BOTH_WAYS], ids=["2bit", "both_ways"])
def test_a_resumed_compressed_job_ends_bitwise_as_an_uninterrupted_one(tmp_path, params, caplog):
    reference = run(lambda kv: train(kv, params, range(8)))
    assert np.array_equal(reference[0], reference[1])
    root = tmp_path / "ckpts"
    run(lambda kv: train(kv, params, range(5), save_at={4}), checkpoint_dir=str(root))
    ckpt = root / "ckpt-1"
    manifest = read_manifest(ckpt)
    assert manifest["residuals"] == {"files": ["worker-0.safetensors", "worker-1.safetensors"],
                                     "compression": params}
    saved = [read_worker_file(ckpt, r) for r in range(2)]
    assert all(len(s.parts) == 2 and any(np.any(r) for r in s.parts.values()) for s in saved)  # both parts, nonzero
    replies = [r for rank in range(2) for r in read_shard(ckpt, rank).replies]
    assert len(replies) == (2 if params.get("both_ways") else 0)
    assert all(r.round == 5 and np.any(r.residual) for r in replies)

    caplog.set_level(logging.INFO)
    resumed = run(lambda kv: train(kv, params, range(5, 8)), resume_from=str(ckpt))
    for got in resumed:
        assert np.array_equal(got, reference[0])  # bitwise
    assert "compression residuals of 2 part(s) read from" in caplog.text
    assert "start at zero" not in caplog.text


def test_without_the_saved_residuals_the_resumed_job_would_differ(tmp_path):
    """The check above can fail: resumed with its residuals lost, the same job ends elsewhere."""
    reference = run(lambda kv: train(kv, TWO_BIT, range(8)))
    root = tmp_path / "ckpts"
    run(lambda kv: train(kv, TWO_BIT, range(5), save_at={4}), checkpoint_dir=str(root))
    for r in range(2):
        worker_file(root / "ckpt-1", r).unlink()
    manifest = json.loads((root / "ckpt-1" / "manifest.json").read_text())
    del manifest["residuals"]  # as a checkpoint written before residuals were saved
    (root / "ckpt-1" / "manifest.json").write_text(json.dumps(manifest))
    resumed = run(lambda kv: train(kv, TWO_BIT, range(5, 8)), resume_from=str(root / "ckpt-1"))
    assert not np.array_equal(resumed[0], reference[0])


@pytest.mark.parametrize("case", ["params", "workers", "old"])
def test_residuals_that_cannot_be_restored_start_at_zero_with_a_warning_naming_why(tmp_path, caplog, case):
    root = tmp_path / "ckpts"
    run(lambda kv: train(kv, BOTH_WAYS, range(3), save_at={2}), checkpoint_dir=str(root))
    ckpt = root / "ckpt-1"
    params, workers = BOTH_WAYS, 2
    if case == "params":
        params = {"type": "2bit", "threshold": 0.25, "both_ways": True}
    elif case == "workers":
        workers = 1
    else:  # as written before this change: no residuals entry, no reply residuals in the shards
        manifest = json.loads((ckpt / "manifest.json").read_text())
        del manifest["residuals"]
        (ckpt / "manifest.json").write_text(json.dumps(manifest))
        for rank in range(2):
            path = ckpt / f"server-{rank}.safetensors"
            with safe_open(str(path), framework="numpy") as f:
                doc = json.loads(f.metadata()["pskv"])
            tensors = {k: v for k, v in load_file(str(path)).items() if k[0] not in "rq"}
            del doc["replies"]
            save_file(tensors, str(path), metadata={"pskv": json.dumps(doc)})
    caplog.set_level(logging.WARNING)
    run(lambda kv: train(kv, params, range(3, 4)), workers=workers, resume_from=str(ckpt))
    why = {"params": "its residuals were made by compression",
           "workers": "it was written by 2 workers; this job has 1",
           "old": "it holds no worker residuals"}[case]
    assert f"compression residuals start at zero, not restored from checkpoint {ckpt}: {why}" in caplog.text
    if case == "params":  # the servers' reply residuals: kept for threshold 0.5, asked for 0.25
        assert "its residual (compression" in caplog.text and "dropped: the pulls ask for" in caplog.text
    if case == "old":
        assert f"the checkpoint {ckpt} holds no reply residuals" in caplog.text


def test_a_damaged_residuals_file_is_refused_naming_it(tmp_path):
    root = tmp_path / "ckpts"
    run(lambda kv: train(kv, TWO_BIT, range(2), save_at={1}), checkpoint_dir=str(root))
    path = worker_file(root / "ckpt-1", 0)
    with safe_open(str(path), framework="numpy") as f:
        doc = json.loads(f.metadata()["pskv"])
    tensors = load_file(str(path))
    doc["parts"][0]["size"] += 1  # claims more values than its tensor holds
    save_file(tensors, str(path), metadata={"pskv": json.dumps(doc)})
    with pytest.raises(CheckpointError, match=r"worker-0.safetensors: the residual of key \d+ offset 0 is "
                                              r"float32\[\d+\]; its entry claims float32\[\d+\]"):
        read_worker_file(root / "ckpt-1", 0)


def test_a_replacement_worker_says_its_residuals_start_at_zero(caplog):
    """A replacement process (--restart-workers) cannot have its predecessor's residuals: it says so."""
    cluster = ClusterConfig(num_servers=1, num_workers=1, role="worker", root_uri="127.0.0.1", root_port=1, shm=0,
                            heartbeat_interval=0)
    network = LoopbackNetwork(cluster)
    network.client.info = replace(network.client.info, recovery=True)
    kv = DistStore("dist_sync", None, cluster, worker=KVWorker(cluster, sync=True, client=network.client))
    try:
        assert kv.is_recovery
        caplog.set_level(logging.WARNING)
        kv.set_gradient_compression(TWO_BIT)
    finally:
        kv.close()
    assert ("worker 0: a replacement process: the compression residuals of its predecessor died with it; they "
            "start at zero") in caplog.text
