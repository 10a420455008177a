"""A server that cannot start is seen (issue 28, finding 5): a server given a damaged checkpoint to
resume from (or a controller module it cannot import) tells the scheduler why before it exits, and
every worker's ``pskv.create`` raises NodeFailedError naming the server and the reason within
seconds, not after PSKV_STARTUP_TIMEOUT (60 s here: the hard test timeout is well under it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pskv.testing.jobs import ProcessGroup, child_env, run_launch, start_nodes

WORKER = """
import sys
import pskv
try:
    pskv.create("dist_sync")
except pskv.KVStoreError as exc:
    print(f"create failed: {type(exc).__name__}: {exc}", flush=True)
    sys.exit(3)
print("no error", flush=True)
"""


# the server starts once the workers wait to register: their pending registrations fail
LATE_SERVER = ["-c", "import sys, time; time.sleep(3); from pskv.cli import main; sys.exit(main(['server']))"]


@pytest.mark.timeout(45)
@pytest.mark.parametrize(("first", "cause"), [("server", "checkpoint"), ("workers", "checkpoint"),
                                              ("workers", "modules")])
def test_workers_learn_why_a_server_could_not_start(tmp_path: Path, first: str, cause: str) -> None:
    ckpt = tmp_path / "ckpt-3"
    ckpt.mkdir()
    (ckpt / "manifest.json").write_text("not json at all")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    if cause == "checkpoint":
        env = child_env({"PSKV_STARTUP_TIMEOUT": "60", "PSKV_RESUME_FROM": str(ckpt)})
        why = f"CheckpointError: {ckpt / 'manifest.json'} is not JSON"
    else:
        env = child_env({"PSKV_STARTUP_TIMEOUT": "60", "PSKV_SERVER_MODULES": "pskv_no_such_module"})
        why = "InvalidArgumentError: PSKV_SERVER_MODULES: cannot import 'pskv_no_such_module'"
    worker = [sys.executable, str(script)]
    with ProcessGroup() as job:
        if first == "server":  # the workers come after the server exited: their registrations fail as they come
            started = start_nodes(job, tmp_path, 1, 2, None, env)
            job["server 0"].wait(20)
            for rank in range(2):
                job.start(f"worker {rank}", worker, {**started, "DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(rank)},
                          cwd=tmp_path)
        else:
            start_nodes(job, tmp_path, 1, 2, worker, env, server_argv=[sys.executable, *LATE_SERVER])
        codes = job.wait_all(30)  # well under the startup timeout: the reason travels at once
        assert codes["server 0"] != 0 and codes["scheduler"] != 0, codes
        for w in ("worker 0", "worker 1"):
            assert codes[w] == 3, (codes, job.describe())
            line = job.expect(w, "create failed:", 1)
            assert f"NodeFailedError: server 0 failed: could not start: {why}" in line, line
        assert f"server 0 could not start: {why}" in job["scheduler"].output(), job.describe()


@pytest.mark.timeout(45)
def test_under_pskv_launch_the_workers_say_why_before_the_job_stops(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt-3"
    ckpt.mkdir()
    (ckpt / "manifest.json").write_text("not json at all")
    # the workers come late (as under load): the server has failed before they register
    (tmp_path / "worker.py").write_text("import time; time.sleep(2)\n" + WORKER)
    # a resumed job whose checkpoint the launcher's scan let through (PSKV_RESUME_FROM reaches the server)
    env = child_env({"PSKV_RESUME_FROM": str(ckpt)})
    code, out = run_launch(["-n", "2", "-s", "1", "--startup-timeout", "60", "--", sys.executable, "worker.py"],
                           tmp_path, 30, env=env)
    assert code != 0, out
    assert "server 0 could not start: CheckpointError" in out, out
    assert "create failed: NodeFailedError: server 0 failed: could not start: CheckpointError:" in out, out
