"""pskv launch --restart-servers with a row-sparse key (issue 13): a server SIGKILLed mid-training
is started again from the newest checkpoint (its range of rows, present rows, optimizer state)
and the workers send it every row push they made since; the job ends with the values of a run
without the crash."""

from __future__ import annotations

import pytest

from tests.fault.launched import finals, run_with_a_replaced_server

WORKER = """
import sys
import numpy as np
import pskv
from pskv.optimizer import SGD

steps, crash_at, rows = 12, int(sys.argv[1]), 5000
kv = pskv.create("dist_sync")
kv.set_optimizer(SGD(learning_rate=0.1, momentum=0.9))
kv.init("emb", pskv.TableInit((rows, 8), "float32", {"type": "normal", "std": 0.1, "seed": 5}))
kv.save_checkpoint(meta={"step": -1})
for step in range(steps):
    ids = np.unique((np.arange(0, rows, 37) * (step + 3) + 11 * kv.rank) % rows)  # both servers' ranges
    got = kv.row_sparse_pull("emb", row_ids=ids)
    kv.push("emb", pskv.RowSparse(got.indices, np.sin(got.data + step), (rows, 8)))
    if step % 5 == 4:
        kv.save_checkpoint(meta={"step": step})
    if step == crash_at and kv.rank == 0:
        print("crashing server 0", flush=True)
        kv.send_command_to_servers(99, "")  # server 0 SIGKILLs itself; its replacement answers
final = kv.row_sparse_pull("emb", row_ids=np.arange(rows))
print(f"final {kv.rank} {float(final.data.astype(np.float64).sum())!r}", flush=True)
kv.close()
"""


@pytest.mark.timeout(300)
def test_a_killed_server_of_a_row_sparse_key_is_replaced_and_training_ends_as_without_the_crash(tmp_path):
    reference, out = run_with_a_replaced_server(tmp_path, WORKER, crash_at=7)
    assert "server 0: restored" in out and "replacement server; push counts" in out, out
    assert out.count("server 0 replaced: sending it") == 2, out  # both workers replay their row pushes
    assert finals(out) == reference, out  # the same floats as without the crash
