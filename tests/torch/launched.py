"""The 2-rank jobs of ``tests/torch``: a case script under ``pskv launch``, each rank's outcomes read back.

A job script runs its cases (each recorded as ``"ok"`` or the exception's text, so one
failing case does not hide the next) and writes ``rank-R.json`` into the directory it
is given as its one argument. :func:`run_jobs` starts one job per store kind at once
(``pskv launch -n 2 -s S``) and returns what each rank wrote; :func:`assert_case` checks
one case on both ranks.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pskv.testing.jobs import ProcessGroup, child_env, start_launch

Outcomes = dict[int, dict[str, Any]]  # rank -> what the job script wrote


def run_jobs(where: Path, script: str, stores: Mapping[str, int], deadline: float) -> dict[str, Outcomes]:
    """``script`` under ``pskv launch -n 2 -s S`` for every ``kind: S`` of ``stores``, all at once.

    Raises:
        AssertionError: a job did not end with status 0 within ``deadline`` seconds (its output's end).
    """
    with ProcessGroup(f"jobs in {where.name}") as group:
        launched = {}
        for kind, servers in stores.items():
            (where / kind).mkdir()
            (where / kind / "job.py").write_text(script)
            args = ["-n", "2", "-s", str(servers), "--stop-grace", "2", "--",
                    sys.executable, str(where / kind / "job.py"), str(where / kind)]
            launched[kind] = start_launch(group, args, where / kind, child_env({"PSKV_DEFAULT_TIMEOUT": "60"}),
                                          name=f"launch {kind}")
        end = time.monotonic() + deadline
        for kind, proc in launched.items():
            code = proc.wait(max(0.0, end - time.monotonic()))
            assert code == 0, f"{kind} (exit status {code}):\n" + proc.output()[-5000:]
    return {kind: {r: json.loads((where / kind / f"rank-{r}.json").read_text()) for r in range(2)} for kind in stores}


def assert_case(job: Outcomes, name: str) -> None:
    """Case ``name`` passed on every rank."""
    for rank, results in job.items():
        assert results[name] == "ok", f"rank {rank}: {results[name]}"
