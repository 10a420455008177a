"""Type-checked, not run: what a user's code may write against ``pskv.create()``'s result.

``.ci/run`` runs ``mypy pskv tests/typing``; a public signature that loses a keyword or
an alias makes this file fail the check.
"""

from __future__ import annotations

import numpy as np
from typing_extensions import assert_type

import pskv
from pskv.kvstore.keys import Keys, Outs, Values
from pskv.metrics import JobMetrics
from pskv.optimizer import SGD


def train_step(kv: pskv.KVStoreBase, keys: Keys, grads: Values, weights: Outs) -> None:
    handle = kv.push(keys, grads, block=False, timeout=5.0)
    assert_type(handle, pskv.OpHandle)  # the overloads by `block`: a handle...
    assert_type(kv.push(keys, grads), None)  # ...or nothing to wait for
    handle.wait()
    kv.pull(keys, out=weights, priority=-1, block=True)
    kv.pushpull(keys, grads, out=weights, block=False).wait(10)
    assert_type(kv.pull(keys, out=weights, block=False), pskv.OpHandle)
    assert_type(kv.broadcast(keys, grads, out=weights, block=False), pskv.OpHandle)
    kv.wait(keys, timeout=30.0)


def setup() -> None:
    kv = pskv.create("local", engine_threads=2)
    kv.init(["w", "b"], [np.zeros(3, np.float32), np.zeros(1, np.float32)])
    kv.init("count", np.zeros(2), summed=True)
    kv.set_optimizer(SGD(learning_rate=0.1))
    kv.broadcast("w", np.ones(3, np.float32), out=np.empty(3, np.float32))
    rows = kv.row_sparse_pull("w", row_ids=[0], block=False)
    assert kv.store_type.sync and not kv.store_type.distributed and rows is not None
    train_step(kv, ["w", "b"], [np.ones(3, np.float32), np.ones(1, np.float32)],
               [np.empty(3, np.float32), np.empty(1, np.float32)])
    kv.close()


def observe(kv: pskv.KVStoreBase) -> None:
    """An optional capability typed on every store: ``metrics`` (NotSupportedError where no scheduler)."""
    try:
        job = kv.metrics(timeout=5.0)
    except pskv.NotSupportedError:
        return
    assert_type(job, JobMetrics)
    assert all(node.state for node in job.nodes)


def store_classes(cluster: pskv.ClusterConfig) -> None:
    """The store classes are importable from the top (the table in pskv/__init__.py)."""
    dist: pskv.KVStoreBase = pskv.DistStore("dist_sync", cluster=cluster)
    summing: pskv.KVStoreBase = pskv.BytePSStore("byteps", cluster=cluster)
    allreduce: pskv.KVStoreBase = pskv.AllreduceStore("horovod")
    assert_type(dist.metrics(), JobMetrics)
    for kv in (dist, summing, allreduce):
        kv.close()
