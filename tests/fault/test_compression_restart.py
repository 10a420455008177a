"""Compressed jobs that lose a server end bitwise as without the crash: the compression residuals
(each worker's, and each server's reply residuals with ``both_ways``) are saved with every
checkpoint, so a whole-job restart (``pskv launch --max-restarts``) and a replaced server
(``--restart-servers``) go on from them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.fault.launched import finals, launch_crashing

WORKER = """
import hashlib, json, logging, os, sys
import numpy as np
import pskv

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")  # "... read from"

steps, crash_at, params = 11, int(sys.argv[1]), json.loads(sys.argv[2])
kv = pskv.create("dist_sync")
kv.set_gradient_compression(params)
kv.init("w", np.zeros(3000, np.float32))  # over both servers (bigarray bound 1000); no optimizer: sums
acc, start = np.zeros(3000, np.float32), 0
if kv.resumed is not None:
    start, acc = kv.resumed["meta"]["step"] + 1, np.array(kv.resumed["meta"]["acc"], np.float32)
    print(f"resumed at step {start}", flush=True)
for step in range(start, steps):
    grad = (0.3 * np.sin(np.arange(3000, dtype=np.float32) * (step + 1) + kv.rank)).astype(np.float32)
    if step % 2:
        out = np.empty(3000, np.float32)
        kv.pushpull("w", grad, out=out)
    else:
        kv.push("w", grad)
        out = kv.pull("w")
    acc += out
    if step % 4 == 3:
        kv.save_checkpoint(meta={"step": step, "acc": acc.tolist()})
    if step == crash_at and kv.rank == 0 and os.environ.get("PSKV_RESTART_COUNT") is None:
        print("crashing server 0", flush=True)
        kv.send_command_to_servers(99, "")  # server 0 SIGKILLs itself
print(f"final {kv.rank} {hashlib.sha256(acc.tobytes()).hexdigest()} {float(acc.astype(np.float64).sum())!r}",
      flush=True)
kv.close()
"""


TWO_BIT = {"type": "2bit", "threshold": 0.5}
BOTH_WAYS = {**TWO_BIT, "both_ways": True}
# top-k's residuals keep what was not sent for many rounds: a server residual started at zero would show
# (2bit's server residuals here merge with a zero start within a few rounds)
TOPK_BOTH_WAYS = {"type": "topk", "k": 0.05, "both_ways": True}


def launch(tmp: Path, crash_at: int, params: dict, *extra: str) -> tuple[int, str]:
    return launch_crashing(tmp, WORKER, [str(crash_at), json.dumps(params)], [
        "--env", "PSKV_SHM=0", "--env", "MXNET_KVSTORE_BIGARRAY_BOUND=1000", "--checkpoint-dir", str(tmp / "ckpts"),
        *extra], deadline=90.0)


_REFERENCES: dict[str, dict[int, str]] = {}


def reference(tmp: Path, params: dict) -> dict[int, str]:
    """The crash-free run's finals (once per compression)."""
    name = json.dumps(params, sort_keys=True)
    if name not in _REFERENCES:
        code, out = launch(tmp, -1, params)
        assert code == 0, out
        found = finals(out)
        assert len(found) == 2 and found[0] == found[1], out
        _REFERENCES[name] = found
    return _REFERENCES[name]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("params", [TWO_BIT, BOTH_WAYS], ids=["2bit", "both_ways"])
def test_a_compressed_job_restarted_from_its_checkpoint_ends_bitwise_as_without_the_crash(tmp_path, params):
    expected = reference(tmp_path / "a", params)
    code, out = launch(tmp_path / "b", 6, params, "--max-restarts", "1")
    assert code == 0, out
    assert "crashing server 0" in out and "restarting the job (1 of at most 1)" in out, out
    assert out.count("resumed at step 4") == 2, out
    assert out.count("compression residuals of 2 part(s) read from") == 2, out  # both workers
    if params.get("both_ways"):
        assert re.search(r"server 0: restored 1 part\(s\), 1 reply residual\(s\) from", out), out
    assert "start at zero" not in out, out
    assert finals(out) == expected, out  # the same bits as without the crash


@pytest.mark.timeout(200)
def test_a_replaced_server_restores_its_reply_residuals_and_replays_the_rounds_bitwise(tmp_path):
    expected = reference(tmp_path / "a", TOPK_BOTH_WAYS)
    code, out = launch(tmp_path / "b", 6, TOPK_BOTH_WAYS, "--restart-servers", "1", "--recovery-timeout", "30")
    assert code == 0, out
    assert re.search(r"server 0 on 127.0.0.1 was killed by SIGKILL; starting it again from checkpoint", out), out
    assert re.search(r"server 0: restored 1 part\(s\), 1 reply residual\(s\) from", out), out
    assert out.count("server 0 replaced: sending it") == 2, out  # both workers replay pushes and pulls
    assert finals(out) == expected, out  # the replayed rounds were compressed as the first time
