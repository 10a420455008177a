"""Real processes killed with SIGKILL: the survivors raise NodeFailedError naming the dead node.

The cluster is started by hand (not by the launcher, which would stop the survivors at
the first failure) on 127.0.0.1 with short heartbeat settings; every child is reaped.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pskv.transport.shm import SHM_ROOT, remove_job_files

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


class Job:
    """Scheduler, servers and workers as child processes with line readers."""

    def __init__(self, tmp: Path, servers: int, workers: int, servers_run_script: bool = False,
                 env: dict[str, str] | None = None) -> None:
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.lines: dict[str, queue.Queue[str]] = {}
        self.job_id = f"test{os.getpid()}{int(time.monotonic() * 1000) % 100000}"
        base = {**os.environ, "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_NODE_HOST": "127.0.0.1", "PSKV_JOB_ID": self.job_id,
                "DMLC_NUM_SERVER": str(servers), "DMLC_NUM_WORKER": str(workers), **HEARTBEAT, **(env or {})}
        port_file = tmp / "port"
        self._start("scheduler", [sys.executable, "-m", "pskv", "scheduler", "--port-file", str(port_file)],
                    {**base, "DMLC_ROLE": "scheduler", "DMLC_PS_ROOT_PORT": "0"})
        deadline = time.monotonic() + 20
        while not port_file.exists():
            assert time.monotonic() < deadline and self.procs["scheduler"].poll() is None, "scheduler did not start"
            time.sleep(0.02)
        base["DMLC_PS_ROOT_PORT"] = port_file.read_text().strip()
        script = tmp / "worker.py"
        script.write_text(WORKER)
        for s in range(servers):
            # a cluster manager may start the user's script for every role: create() then serves
            argv = [sys.executable, str(script)] if servers_run_script else [sys.executable, "-m", "pskv", "server"]
            self._start(f"server {s}", argv, {**base, "DMLC_ROLE": "server", "PSKV_SERVER_RANK": str(s)})
        for w in range(workers):
            self._start(f"worker {w}", [sys.executable, str(script)],
                        {**base, "DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(w)})

    def _start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: queue.Queue[str] = queue.Queue()
        def read() -> None:
            assert proc.stdout is not None
            try:
                for line in proc.stdout:
                    lines.put(line)
            except ValueError:  # closed by reap()
                pass

        threading.Thread(target=read, daemon=True).start()
        self.procs[name], self.lines[name] = proc, lines

    def expect(self, name: str, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            try:
                line = self.lines[name].get(timeout=0.1)
            except queue.Empty:
                continue
            seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"{name} did not print {text!r} within {timeout} s; printed: {''.join(seen)}")

    def wait_all(self, timeout: float) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        codes = {}
        for name, proc in self.procs.items():
            codes[name] = proc.wait(max(0.1, deadline - time.monotonic()))
        return codes

    def reap(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        for proc in self.procs.values():
            if proc.stdout is not None:
                proc.stdout.close()
        remove_job_files(self.job_id)  # a SIGKILLed server cannot remove its shared memory


@pytest.mark.timeout(90)
@pytest.mark.parametrize("victim,named", [("server 1", "server 1"), ("worker 1", "worker 1")])
def test_sigkill_ends_in_node_failed_error_on_every_survivor(tmp_path, victim, named):
    job = Job(tmp_path, servers=2, workers=2)
    try:
        job.expect("worker 0", "ready", 40)
        job.expect("worker 1", "ready", 40)
        job.procs[victim].send_signal(signal.SIGKILL)
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
        leftovers = [n for n in os.listdir(SHM_ROOT) if n.startswith(f"pskv-{job.job_id}-")]
        assert len(leftovers) == (1 if victim.startswith("server") else 0), leftovers  # only the killed one
    finally:
        job.reap()


@pytest.mark.timeout(90)
def test_the_users_script_started_as_a_server_serves_and_exits(tmp_path):
    job = Job(tmp_path, servers=1, workers=2, servers_run_script=True)
    try:
        job.expect("worker 0", "ready", 40)
        job.expect("worker 1", "ready", 40)
        job.procs["worker 0"].send_signal(signal.SIGKILL)  # end the job: worker 1 sees it die
        job.expect("worker 1", "caught after", 30)
        codes = job.wait_all(30)
        assert codes["server 0"] == 0 and codes["scheduler"] == 0
        server_output = []
        while not job.lines["server 0"].empty():
            server_output.append(job.lines["server 0"].get())
        assert not any("ready" in line for line in server_output)  # the script's worker part never ran
    finally:
        job.reap()


@pytest.mark.timeout(90)
def test_with_a_recovery_window_a_worker_never_replaced_still_ends_in_node_failed_error(tmp_path):
    # PSKV_RECOVERY_TIMEOUT=3: the survivors wait that long for a replacement of the dead
    # worker (none comes), then the waits that need it fail naming it, as without recovery.
    job = Job(tmp_path, servers=1, workers=2, env={"PSKV_RECOVERY_TIMEOUT": "3"})
    try:
        job.expect("worker 0", "ready", 40)
        job.expect("worker 1", "ready", 40)
        job.procs["worker 1"].send_signal(signal.SIGKILL)
        line = job.expect("worker 0", "caught after", 40)
        assert "worker 1" in line, line
        seconds = float(line.split("caught after ")[1].split("s:")[0])
        assert 3 <= seconds < 30  # heartbeat timeout (2 s) + the recovery window (3 s) + slack
        codes = job.wait_all(30)
        assert codes["worker 1"] == -signal.SIGKILL and codes["worker 0"] == 0, codes
    finally:
        job.reap()
