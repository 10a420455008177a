"""``pskv top`` on a real ``pskv launch -n 2 -s 2`` job: ``--once --json`` shows every node at work,
and the live view, in a real terminal (tmux), shows the nodes and exits with a line when the job ends."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pskv.metrics import snapshot
from pskv.testing.jobs import ProcessGroup, start_launch, tagged_pids

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="finds leftover processes through /proc")

DEADLINE = 30.0  # seconds any wait of these tests may take
# each worker pushes and pulls until the stop file exists (or its own deadline passes); the
# workers decide together (element 0 of the round's sum), so both stop after the same round
WORKER = """
import os, sys, time
import numpy as np
import pskv

stop = sys.argv[1]
kv = pskv.create("dist_sync")
kv.init(1, np.zeros(1000, np.float32))
out = np.zeros(1000, np.float32)
end = time.monotonic() + 30
while True:
    value = np.ones(1000, np.float32)
    value[0] = float(os.path.exists(stop) or time.monotonic() > end)
    kv.pushpull(1, value, out=out)
    if out[0] > 0:
        break
    time.sleep(0.005)
kv.close()
"""


class Job:
    """A launched job whose workers run until :meth:`stop`."""

    def __init__(self, group: ProcessGroup, tmp: Path, tag: str) -> None:
        script = tmp / "worker.py"
        script.write_text(WORKER)
        self.address_file = tmp / "scheduler.address"
        self.stop_file = tmp / "stop"
        self.launcher = start_launch(group, [
            "-n", "2", "-s", "2", "--address-file", str(self.address_file), "--env", "PS_HEARTBEAT_INTERVAL=0.2",
            "--env", "MXNET_KVSTORE_BIGARRAY_BOUND=100",  # the key on both servers: each has work
            "--timeout", str(DEADLINE), "--", sys.executable, str(script), str(self.stop_file)], tmp, tag=tag)
        group.wait_for_file(self.address_file, DEADLINE)  # written once the scheduler listens

    def stop(self) -> int | None:
        """Let the workers end; the launcher's exit status (None: it did not end within DEADLINE)."""
        self.stop_file.touch()
        return self.launcher.wait(DEADLINE)


@pytest.fixture
def job(tmp_path: Path, tag: str) -> Iterator[Job]:
    with ProcessGroup("pskv launch") as group:
        running = Job(group, tmp_path, tag)
        yield running
        assert running.stop() == 0, running.launcher.output()[-3000:]
    assert not tagged_pids(tag)


def top(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pskv", "top", *args], capture_output=True, text=True,
                          timeout=DEADLINE)


def test_top_on_a_launched_job(job: Job):
    """One job for both views (a launch costs seconds): --once --json first, then the live view
    in a real terminal, which must end with the job."""
    _once_json_shows_every_node_at_work(job)
    if shutil.which("tmux") is None:
        pytest.skip("needs tmux for the live view (--once --json passed)")
    _live_view_in_a_terminal_until_the_job_ends(job)


def _once_json_shows_every_node_at_work(job: Job) -> None:
    address = job.address_file.read_text().strip()
    deadline = time.monotonic() + DEADLINE
    while True:  # until every node reported twice (rates): asked in process, cheaper than a command each time
        early = snapshot(address, timeout=5)
        if len(early.nodes) == 4 and all(n.rounds_per_s for n in early.nodes):
            break
        assert time.monotonic() < deadline, early
        time.sleep(0.2)
    run = top("--port-file", str(job.address_file), "--once", "--json", "--timeout", "5")
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    nodes = {n["node"]: n for n in seen["nodes"]}
    assert sorted(nodes) == ["server 0", "server 1", "worker 0", "worker 1"]
    assert all(n["rounds"] > 0 and n["bytes_in"] > 0 and n["bytes_out"] > 0 and n["rounds_per_s"] > 0
               for n in nodes.values()), nodes
    assert {n["state"] for n in nodes.values()} == {"alive"}
    assert all(n["bytes_in_per_s"] > 0 and n["bytes_out_per_s"] > 0 for n in nodes.values()), nodes
    assert seen["address"] == f"tcp://{address}"


def _live_view_in_a_terminal_until_the_job_ends(job: Job) -> None:
    session = f"pskv-top-{os.getpid()}-{time.monotonic_ns()}"
    command = (f"env -u COLUMNS -u LINES {sys.executable} -m pskv top --port-file {job.address_file} --interval 0.2 --timeout 3; "
               "echo TOP-EXIT=$?; sleep 60")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "24", command], check=True,
                   timeout=10)
    try:
        # the nodes, with rates (a node's second report): bytes per second ("441.9KiB ")
        screen = _wait_for_screen(session, lambda text: "worker 1" in text and "server 1" in text
                                  and "B " in text)
        rows = [line for line in screen.splitlines() if line.startswith(("worker ", "server "))]
        assert len(rows) == 4 and all("alive" in row for row in rows), screen
        code = job.stop()
        assert code == 0
        screen = _wait_for_screen(session, lambda text: "TOP-EXIT=" in text)
        assert "pskv top: the job at" in screen and "ended" in screen, screen
        assert "TOP-EXIT=0" in screen, screen
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], timeout=10, check=False)


def _wait_for_screen(session: str, ready: object) -> str:
    deadline = time.monotonic() + DEADLINE
    while True:
        text = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True,
                              timeout=10).stdout
        if ready(text):  # type: ignore[operator]
            return text
        assert time.monotonic() < deadline, text
        time.sleep(0.2)
