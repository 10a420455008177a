"""A row-sparse embedding table trained through ``pskv launch -n 2 -s 2`` (issue 13).

The table is drawn on the servers (``pskv.TableInit``); each step every worker pulls the
rows its batch touches (``row_sparse_pull``), computes their gradient and pushes it as a
``RowSparse``; the servers run SGD on the pushed rows. The test replays the same steps
with NumPy and checks the values the workers print.
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

REPO = Path(__file__).resolve().parents[2]
ROWS, DIM, STEPS, LR = 1000, 4, 5, 0.5
TABLE = pskv.TableInit((ROWS, DIM), "float32", {"type": "uniform", "low": -0.1, "high": 0.1, "seed": 3})
TARGET = np.linspace(-1, 1, DIM, dtype=np.float32)
FINAL = [0, 13, 499, 500, 512, 999]

WORKER = textwrap.dedent(f"""
    import json
    import numpy as np
    import pskv
    from pskv.optimizer import SGD
    kv = pskv.create("dist_sync")
    kv.set_optimizer(SGD(learning_rate={LR}))
    kv.init("emb", pskv.TableInit(({ROWS}, {DIM}), "float32", {TABLE.init!r}))
    target = np.linspace(-1, 1, {DIM}, dtype=np.float32)
    for step in range({STEPS}):
        ids = np.unique([(7 * step + 13 * kv.rank + j) % {ROWS} for j in range(0, {ROWS}, 97)])
        rows = kv.row_sparse_pull("emb", row_ids=ids)  # this batch's rows, from both servers
        kv.push("emb", pskv.RowSparse(rows.indices, rows.data - target, ({ROWS}, {DIM})))  # d/dw of |w - t|^2 / 2
    final = kv.row_sparse_pull("emb", row_ids={FINAL})
    print(f"rank={{kv.rank}} rows={{final.indices.tolist()}} values=" + json.dumps(final.data.tolist()), flush=True)
    kv.close()
""")


def _expected() -> np.ndarray:
    table = TABLE.todense()
    for step in range(STEPS):
        grad = np.zeros_like(table)
        for rank in range(2):
            ids = np.unique([(7 * step + 13 * rank + j) % ROWS for j in range(0, ROWS, 97)])
            grad[ids] += table[ids] - TARGET
        table = table - np.float32(LR) * grad
    return table[FINAL]


@pytest.mark.timeout(90)
def test_a_launched_job_trains_an_embedding_table_held_by_the_servers():
    argv = [sys.executable, "-m", "pskv", "launch", "-n", "2", "-s", "2", "--stop-grace", "2", "--timeout", "60",
            "--", sys.executable, "-c", WORKER]
    res = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=80,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    want = _expected()
    for rank in (0, 1):
        line = next(ln for ln in out.splitlines() if f"rank={rank} rows={FINAL}" in ln)
        got = np.array(json.loads(line.split("values=", 1)[1]), np.float32)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(want, TABLE.todense()[FINAL])  # the job changed the rows
