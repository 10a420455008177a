"""pskv launch --restart-servers: a server SIGKILLed mid-training is started again alone,
loads the newest checkpoint, and the workers send it every push they made since; the
other server and the workers never stop, and the job ends with the values of a run
without the crash."""

from __future__ import annotations

import re

import pytest

from tests.fault.launched import finals, run_with_a_replaced_server

WORKER = """
import os, sys
import numpy as np
import pskv
from pskv.optimizer import SGD

steps, crash_at = 14, int(sys.argv[1])
kv = pskv.create("dist_sync")
kv.set_optimizer(SGD(learning_rate=0.1, momentum=0.9, wd=0.01))
# "w" is split over both servers (bigarray bound 1e6); "b" lives on one of them
kv.init(["w", "b"], [np.linspace(-1, 1, 1_200_000, dtype=np.float32), np.zeros(7)])
kv.save_checkpoint(meta={"step": -1})
for step in range(steps):
    grads = [np.cos(np.arange(1_200_000, dtype=np.float32) * 1e-3 * (step + 1) + kv.rank), np.full(7, step + 1.0)]
    if step % 2:
        kv.push("w", grads[0])  # blocking push then pull
        kv.push("b", grads[1], block=False)  # held, and sent with the pull behind it as one PUSHPULL (replayed so)
        b, w = kv.pull("b"), kv.pull("w")
    else:
        w, b = np.empty(1_200_000, np.float32), np.empty(7)
        kv.pushpull(["w", "b"], grads, out=[w, b])
    if step % 5 == 4:
        kv.save_checkpoint(meta={"step": step})
    if step == crash_at and kv.rank == 0:
        print("crashing server 0", flush=True)
        kv.send_command_to_servers(99, "")  # server 0 SIGKILLs itself; its replacement answers
print(f"final {kv.rank} {float(w.astype(np.float64).sum())!r} {float(b.sum())!r}", flush=True)
kv.close()
"""


@pytest.mark.timeout(300)
def test_a_killed_server_is_replaced_and_training_ends_as_without_the_crash(tmp_path):
    reference, out = run_with_a_replaced_server(tmp_path, WORKER, crash_at=7)
    assert re.search(r"server 0 on 127.0.0.1 was killed by SIGKILL; starting it again from checkpoint "
                     r".*ckpt-2 \(1 of at most 1 server restarts\)", out), out
    assert "server 0: restored" in out and "replacement server; push counts" in out, out
    assert out.count("server 0 replaced: sending it") == 2, out  # both workers replay
    assert finals(out) == reference, out  # the same floats as without the crash
