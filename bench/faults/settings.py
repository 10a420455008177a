"""What every fault run shares: the jobs' keys, heartbeats and environment, and which ``pskv/`` is measured.

Imports only the standard library: the worker processes import this module too, and
nothing may import ``pskv`` before :data:`SOURCE` is first on ``sys.path``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# the worker script of every job: it runs bench.faults.workers (`bench_faults.py _worker SPEC.json`)
WORKER_SCRIPT = REPO / "bench" / "bench_faults.py"
# the directory whose pskv/ is measured: this checkout, or an export of --pskv-commit (passed to
# every child process in PSKV_BENCH_SOURCE and first on its PYTHONPATH); see use_source
SOURCE = Path(os.environ.get("PSKV_BENCH_SOURCE") or REPO)
if str(SOURCE) not in sys.path:
    sys.path.insert(0, str(SOURCE))
EVENT = "@@ "  # worker event lines: "@@ {json}"

DEFAULT_HB = {"PS_HEARTBEAT_INTERVAL": "1", "PS_HEARTBEAT_TIMEOUT": "10"}
SHORT_HB = {"PS_HEARTBEAT_INTERVAL": "0.5", "PS_HEARTBEAT_TIMEOUT": "2"}
# the training workers' keys: int keys are used as they are; with the big-array bound at
# 1000 the last two are split over every server, so each server holds part of the model
KEYS = [100, 101, 102, 103]
SIZES = [16, 256, 1000, 4096]
# the stall report must come before the heartbeat timeout: it is checked every min(limit, 5) s
STOP_DEFAULT = {**DEFAULT_HB, "PSKV_STALL_REPORT": "2"}
STOP_SHORT = {**SHORT_HB, "PSKV_STALL_REPORT": "0.5"}
EXTRA_STEPS = 60  # fuzz runs: steps every worker makes after the last hostile message (at least)
COMMON_ENV = {"MXNET_KVSTORE_BIGARRAY_BOUND": "1000", "PSKV_STARTUP_TIMEOUT": "60", "PSKV_STALL_REPORT": "2"}
CONTRACT_VARS = ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER",
                 "DMLC_NODE_HOST", "DMLC_WORKER_ID", "PSKV_LOCAL_RANK", "PSKV_SERVER_RANK", "PSKV_RESUME_FROM",
                 "PSKV_RESTART_COUNT", "PSKV_CHECKPOINT_DIR", "PSKV_JOB_ID", "DMLC_INTERFACE")

RESTART_SPEC = {"mode": "restart", "steps": 16, "every": 4, "pace": 0.15}
REPLACE_WORKER_STEP = 6  # worker 1 is killed before pushing this step (16 steps, no checkpoints)
REPLACE_SERVER_STEP = 5  # server 0 is killed after worker 0's step 5 (checkpoints after steps 3, 7, 11, 15)
RECOVERY_TIMEOUT = "30"
# restart_exact: worker 1 SIGKILLed at a random moment of this run (no pause, 60 short steps), its
# replacement going on from kv.resume_step(); the kill falls uniformly within RESTART_EXACT_WINDOW s
# after worker 1's first step (the run takes longer than that)
RESTART_EXACT_SPEC = {"mode": "restart", "steps": 60, "every": 0, "pace": 0.01, "resume": "servers"}
RESTART_EXACT_WINDOW = 0.8


def use_source(path: Path) -> None:
    """Measure the ``pskv/`` under ``path`` (an export of ``--pskv-commit``): in this process and every child.

    Call it before anything imports ``pskv``.
    """
    global SOURCE
    SOURCE = path
    os.environ["PSKV_BENCH_SOURCE"] = str(path)
    sys.path.insert(0, str(path))
