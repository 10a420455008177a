"""Real processes killed with SIGKILL: the survivors raise NodeFailedError naming the dead node.

The cluster is started by hand (not by the launcher, which would stop the survivors at
the first failure) on 127.0.0.1 with short heartbeat settings; every child is reaped.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from pskv.testing.jobs import ProcessGroup, child_env, start_nodes
from pskv.transport.shm import SHM_ROOT

HEARTBEAT = {"PS_HEARTBEAT_INTERVAL": "0.2", "PS_HEARTBEAT_TIMEOUT": "2", "PSKV_STARTUP_TIMEOUT": "30"}

WORKER = """
import sys, time
import numpy as np
import pskv
kv = pskv.create("dist_sync")
kv.init(list(range(4)), [np.zeros(1000)] * 4)
kv.push(list(range(4)), [np.ones(1000)] * 4)
kv.pull(list(range(4)))
print("ready", kv.rank, flush=True)
start = time.monotonic()
try:
    while time.monotonic() - start < 60:
        kv.push(list(range(4)), [np.ones(1000)] * 4)
        kv.pull(list(range(4)))
except pskv.NodeFailedError as exc:
    print(f"caught after {time.monotonic() - start:.1f}s: {exc}", flush=True)
    kv.close()
    sys.exit(0)
print("no error", flush=True)
sys.exit(1)
"""


def start_job(group: ProcessGroup, tmp: Path, servers: int, workers: int, servers_run_script: bool = False,
              env: dict[str, str] | None = None) -> str:
    """Scheduler, servers and workers of WORKER by hand in ``group``; returns the job id."""
    script = tmp / "worker.py"
    script.write_text(WORKER)
    # a cluster manager may start the user's script for every role: create() then serves
    started = start_nodes(group, tmp, servers, workers, [sys.executable, str(script)],
                          child_env({**HEARTBEAT, **(env or {})}),
                          server_argv=[sys.executable, str(script)] if servers_run_script else None)
    return started["PSKV_JOB_ID"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("victim,named", [("server 1", "server 1"), ("worker 1", "worker 1")])
def test_sigkill_ends_in_node_failed_error_on_every_survivor(tmp_path, victim, named):
    with ProcessGroup() as job:
        job_id = start_job(job, tmp_path, servers=2, workers=2)
        job.expect("worker 0", "ready", 40)
        job.expect("worker 1", "ready", 40)
        job[victim].signal(signal.SIGKILL)
        survivor = "worker 0"
        line = job.expect(survivor, "caught after", 30)
        assert named in line, line
        seconds = float(line.split("caught after ")[1].split("s:")[0])
        assert seconds < 20  # about one heartbeat timeout (2 s) plus the time to get there
        if victim.startswith("server"):
            job.expect("worker 1", "caught after", 30)
        codes = job.wait_all(30)  # everyone left ends by itself
        assert codes[victim] == -signal.SIGKILL
        assert all(code == 0 for name, code in codes.items() if name != victim), codes
        leftovers = [n for n in os.listdir(SHM_ROOT) if n.startswith(f"pskv-{job_id}-")]
        assert len(leftovers) == (1 if victim.startswith("server") else 0), leftovers  # only the killed one


@pytest.mark.timeout(90)
def test_the_users_script_started_as_a_server_serves_and_exits(tmp_path):
    with ProcessGroup() as job:
        start_job(job, tmp_path, servers=1, workers=2, servers_run_script=True)
        job.expect("worker 0", "ready", 40)
        job.expect("worker 1", "ready", 40)
        job["worker 0"].signal(signal.SIGKILL)  # end the job: worker 1 sees it die
        job.expect("worker 1", "caught after", 30)
        codes = job.wait_all(30)
        assert codes["server 0"] == 0 and codes["scheduler"] == 0
        assert not any("ready" in line for line in job["server 0"].text())  # the script's worker part never ran


@pytest.mark.timeout(90)
def test_with_a_recovery_window_a_worker_never_replaced_still_ends_in_node_failed_error(tmp_path):
    # PSKV_RECOVERY_TIMEOUT=3: the survivors wait that long for a replacement of the dead
    # worker (none comes), then the waits that need it fail naming it, as without recovery.
    with ProcessGroup() as job:
        start_job(job, tmp_path, servers=1, workers=2, env={"PSKV_RECOVERY_TIMEOUT": "3"})
        job.expect("worker 0", "ready", 40)
        job.expect("worker 1", "ready", 40)
        job["worker 1"].signal(signal.SIGKILL)
        line = job.expect("worker 0", "caught after", 40)
        assert "worker 1" in line, line
        seconds = float(line.split("caught after ")[1].split("s:")[0])
        assert 3 <= seconds < 30  # heartbeat timeout (2 s) + the recovery window (3 s) + slack
        codes = job.wait_all(30)
        assert codes["worker 1"] == -signal.SIGKILL and codes["worker 0"] == 0, codes
