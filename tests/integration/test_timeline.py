"""A timeline of a 2-worker ``pskv launch`` job (``--timeline DIR``, i.e. ``PSKV_TIMELINE``), issue 14.

Every process's file is checked against the trace-event format
(:func:`tests.unit.test_timeline.check_trace`: fields and types, ``B``/``E`` nesting and
``X`` spans per ``tid``, ``ts`` never going back per ``tid``) and holds push, pull, merge
and update spans of every key the job used, for every round.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.unit.test_timeline import load, spans

REPO = Path(__file__).resolve().parents[2]
STEPS = 3
KEYS = (3, 7)  # 7 is big: split over both servers

WORKER = textwrap.dedent(f"""
    import numpy as np
    import pskv
    from pskv.optimizer import SGD
    kv = pskv.create("dist_sync")
    kv.set_optimizer(SGD(learning_rate=0.1))
    kv.init(3, np.zeros((4, 4), np.float32))
    kv.init(7, np.zeros(1_200_000, np.float32))
    for step in range({STEPS}):
        kv.push([3, 7], [np.ones((4, 4), np.float32), np.ones(1_200_000, np.float32)])
        out = kv.pull(3)
        kv.pull(7)
    print(f"rank={{kv.rank}} value={{out[0, 0]:.2f}}", flush=True)
    kv.close()
""")


@pytest.mark.timeout(90)
def test_a_launched_job_writes_a_valid_timeline_with_every_key_and_round_per_process(tmp_path):
    argv = [sys.executable, "-m", "pskv", "launch", "-n", "2", "-s", "2", "--stop-grace", "2", "--timeout", "60",
            "--timeline", "timeline", "--", sys.executable, "-c", WORKER]
    res = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=80,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "rank=0 value=-0.60" in out and "rank=1 value=-0.60" in out, out
    files = sorted(p.name for p in (tmp_path / "timeline").iterdir())
    assert files == ["server-0.json", "server-1.json", "worker-0.json", "worker-1.json"]  # the scheduler: none
    rounds = {(key, r) for key in KEYS for r in range(1, STEPS + 1)}
    pids = set()
    for rank in (0, 1):
        events = load(tmp_path / "timeline" / f"worker-{rank}.json")
        assert [e["args"]["name"] for e in events if e["name"] == "process_name"] == [f"worker {rank}"]
        for name in ("push", "pull"):
            got = {(e["args"]["key"], e["args"]["round"]) for e in spans(events, name)}
            assert got == rounds, (name, got)
        assert spans(events, "wait")
        big = [e for e in spans(events, "push") if e["args"]["key"] == 7]
        assert all(e["args"]["bytes"] == 4_800_000 for e in big)
        pids |= {e["pid"] for e in events}
    for name in ("merge", "update"):
        got = set()
        for rank in (0, 1):
            events = load(tmp_path / "timeline" / f"server-{rank}.json")
            got |= {(e["args"]["key"], e["args"]["round"]) for e in spans(events, name)}
            assert all(e["args"]["workers"] == 2 for e in spans(events, name))
            assert all(sorted(e["args"]["pushes"]) == ["worker 0", "worker 1"] for e in spans(events, "merge"))
            pids |= {e["pid"] for e in events}
        assert got == rounds, (name, got)
    assert len(pids) == 4  # a pid per process
