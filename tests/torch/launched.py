"""The 2-rank jobs of ``tests/torch``: case scripts under ``pskv launch``, each rank's outcomes read back.

A job script (``tests/torch/job_<name>.py``) runs its cases (each recorded as ``"ok"`` or the
exception's text, so one failing case does not hide the next) and writes ``rank-R.json`` into
the directory it is given as its one argument, both through its ``Cases`` (tests/torch/cases.py).

:func:`shared_jobs` runs every script of :data:`SCRIPTS` in one launched job per store kind
(``pskv launch -n 2 -s S``, both kinds at once; tests/torch/run_scripts.py runs the scripts one
after another in each rank's process): once per test session, whichever xdist worker asks
first (the others wait on a file lock and read what it wrote). Each job costs seconds of CPU
to start (its processes, importing torch), so one per store kind instead of one per script and
kind keeps the suite fast. :func:`assert_case` checks one case on both ranks.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from pskv.testing.jobs import ProcessGroup, child_env, start_launch

Outcomes = dict[int, dict[str, Any]]  # rank -> what the job script wrote

HERE = Path(__file__).resolve().parent
# store kind -> (pskv launch -s, the scripts its job runs, in order): the all-reduce cases that make
# errors on purpose (api) late, the one that installs an optimizer on the servers (server_update) last
SCRIPTS: dict[str, tuple[int, tuple[str, ...]]] = {
    "dist_sync": (1, ("ddp", "optimizer", "sparse", "cross_barrier", "byteps", "api", "server_update")),
    "allreduce": (0, ("ddp", "optimizer", "sparse", "byteps", "api")),
}
SHARED_DEADLINE = 300.0  # seconds for both shared jobs (about 40 s on an idle 2-core machine)


def assert_case(job: Outcomes, name: str) -> None:
    """Case ``name`` passed on every rank."""
    for rank, results in job.items():
        assert "__crashed__" not in results, f"rank {rank}'s script crashed:\n{results['__crashed__']}"
        assert results[name] == "ok", f"rank {rank}: {results[name]}"


def shared_jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Outcomes]]:
    """store kind -> script name -> each rank's outcomes, of the jobs of :data:`SCRIPTS` (run once a session).

    Raises:
        AssertionError: a job did not end with status 0 (its output's end; every test that asks fails alike).
    """
    base = tmp_path_factory.getbasetemp()
    where = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "torch-jobs"
    where.mkdir(exist_ok=True)
    done = where / "outcomes.json"
    with FileLock(str(where / "lock"), timeout=SHARED_DEADLINE + 60):
        if not done.exists():
            done.write_text(json.dumps(_run_shared(where)))
    found = json.loads(done.read_text())
    assert "failed" not in found, found.get("failed")
    return {kind: {name: {int(r): out for r, out in ranks.items()} for name, ranks in scripts.items()}
            for kind, scripts in found.items()}


def _run_shared(where: Path) -> dict[str, Any]:
    """Start both jobs, wait for them; what every rank of every script wrote, or ``{"failed": text}``."""
    env = child_env({"PSKV_DEFAULT_TIMEOUT": "60", "PSKV_REQUEST_TIMEOUT": "30"})
    with ProcessGroup("tests/torch jobs") as group:
        launched = {}
        for kind, (servers, names) in SCRIPTS.items():
            scripts = [str(HERE / f"job_{name}.py") for name in names]
            args = ["-n", "2", "-s", str(servers), "--stop-grace", "2", "--", sys.executable, "-W",
                    "ignore::DeprecationWarning", str(HERE / "run_scripts.py"), str(where / kind), *scripts]
            launched[kind] = start_launch(group, args, where, env, name=f"launch {kind}")
        end = time.monotonic() + SHARED_DEADLINE
        for kind, proc in launched.items():
            code = proc.wait(max(0.0, end - time.monotonic()))
            if code != 0:
                return {"failed": f"{kind} (exit status {code}):\n" + proc.output()[-6000:]}
    return {kind: {name: {r: json.loads((where / kind / name / f"rank-{r}.json").read_text()) for r in range(2)}
                   for name in names} for kind, (_, names) in SCRIPTS.items()}
