"""A job started the way a cluster manager (MXJob) starts one: only ``DMLC_*`` set, no
``DMLC_NODE_HOST``, nodes on two hosts. Each host is a network namespace this test
creates (``tests/fault/netns.py``): a server that bound loopback there could not be
reached from the other one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fault.netns import CORE_IP

REPO = Path(__file__).resolve().parents[2]
DEADLINE = 60.0

WORKER = """
import numpy as np
import pskv
kv = pskv.create("dist_sync")
kv.init(3, np.zeros(4, np.float32))
kv.push(3, np.full(4, kv.rank + 1, np.float32))
print(f"worker {kv.rank} local_rank {kv.local_rank} sum {kv.pull(3)[0]:g}", flush=True)
kv.close()
"""


@pytest.mark.timeout(120)
def test_nodes_with_only_dmlc_variables_bind_an_address_the_other_host_reaches(net, tmp_path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PS_", "PSKV_", "BYTEPS_"))}
    base = {**clean, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "DMLC_PS_ROOT_URI": CORE_IP,
            "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "2", "PS_HEARTBEAT_INTERVAL": "0.2",
            "PSKV_REQUEST_TIMEOUT": "20", "PSKV_STARTUP_TIMEOUT": "20", "PSKV_SHM": "0"}
    (tmp_path / "worker.py").write_text(WORKER)
    port_file = tmp_path / "port"
    procs: dict[str, subprocess.Popen[str]] = {}

    def start(name: str, side: str, argv: list[str], **env: str) -> None:
        procs[name] = subprocess.Popen(net.exec_argv(side, argv), env={**base, **env}, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True)
    try:
        start("scheduler", "core", [sys.executable, "-m", "pskv", "scheduler", "--port-file", str(port_file)],
              DMLC_ROLE="scheduler", DMLC_PS_ROOT_PORT="0")
        deadline = time.monotonic() + 30
        while not port_file.exists():  # readiness: the port file appears (written atomically)
            assert procs["scheduler"].poll() is None and time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.02)
        port = port_file.read_text().strip()
        start("server", "edge", [sys.executable, "-m", "pskv", "server"], DMLC_ROLE="server", DMLC_PS_ROOT_PORT=port)
        for rank, side in ((0, "core"), (1, "edge")):
            start(f"worker {rank}", side, [sys.executable, str(tmp_path / "worker.py")], DMLC_ROLE="worker",
                  DMLC_PS_ROOT_PORT=port, DMLC_WORKER_ID=str(rank))
        outputs = {}
        end = time.monotonic() + DEADLINE
        for name, proc in procs.items():
            outputs[name] = proc.communicate(timeout=max(1.0, end - time.monotonic()))[0]
        everything = "\n".join(f"--- {n}:\n{o}" for n, o in outputs.items())
        assert all(p.returncode == 0 for p in procs.values()), everything
        # the sum of both workers' pushes reached both: the server in "edge" was reachable from "core"
        for rank in (0, 1):
            assert f"worker {rank} local_rank 0 sum 3" in outputs[f"worker {rank}"], everything
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(15)
            if proc.stdout is not None:
                proc.stdout.close()
