"""The README's main job runs and reaches its stated result."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_local_data_parallel_example_matches_single_device_training():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "local_data_parallel.py"), "--epochs", "2", "--devices", "3"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "epoch 2/2" in proc.stdout
    assert "3 devices vs 1 device with the whole batch: max weight difference" in proc.stdout
    accuracy = float(proc.stdout.strip().splitlines()[-1].split()[-1])
    assert accuracy >= 0.9


def test_distributed_example_under_the_launcher_matches_single_process_training():
    proc = subprocess.run(
        [sys.executable, "-m", "pskv", "launch", "-n", "2", "-s", "2", "--timeout", "150", "--",
         sys.executable, str(ROOT / "examples" / "dist_data_parallel.py"), "--epochs", "2"],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[worker 0] epoch 2/2" in proc.stdout
    assert "2 workers vs 1 process with the whole batch: max weight difference" in proc.stdout
    accuracy = float(proc.stdout.strip().splitlines()[-1].split()[-1])
    assert accuracy >= 0.9
