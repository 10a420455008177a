"""Helpers for fault tests that run a whole job under ``pskv launch`` (real processes)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def launch_job(tmp: Path, worker: str, worker_args: Sequence[str], launch_args: Sequence[str],
               modules: Mapping[str, str] | None = None, deadline: float = 120.0) -> tuple[int, str]:
    """Run ``pskv launch -n 2 -s 2 ... -- python worker.py ARGS`` in ``tmp``; returns (exit code, output).

    ``modules`` (name -> source) are written to ``tmp`` and importable by every process
    (e.g. a controller module for ``PSKV_SERVER_MODULES``). The launcher and everything
    it started are killed if it runs past ``deadline`` seconds (the test then fails).
    """
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "worker.py").write_text(worker)
    for name, source in (modules or {}).items():
        (tmp / f"{name}.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{tmp}"}
    args = [sys.executable, "-m", "pskv", "launch", "-n", "2", "-s", "2", "--stop-grace", "2", *launch_args, "--",
            sys.executable, str(tmp / "worker.py"), *worker_args]
    proc = subprocess.Popen(args, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out = proc.communicate()[0]
        pytest.fail(f"the launcher did not finish within {deadline} s:\n{out}")
    return proc.returncode, out


def finals(out: str) -> dict[int, str]:
    """worker rank -> what it printed after ``final <rank> `` (its final values)."""
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"\[worker \d\] final (\d) (.+)", out)}
