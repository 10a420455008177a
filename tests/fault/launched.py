"""Fault tests that run a whole job under ``pskv launch`` (real processes, :mod:`pskv.testing.jobs`).

:func:`launch_job` runs ``pskv launch -n 2 -s 2 ... -- python worker.py ARGS`` to its end;
:func:`launch_crashing` does so with :data:`CRASHING_SERVER` loaded by every server, so a
worker's ``kv.send_command_to_servers(99, "")`` makes server 0 SIGKILL itself mid-training
(the restart and recovery tests compare such a run with one without the crash: :func:`finals`,
:func:`run_with_a_replaced_server`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pskv.testing.jobs import child_env, run_launch

# Server 0 SIGKILLs itself on command 99 — but not a replacement started from a checkpoint
# (PSKV_RESUME_FROM), which must answer the command instead.
CRASHING_SERVER = """
import os, signal
from pskv.server import controller

@controller(99)
def crash(head, body):
    if os.environ.get("PSKV_SERVER_RANK") == "0" and not os.environ.get("PSKV_RESUME_FROM"):
        os.kill(os.getpid(), signal.SIGKILL)
    return "ok"
"""


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
    args = ["-n", "2", "-s", "2", "--stop-grace", "2", *launch_args, "--",
            sys.executable, str(tmp / "worker.py"), *worker_args]
    return run_launch(args, tmp, deadline, env=child_env(paths=[tmp]))


def launch_crashing(tmp: Path, worker: str, worker_args: Sequence[str], launch_args: Sequence[str],
                    deadline: float = 120.0) -> tuple[int, str]:
    """:func:`launch_job` with :data:`CRASHING_SERVER` on the servers and heartbeats that notice a death in 3 s."""
    return launch_job(tmp, worker, worker_args, [
        "--env", "PSKV_SERVER_MODULES=pskv_test_crash", "--env", "PS_HEARTBEAT_TIMEOUT=3",
        "--env", "PS_HEARTBEAT_INTERVAL=0.3", *launch_args], modules={"pskv_test_crash": CRASHING_SERVER},
        deadline=deadline)


def run_with_a_replaced_server(tmp: Path, worker: str, crash_at: int) -> tuple[dict[int, str], str]:
    """``worker`` under :func:`launch_crashing` with ``--restart-servers 1``, twice: without a crash, then with
    server 0 killed at step ``crash_at`` (replaced from the checkpoints the workers save in ``--checkpoint-dir``).

    Returns the crash-free run's :func:`finals` (both workers agree) and the output of the run with the
    crash (it ended with exit code 0, and the crash happened).
    """
    runs = []
    for name, step, extra in (("a", -1, []), ("b", crash_at, ["--recovery-timeout", "30"])):
        code, out = launch_crashing(tmp / name, worker, [str(step)], [
            "--checkpoint-dir", str(tmp / name / "ckpts"), "--restart-servers", "1", *extra])
        assert code == 0, out
        runs.append(out)
    reference = finals(runs[0])
    assert len(reference) == 2 and reference[0] == reference[1], runs[0]
    assert "crashing server 0" in runs[1], runs[1]
    return reference, runs[1]


def finals(out: str) -> dict[int, str]:
    """worker rank -> what it printed after ``final <rank> `` (its final values)."""
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"\[worker \d\] final (\d) (.+)", out)}
