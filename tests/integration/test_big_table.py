"""A table 4x larger than a worker's memory budget trains correctly (issue 13).

The budget is enforced by the kernel: each worker script sets ``RLIMIT_DATA`` (heap and
every private writable mapping, NumPy's arrays included) to :data:`BUDGET` before it
imports anything, and first checks that an array of the table's size is refused with
``MemoryError``. The table, 4 x BUDGET, is drawn on the two servers (``pskv.TableInit``),
so it never exists on a worker: a worker that held it (``TableInit.todense()``, a dense
``init``, a whole-table ``pull``) would die of ``MemoryError``. Each step every worker pulls
the rows its batch touches, pushes their gradient as a ``RowSparse``, and the servers run
SGD on those rows; the test replays the steps in NumPy on the touched rows only (drawn
with :func:`pskv.arrays.tables.draw_rows`, which gives a row from (seed, row block) alone).
It is also the test of row-sparse training through ``pskv launch -n 2 -s 2`` (rows of both
servers' ranges, the same rows pushed by both workers, untouched rows left as drawn).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import pskv
from pskv.arrays.tables import draw_rows

REPO = Path(__file__).resolve().parents[2]
BUDGET = 256 << 20  # a worker's RLIMIT_DATA
ROWS, DIM = 4 << 20, 64  # float32: 1 GiB, 4 x BUDGET
TABLE = pskv.TableInit((ROWS, DIM), "float32", {"type": "uniform", "low": -0.1, "high": 0.1, "seed": 11})
STEPS, BATCH, LR = 4, 256, 0.5
HOT = [0, 1023, ROWS // 2 - 1, ROWS // 2, ROWS - 1]  # in every batch of both workers: both servers' ranges
UNTOUCHED = 12_345  # a row no batch touches (checked below)
FINAL = sorted([*HOT, UNTOUCHED])  # sorted: a row-sparse pull returns its rows sorted

WORKER = textwrap.dedent(f"""
    import resource
    resource.setrlimit(resource.RLIMIT_DATA, ({BUDGET}, {BUDGET}))  # before any import allocates
    import json
    import numpy as np
    import pskv
    from pskv.optimizer import SGD
    try:
        np.empty({ROWS * DIM * 4}, np.uint8)
    except MemoryError:
        pass
    else:
        raise SystemExit("the memory budget is not enforced: a table-sized array was allocated")
    kv = pskv.create("dist_sync")
    kv.set_optimizer(SGD(learning_rate={LR}))
    kv.init("emb", pskv.TableInit(({ROWS}, {DIM}), "float32", {TABLE.init!r}))
    target = np.linspace(-1, 1, {DIM}, dtype=np.float32)
    for step in range({STEPS}):
        ids = np.concatenate([np.random.default_rng([step, kv.rank]).integers(0, {ROWS}, {BATCH}), {HOT}])
        rows = kv.row_sparse_pull("emb", row_ids=ids)  # the batch's unique rows, from both servers
        kv.push("emb", pskv.RowSparse(rows.indices, rows.data - target, ({ROWS}, {DIM})))  # d/dw |w - t|^2 / 2
    final = kv.row_sparse_pull("emb", row_ids={FINAL})
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    print(f"rank={{kv.rank}} hwm_kib={{status['VmHWM'].split()[0]}} data_kib={{status['VmData'].split()[0]}} "
          f"rows={{final.indices.tolist()}} values=" + json.dumps(final.data.tolist()), flush=True)
    kv.close()
""")


def _batch(step: int, rank: int) -> np.ndarray:
    return np.unique(np.concatenate([np.random.default_rng([step, rank]).integers(0, ROWS, BATCH), HOT]))


def _expected() -> np.ndarray:
    """The FINAL rows after the job's steps, computed on the rows the job touches only."""
    touched = np.unique(np.concatenate([_batch(s, r) for s in range(STEPS) for r in range(2)] + [np.array(FINAL)]))
    rows = {int(i): draw_rows(TABLE.init, "float32", int(i), 1, DIM)[0] for i in touched}
    target = np.linspace(-1, 1, DIM, dtype=np.float32)
    for step in range(STEPS):
        grads: dict[int, np.ndarray] = {}
        for rank in range(2):
            for i in _batch(step, rank).tolist():
                g = rows[i] - target
                grads[i] = grads[i] + g if i in grads else g
        for i, g in grads.items():
            rows[i] = rows[i] - np.float32(LR) * g
    return np.stack([rows[i] for i in FINAL])


@pytest.mark.timeout(120)
def test_a_table_four_times_a_workers_memory_budget_trains_correctly():
    assert TABLE.shape[0] * TABLE.row_width * 4 >= 4 * BUDGET
    argv = [sys.executable, "-m", "pskv", "launch", "-n", "2", "-s", "2", "--stop-grace", "2", "--timeout", "90",
            "--", sys.executable, "-c", WORKER]
    res = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=110,
                         env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    want = _expected()
    for rank in (0, 1):
        line = next(ln for ln in out.splitlines() if f"] rank={rank} " in ln and f"rows={FINAL}" in ln)
        fields = dict(f.split("=", 1) for f in line.split("] ", 1)[1].split(" values=")[0].split(" ")[:3])
        assert int(fields["hwm_kib"]) << 10 < BUDGET and int(fields["data_kib"]) << 10 <= BUDGET, line
        got = np.array(json.loads(line.split("values=", 1)[1]), np.float32)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    drawn = np.stack([draw_rows(TABLE.init, "float32", i, 1, DIM)[0] for i in FINAL])
    hot, cold = [FINAL.index(i) for i in HOT], FINAL.index(UNTOUCHED)
    assert not np.allclose(want[hot], drawn[hot], atol=1e-3)  # the job changed the hot rows
    assert all(UNTOUCHED not in _batch(s, r) for s in range(STEPS) for r in range(2))
    np.testing.assert_array_equal(want[cold], drawn[cold])  # and left the others as the servers drew them
