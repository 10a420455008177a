"""A collective push refused on one worker (``kv.refuse_push``; pskv.torch's misfit tensors, the ``byteps``
store's) fails the others' call of that round at once, and leaves nothing behind: the job goes on.

In-process clusters of 2 workers and 1 server (:class:`pskv.testing.InProcessCluster`); the launched
path is tests/torch/test_api.py's job (a name reused with another size).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import pytest

import pskv
from pskv.testing import InProcessCluster

DEADLINE = 60.0


def run(fn: Any, store: str = "dist_sync", request_timeout: float = 20.0) -> list[Any]:
    """``fn(kv)`` on both workers; each one's result, or the exception it raised."""
    with InProcessCluster(1, 2, deadline=DEADLINE) as cluster:
        def body(cfg: Any) -> Any:
            kv = pskv.create(store, cluster=dataclasses.replace(cfg, request_timeout=request_timeout))
            try:
                try:
                    return fn(kv)
                except pskv.KVStoreError as exc:
                    return exc
            finally:
                kv.set_barrier_before_exit(False)  # a failed collective leaves the others elsewhere
                kv.close()
        return list(cluster.run_workers(body))


class Misfit(pskv.InvalidArgumentError):
    """The caller's own error (pskv.torch raises ShapeMismatchError / DTypeMismatchError)."""


def _refused_round(kv: Any, key: str, value: Any) -> tuple[str, float]:
    """Rank 1 refuses its push of ``key`` (of ``value``, maybe None), rank 0 pushpulls 4 ones: (its error's class, seconds)."""
    began = time.monotonic()
    try:
        if kv.rank == 1:
            kv.refuse_push(key, Misfit("rank 1's tensor does not fit"), value)
        else:
            kv.pushpull(key, np.ones(4, np.float32))
    except pskv.KVStoreError as exc:
        return type(exc).__name__, time.monotonic() - began
    return "no error", time.monotonic() - began


@pytest.mark.parametrize("value", [np.ones(5, np.float32), np.ones(4, np.int64), None, np.ones(4, np.float32)],
                         ids=["size", "dtype", "none", "fitting"])
def test_refuse_push_fails_the_others_call_of_that_round_at_once_and_raises_the_callers_error(value: Any) -> None:
    def fn(kv: Any) -> Any:
        kv.init("k", np.zeros(4, np.float32))
        kv.pushpull("k", np.ones(4, np.float32))
        return _refused_round(kv, "k", value)

    (e0, s0), (e1, s1) = run(fn)
    assert (e0, e1) == ("RemoteError", "Misfit")
    assert s0 < 5 and s1 < 5


@pytest.mark.parametrize("store", ["dist_sync", "byteps"])
def test_after_a_refused_round_every_collective_goes_on_with_the_same_values(store: str) -> None:
    def fn(kv: Any) -> Any:
        values = {k: np.full(4, float(kv.rank + 1), np.float32) for k in ("k", "other")}
        if store == "dist_sync":
            kv.init(list(values), [np.zeros(4, np.float32)] * 2)
        for k, v in values.items():
            kv.pushpull(k, v)  # (byteps: declared by the first use)
        error, _ = _refused_round(kv, "k", np.ones(5, np.float32))
        kv.barrier()  # the meeting the uneven rounds failed ("mismatched step counts")
        after = {k: np.full(4, float(kv.rank + 1), np.float32) for k in ("other", "k", "k")}
        summed = []
        for k, v in after.items():
            kv.pushpull(k, v)
            summed.append(v.tolist())
        kv.barrier()
        return error, summed

    results = run(fn, store)
    for rank, result in enumerate(results):
        assert not isinstance(result, Exception), f"rank {rank}: {type(result).__name__}: {result}"
    assert [r[0] for r in results] == ["RemoteError", "Misfit"]
    assert all(r[1] == [[3.0] * 4] * 2 for r in results), results


def test_a_store_without_collective_rounds_does_not_offer_refuse_push() -> None:
    with pskv.create("local") as kv:
        kv.init(3, np.zeros(2, np.float32))
        with pytest.raises(pskv.NotSupportedError, match="refuse_push"):
            kv.refuse_push(3, Misfit("never raised"), np.ones(3, np.float32))
