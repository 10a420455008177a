"""pskv launch --max-restarts with server checkpoints: a server SIGKILLed mid-training ends
the attempt; the launcher starts the job again from the latest checkpoint, and the final
values equal those of a run without the crash (the rounds after the checkpoint are replayed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.fault.launched import finals, launch_crashing

WORKER = """
import os, sys
import numpy as np
import pskv
from pskv.optimizer import SGD

steps, crash_at = 12, int(sys.argv[1])
kv = pskv.create("dist_sync")
kv.set_optimizer(SGD(learning_rate=0.1, momentum=0.9, wd=0.01))  # keeps restored state
kv.init("w", np.linspace(-1, 1, 3000, dtype=np.float32))  # a restored key keeps its saved value
start = 0
if kv.resumed is not None:
    start = kv.resumed["meta"]["step"] + 1
    print(f"resumed at step {start}", flush=True)
for step in range(start, steps):
    kv.push("w", np.sin(np.arange(3000, dtype=np.float32) * (step + 1) + kv.rank))
    w = kv.pull("w")
    if step % 4 == 3:
        kv.save_checkpoint(meta={"step": step})
    if step == crash_at and kv.rank == 0 and os.environ.get("PSKV_RESTART_COUNT") is None:
        print("crashing server 0", flush=True)
        kv.send_command_to_servers(99, "")  # server 0 SIGKILLs itself
print(f"final {kv.rank} {float(w.astype(np.float64).sum())!r}", flush=True)
kv.close()
"""


def launch(tmp: Path, crash_at: int, *extra: str) -> tuple[int, str]:
    return launch_crashing(tmp, WORKER, [str(crash_at)], extra, deadline=90.0)


@pytest.mark.timeout(200)
def test_a_server_killed_mid_training_is_restarted_from_the_checkpoint_with_the_same_result(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    code, clean = launch(tmp_path / "a", -1, "--checkpoint-dir", str(tmp_path / "a" / "ckpts"))
    assert code == 0, clean
    reference = finals(clean)
    assert len(reference) == 2 and reference[0] == reference[1]

    ckpts = tmp_path / "b" / "ckpts"
    code, out = launch(tmp_path / "b", 6, "--checkpoint-dir", str(ckpts), "--max-restarts", "2")
    assert code == 0, out
    assert "crashing server 0" in out
    assert re.search(r"server 0 .*was killed by SIGKILL", out), out  # the root cause of the failed attempt
    assert f"restarting the job (1 of at most 2) from checkpoint {ckpts / 'ckpt-1'}" in out, out
    assert out.count("resumed at step 4") == 2, out  # both workers: steps 4-6 are replayed
    assert finals(out) == reference, out  # the same floats as without the crash
    assert sorted(p.name for p in ckpts.iterdir()) == ["ckpt-1", "ckpt-2", "ckpt-3"]


@pytest.mark.timeout(120)
def test_without_restarts_left_the_failure_is_final(tmp_path):
    code, out = launch(tmp_path, 2, "--checkpoint-dir", str(tmp_path / "c"))  # --max-restarts 0
    assert code != 0 and "restarting" not in out, out
    assert re.search(r"server 0 .*was killed by SIGKILL", out), out
