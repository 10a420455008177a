"""``broadcast(..., root_rank=r)`` on every store that can: the value of rank ``r`` is what every worker gets.

The ``horovod`` store's own root ranks are tested in ``test_horovod.py`` (2 ranks under
torchrun); here the single-process stores (rank 0 only) and the servers' stores,
``dist_sync`` and ``byteps``, with 3 workers of an in-process cluster.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import pskv
from pskv.testing import InProcessCluster

DEADLINE = 30.0


def on_workers(name, fn, workers=3):
    """``fn(kv)`` on every worker of an in-process cluster; each result or the pskv error it raised."""
    with InProcessCluster(1, workers, deadline=DEADLINE) as cluster:
        def body(cfg):
            kv = pskv.create(name, cluster=cfg)
            try:
                return fn(kv)
            except pskv.KVStoreError as exc:
                return exc
            finally:
                kv.set_barrier_before_exit(False)
                kv.close()
        return cluster.run_workers(body)


@pytest.mark.parametrize("name", ["dist_sync", "byteps"])
def test_every_worker_gets_the_root_ranks_value_new_and_existing_keys(name):
    def fn(kv):
        r = kv.rank
        got = []
        for root in (2, 1, 0):  # the first broadcast creates the keys (from rank 2's values)
            outs = [np.zeros(3, np.float32), np.zeros((2, 2), np.int64)]
            kv.broadcast(["w", "b"], [np.full(3, 10.0 * r + root, np.float32), np.full((2, 2), r, np.int64)],
                         out=outs, root_rank=root)
            got.append((outs[0].tolist(), outs[1].tolist()))
        if name == "dist_sync":  # the store holds the root's value: a pull after the broadcast reads it
            got.append(kv.pull("w").tolist())
        return got

    for rank, got in enumerate(on_workers(name, fn)):
        assert not isinstance(got, Exception), (rank, got)
        for (w, b), root in zip(got, (2, 1, 0)):
            assert w == [10.0 * root + root] * 3 and b == [[root] * 2] * 2, (rank, root, w, b)
        if name == "dist_sync":
            assert got[-1] == [0.0] * 3


def test_workers_that_name_different_roots_all_fail():
    def fn(kv):
        kv.broadcast("k", np.zeros(2, np.float32))
        kv.broadcast("k", np.full(2, kv.rank, np.float32), root_rank=kv.rank)  # each names itself
        return "returned"

    results = on_workers("dist_sync", fn, workers=2)
    assert all(isinstance(r, pskv.InitMismatchError) and "root_rank" in str(r) for r in results), results


def test_a_root_rank_that_is_no_worker_is_refused_naming_it():
    results = on_workers("dist_sync", lambda kv: kv.broadcast("k", np.zeros(2), root_rank=2), workers=2)
    assert all(isinstance(r, pskv.InvalidArgumentError) and "root_rank 2" in str(r) for r in results), results


@pytest.mark.parametrize("name", ["dist_sync", "byteps"])
def test_one_workers_refused_root_rank_fails_the_others_at_once(name):
    def fn(kv):
        kv.broadcast("k", np.zeros(2, np.float32))
        began = time.monotonic()
        try:
            kv.broadcast("k", np.ones(2, np.float32), root_rank=5 if kv.rank == 1 else 0)
        except pskv.KVStoreError as exc:
            return exc, time.monotonic() - began
        return None, 0.0

    (first, t0), (second, t1) = on_workers(name, fn, workers=2)
    assert isinstance(second, pskv.InvalidArgumentError) and "root_rank 5" in str(second), second
    assert isinstance(first, pskv.CollectiveFailedError) and first.node == "worker 1", first
    assert max(t0, t1) < 10, (t0, t1)


@pytest.mark.parametrize("name", ["local", "device"])
def test_a_single_process_store_has_rank_0_only(name):
    kv = pskv.create(name)
    out = np.zeros(2, np.float32)
    kv.broadcast("k", np.ones(2, np.float32), out=out, root_rank=0)
    assert out.tolist() == [1.0, 1.0]
    with pytest.raises(pskv.InvalidArgumentError, match=r"root_rank 1 is not a worker .* \(ranks 0..0\)"):
        kv.broadcast("k", np.ones(2, np.float32), root_rank=1)
    with pytest.raises(pskv.InvalidArgumentError, match="root_rank must be an int"):
        kv.broadcast("k", np.ones(2, np.float32), root_rank="0")
    kv.close()


def test_the_horovod_store_of_one_process():
    pytest.importorskip("torch")
    with pskv.create("horovod") as kv:
        value, out = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
        kv.broadcast("k", value, out=out, root_rank=0)
        assert out.tolist() == [0, 1, 2, 3]
        kv.pushpull("k", value)
        assert value.tolist() == [0, 1, 2, 3]  # a sum over one rank
        with pytest.raises(pskv.InvalidArgumentError, match="root_rank 1"):
            kv.broadcast("k", value, root_rank=1)
        assert not any(kv.is_capable(c) for c in ("optimizer", "row_sparse_pull", "gradient_compression"))
        for call in (lambda: kv.push("k", value), lambda: kv.pull("k"), lambda: kv.init("k", value),
                     lambda: kv.set_gradient_compression({"type": "2bit"})):
            with pytest.raises(pskv.NotSupportedError, match="offers pushpull and broadcast"):
                call()
    with pytest.raises(pskv.StoreClosedError, match="cannot pushpull: the store is closed"):  # as every store says
        kv.pushpull("k", value)


def test_the_nccl_store_without_cuda_says_so():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is present: the nccl store's refusal does not apply")
    with pytest.raises(pskv.NotSupportedError, match="'nccl' store needs CUDA"):
        pskv.create("nccl")
