"""MXNet's own distributed row-sparse checks (``tests/nightly/dist_sync_kvstore.py``: its
``check_row_sparse_keys``, ``check_row_sparse_keys_with_zeros`` and ``check_big_row_sparse_keys``,
float16 and float32, 7 repeats) ported to pskv and run through ``pskv launch`` with 2 workers and 2
servers; the row-sparse keys live on the servers by row ranges (issue 13).

MXNet's keys, shapes and row choices: a (2, 3) key each worker pushes one row of, random
``row_sparse_pull`` row ids given as a 2-D float array (duplicates included), pushes of no rows
that leave the weights as they were and pulls of no rows, and a (1200, 1200) key (split over
the servers) that each worker updates on a subset of 30 % of its rows. Values are compared
exactly. As in ``test_mxnet_dist_compression.py``: MXNet's servers run its ``test`` optimizer,
which adds ``rate * grad``; pskv's run ``SGD(learning_rate=rate)``, which subtracts it, so every
expected step changes sign.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent(r'''
    import numpy as np
    import pskv
    from pskv.optimizer import SGD

    rate, nrepeat = 2.0, 7
    shape, big_shape = (2, 3), (1200, 1200)
    rsp_keys, rsp_big = ["9", "11", "13"], ["97"]
    fp16_rsp_keys, fp16_rsp_big = ["10", "12", "14"], ["98"]

    kv = pskv.create("dist_sync")
    my_rank, nworker = kv.rank, kv.num_workers

    def ones_rsp(s, dtype):  # MXNet: mx.nd.ones(s).tostype('row_sparse'): every row
        return pskv.RowSparse.from_dense(np.ones(s, dtype))

    kv.init(rsp_keys + rsp_big, [ones_rsp(shape, np.float32)] * 3 + [ones_rsp(big_shape, np.float32)])
    kv.init(fp16_rsp_keys + fp16_rsp_big, [ones_rsp(shape, np.float16)] * 3 + [ones_rsp(big_shape, np.float16)])
    kv.set_optimizer(SGD(learning_rate=rate))  # MXNet: its 'test' optimizer, weight += rate * grad

    def check(val, expected, what):
        got = val.todense()
        assert np.array_equal(got, np.broadcast_to(np.asarray(expected, got.dtype), got.shape)), (my_rank, what)

    def check_row_sparse_keys(dtype):
        v = np.zeros(shape, dtype)
        v[my_rank % shape[0]] = my_rank + 1
        k = rsp_keys[0] if dtype == "float32" else fp16_rsp_keys[0]
        for i in range(nrepeat):
            kv.push(k, pskv.RowSparse.from_dense(v))
            row_ids_np = np.random.randint(shape[0], size=shape[0])
            row_ids = row_ids_np.reshape((shape[0] // 2, 2)).astype(dtype)
            val = pskv.RowSparse.zeros(shape, dtype)
            kv.row_sparse_pull(k, out=val, row_ids=row_ids)
            updated = np.ones(shape, dtype)
            for rank in range(nworker):
                updated[rank % shape[0]] -= (rank + 1) * rate * (i + 1)  # MXNet: +=
            expected = np.zeros(shape, dtype)
            expected[row_ids_np] = updated[row_ids_np]
            check(val, expected, ("row_sparse_keys", dtype, i))

    def check_row_sparse_keys_with_zeros(dtype):
        k1, k2 = (rsp_keys[1], rsp_big[0]) if dtype == "float32" else (fp16_rsp_keys[1], fp16_rsp_big[0])
        v, big_v = pskv.RowSparse.zeros(shape, dtype), pskv.RowSparse.zeros(big_shape, dtype)
        for i in range(nrepeat):
            kv.push(k1, v)
            kv.push(k2, big_v)
            val, big_val = pskv.RowSparse.zeros(shape), pskv.RowSparse.zeros(big_shape)
            kv.row_sparse_pull(k1, out=val, row_ids=np.arange(shape[0]).astype(np.float32))
            kv.row_sparse_pull(k2, out=big_val, row_ids=np.arange(big_shape[0]).astype(np.float32))
            check(val, 1, ("zeros", dtype, i))
            check(big_val, 1, ("big zeros", dtype, i))
            kv.row_sparse_pull(k1, out=val, row_ids=np.array([], np.float32))
            kv.row_sparse_pull(k2, out=big_val, row_ids=np.array([], np.float32))
            check(val, 0, ("no rows", dtype, i))
            check(big_val, 0, ("big no rows", dtype, i))

    def check_big_row_sparse_keys(dtype):
        k = rsp_big[0] if dtype == "float32" else fp16_rsp_big[0]
        np.random.seed(123)
        density = 0.3
        v = np.zeros(big_shape, dtype)
        indices = np.argwhere(np.random.rand(big_shape[0]) < density).flatten()
        update_rows = [indices[::(rank + 1) * 2] for rank in range(nworker)]
        v[update_rows[my_rank]] = my_rank + 1
        for i in range(nrepeat):
            kv.push(k, pskv.RowSparse.from_dense(v))
            np.random.seed(my_rank)
            num_rows = big_shape[0]
            row_ids_np = np.random.randint(num_rows, size=num_rows)
            row_ids = row_ids_np.reshape((num_rows // 2, 2)).astype(dtype)
            val = pskv.RowSparse.zeros(big_shape, dtype)
            kv.row_sparse_pull(k, out=val, row_ids=row_ids)
            updated = np.ones(big_shape, dtype)
            for rank in range(nworker):
                updated[update_rows[rank]] -= (rank + 1) * rate * (i + 1)  # MXNet: +=
            expected = np.zeros(big_shape, dtype)
            expected[row_ids_np] = updated[row_ids_np]
            check(val, expected, ("big", dtype, i))

    for dtype in ["float16", "float32"]:
        check_row_sparse_keys(dtype)
        check_row_sparse_keys_with_zeros(dtype)
        check_big_row_sparse_keys(dtype)
    print(f"worker {my_rank} is done with row-sparse tests", flush=True)
    kv.close()
''')


@pytest.mark.timeout(120)
def test_mxnets_dist_sync_row_sparse_checks_pass_through_pskv_launch():
    argv = [sys.executable, "-m", "pskv", "launch", "-n", "2", "-s", "2", "--stop-grace", "2", "--timeout", "100",
            "--", sys.executable, "-c", WORKER]
    res = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=110,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    for rank in (0, 1):
        assert f"worker {rank} is done with row-sparse tests" in out, out
