"""Leaving is not dying, and no orphans: real jobs through ``pskv launch``.

* a worker that leaves (``close()``, or its script ends without it) is told to the
  scheduler: no heartbeat timeout, no ERROR, and the waits that need it fail at once
  naming it;
* every process of a job ends when the launcher dies (SIGKILL) or, over ssh, when the
  launcher stops its ssh clients (Ctrl-C) — the remote side runs in a session of its own,
  as under sshd;
* a job whose workers never create a store ends at once with exit 0 (docs/launch.md's
  example).

Processes are found by the ``PSKV_TEST_TAG`` in their environment or command line (the
guards carry it in their command line) and killed when a test ends.
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pskv.testing.jobs import child_env
from tests.integration.conftest import tagged_pids
from tests.integration.test_launcher import (
    JOB_DEADLINE,
    WORKER,
    free_port,
    run_launcher,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="finds the job's processes through /proc")

REPO = Path(__file__).resolve().parents[2]
GONE_WITHIN = 10.0  # seconds every process of a job may take to end after its launcher is gone

# Worker 1 leaves early (close(), or the end of its script); worker 0 is in a barrier, or
# in a pull of a round worker 1 never pushes, or pulls such a round after it left.
LEAVER = """
import sys, time
import numpy as np
import pskv

mode, how = sys.argv[1], sys.argv[2]
kv = pskv.create("dist_sync")
kv.init(0, np.zeros(4, np.float32))
if kv.rank == 1:
    time.sleep(0.5)  # worker 0 is waiting by now (if not, its call fails on arrival: the same outcome)
    print(f"leaving at {time.time():.6f}", flush=True)
    if how == "close":
        kv.close()
    sys.exit(0)  # how == "exit": no close(), the store leaves at interpreter exit
if mode == "later":
    time.sleep(1.5)
try:
    if mode == "barrier":
        kv.barrier()
    else:
        kv.push(0, np.ones(4, np.float32))
        kv.pull(0)
    print("no error", flush=True)
except pskv.NodeFailedError as exc:
    print(f"raised at {time.time():.6f}: {exc}", flush=True)
kv.close()
"""

NO_CLOSE = """
import numpy as np
import pskv

kv = pskv.create("dist_sync")
kv.init(0, np.zeros(4, np.float32))
kv.push(0, np.ones(4, np.float32))
print("sum", kv.pull(0)[0], flush=True)
kv.barrier()
"""

# A stand-in for ssh that treats the remote command as sshd does: a session of its own
# (no signal reaches it when this client dies), its stdin relayed from this client's, so
# that it reads end-of-file when the client is gone.
FAKE_SSH_SESSION = """#!{python}
import os, subprocess, sys, threading
args = sys.argv[1:]
while args and args[0].startswith("-"):
    args = args[2:] if args[0] in ("-o", "-p", "-i", "-l") else args[1:]
with open(os.environ["FAKE_SSH_LOG"], "a") as log:
    log.write(args[0] + "\\n")
remote = subprocess.Popen(["bash", "-c", " ".join(args[1:])], stdin=subprocess.PIPE, start_new_session=True)

def relay():
    while data := os.read(0, 65536):
        remote.stdin.write(data)
        remote.stdin.flush()
    remote.stdin.close()

threading.Thread(target=relay, daemon=True).start()
code = remote.wait()
sys.exit(code if code >= 0 else 255)
"""


def start_launcher(args: list[str], tag: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``python -m pskv launch ARGS`` in a session of its own, its output merged on a pipe the test reads."""
    return subprocess.Popen([sys.executable, "-m", "pskv", "launch", "--env", f"PSKV_TEST_TAG={tag}", *args],
                            env=child_env(env), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def kill_launcher(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the launcher's session (whatever of it is left) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def wait_gone(tag: str, within: float) -> list[int]:
    """Wait until no process of the job is left (at most ``within`` s); the survivors."""
    limit = time.monotonic() + within
    while (left := tagged_pids(tag)) and time.monotonic() < limit:
        time.sleep(0.1)
    return left


def read_until_ready(proc: subprocess.Popen[str], workers: int) -> list[str]:
    """The launcher's lines until every worker printed ``ready`` (a readiness handshake)."""
    lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()

    def read() -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    wanted = {f"[worker {r}] ready" for r in range(workers)}
    while not wanted <= set(seen):
        line = lines.get(timeout=JOB_DEADLINE)
        assert line is not None, "\n".join(seen)
        seen.append(line)
    return seen


def script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# -- leaving --------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_a_script_without_close_ends_at_once_without_errors(tag, tmp_path):
    # with a 30 s heartbeat timeout, a departure taken for a death would take 30 s and log ERROR
    worker = script(tmp_path, "no_close.py", NO_CLOSE)
    start = time.monotonic()
    code, out = run_launcher(["-n", "2", "-s", "1", "--env", "PS_HEARTBEAT_TIMEOUT=30", "--",
                              sys.executable, str(worker)], tag, tmp_path)
    elapsed = time.monotonic() - start
    assert code == 0, out
    assert out.count("sum 2.0") == 2, out
    assert "ERROR" not in out and "dead" not in out, out
    assert elapsed < 20, (elapsed, out)
    assert wait_gone(tag, 5) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("mode", "how"), [("barrier", "close"), ("pull", "close"), ("later", "close"),
                                           ("pull", "exit")])
def test_a_worker_that_leaves_fails_the_waits_that_need_it_at_once(mode, how, tag, tmp_path):
    worker = script(tmp_path, "leaver.py", LEAVER)
    code, out = run_launcher(["-n", "2", "-s", "1", "--env", "PS_HEARTBEAT_TIMEOUT=30", "--",
                              sys.executable, str(worker), mode, how], tag, tmp_path)
    assert code == 0, out
    left = re.search(r"\[worker 1\] leaving at ([\d.]+)", out)
    raised = re.search(r"\[worker 0\] raised at ([\d.]+): (.*)", out)
    assert left and raised, out
    assert "worker 1" in raised.group(2) and "left the job" in raised.group(2), out
    delay = float(raised.group(1)) - float(left.group(1))
    if mode != "later":  # "later" pulls 1.5 s after worker 1 left: it fails on arrival
        assert delay < 2.0, (delay, out)  # about 0.1-0.3 s when the machine is idle
    assert "ERROR" not in out and "marked dead" not in out, out


# -- no orphans -----------------------------------------------------------------------------
@pytest.mark.timeout(90)
def test_sigkill_of_the_launcher_ends_every_process_of_the_job(tag, tmp_path):
    worker = script(tmp_path, "worker.py", WORKER)
    proc = start_launcher(["-n", "2", "-s", "2", "--", sys.executable, str(worker), "hang"], tag, tmp_path)
    try:
        read_until_ready(proc, 2)
        assert len(tagged_pids(tag)) >= 2 * 5  # scheduler, 2 servers, 2 workers, each with its guard
        os.kill(proc.pid, signal.SIGKILL)  # the launcher alone, not its group
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert wait_gone(tag, GONE_WITHIN) == []
    finally:
        kill_launcher(proc)


@pytest.mark.timeout(90)
def test_ctrl_c_of_an_ssh_job_ends_the_remote_processes(tag, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ssh").write_text(FAKE_SSH_SESSION.format(python=sys.executable))
    (bindir / "ssh").chmod(0o755)
    (tmp_path / "hosts").write_text("127.0.0.1 2\n")
    worker = script(tmp_path, "worker.py", WORKER)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "FAKE_SSH_LOG": str(tmp_path / "ssh.log")}
    proc = start_launcher(["--launcher", "ssh", "-H", str(tmp_path / "hosts"), "--port", str(free_port()),
                           "-n", "2", "-s", "1", "--stop-grace", "2", "--", sys.executable, str(worker), "hang"],
                          tag, tmp_path, env=env)
    try:
        read_until_ready(proc, 2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=JOB_DEADLINE) == 128 + signal.SIGINT
        assert wait_gone(tag, GONE_WITHIN) == []  # the remote sides too, which no signal reached
    finally:
        kill_launcher(proc)


@pytest.mark.timeout(60)
def test_workers_that_never_create_a_store_end_the_job_at_once(tag, tmp_path):
    # docs/launch.md's example, run as written (pskv and python being this interpreter)
    text = (REPO / "docs" / "launch.md").read_text(encoding="utf-8")
    line = next(ln for ln in text.splitlines() if ln.startswith("pskv launch") and "PSKV_LOCAL_RANK" in ln)
    argv = shlex.split(line)
    assert argv[:2] == ["pskv", "launch"] and argv[argv.index("--") + 1] == "python"
    args = [sys.executable if a == "python" else a for a in argv[2:]]
    start = time.monotonic()
    code, out = run_launcher(args, tag, tmp_path)
    elapsed = time.monotonic() - start
    assert code == 0, out
    ranks = sorted(re.findall(r"^\[worker \d\] (\d)$", out, flags=re.M))
    assert ranks == ["0", "1", "2", "3"], out
    assert elapsed < 15, (elapsed, out)  # was: the exit grace (30 s), then exit 1
    assert wait_gone(tag, 5) == []


# -- the exit hook ---------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the store dropped unclosed
def test_the_exit_hook_holds_open_stores_weakly_and_forked_children_leave_them_alone():
    import gc
    import weakref

    from pskv.kvstore import exit as store_exit
    from pskv.testing.loopback import loopback_store

    kv = loopback_store()
    assert kv in store_exit._OPEN
    pid = os.fork()
    if pid == 0:  # a data-loading child: it has the store, not its threads; its exit must not close it
        os._exit(0 if len(store_exit._OPEN) == 0 else 1)
    assert os.waitpid(pid, 0)[1] == 0
    kv.close()
    assert kv not in store_exit._OPEN
    other = loopback_store()
    ref = weakref.ref(other)
    del other
    gc.collect()
    assert ref() is None  # nothing (no hook, no cycle) keeps an open store alive
