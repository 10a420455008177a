"""pskv launch --restart-workers: a worker that dies mid-training is started again alone,
rejoins the running job (kv.is_recovery) while the others wait in their sync rounds, and
the job ends with the values of a run without the crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fault.launched import finals, launch_job

WORKER = """
import os, sys
import numpy as np
import pskv
from pskv.optimizer import SGD

steps, crash_at, marker = 10, int(sys.argv[1]), sys.argv[2]
kv = pskv.create("dist_sync")
kv.set_optimizer(SGD(learning_rate=0.1, momentum=0.9))    # a replacement keeps the servers' optimizer
kv.init(["w", "b"], [np.linspace(-1, 1, 3000, dtype=np.float32), np.zeros(5)])  # a replacement only registers
start = 0
if kv.is_recovery:
    start = int(open(marker).read())
    print(f"rejoined at step {start} with w[0] = {float(kv.pull('w')[0])!r}", flush=True)
for step in range(start, steps):
    if kv.rank == 1 and step == crash_at and not kv.is_recovery:
        open(marker, "w").write(str(step))
        print("worker 1 dies", flush=True)
        os._exit(3)  # before pushing this step: worker 0's round waits for the replacement
    kv.push(["w", "b"], [np.cos(np.arange(3000, dtype=np.float32) * (step + 1) + kv.rank), np.full(5, step + 1.0)])
    w, b = kv.pull("w"), kv.pull("b")
print(f"final {kv.rank} {float(w.astype(np.float64).sum())!r} {float(b.sum())!r}", flush=True)
kv.close()
"""


def launch(tmp: Path, crash_at: int, *extra: str) -> tuple[int, str]:
    return launch_job(tmp, WORKER, [str(crash_at), str(tmp / "crashed-at")], extra, deadline=90.0)


@pytest.mark.timeout(200)
def test_a_dead_worker_is_replaced_and_the_job_ends_as_without_the_crash(tmp_path):
    code, clean = launch(tmp_path / "a", -1)
    assert code == 0, clean
    reference = finals(clean)
    assert len(reference) == 2 and reference[0] == reference[1]

    code, out = launch(tmp_path / "b", 4, "--restart-workers", "1", "--recovery-timeout", "30")
    assert code == 0, out
    assert "worker 1 dies" in out
    assert "worker 1 on 127.0.0.1 exited with code 3; starting it again (1 of at most 1 worker restarts)" in out, out
    assert "rejoined at step 4" in out, out
    assert finals(out) == reference, out  # every round got both workers' pushes, exactly once


@pytest.mark.timeout(120)
def test_a_second_failure_beyond_the_budget_ends_the_job(tmp_path):
    code, out = launch(tmp_path, 2, "--restart-workers", "0")
    assert code == 3, out
    assert "starting it again" not in out and "worker 1 on 127.0.0.1 exited with code 3; stopping the job" in out, out
