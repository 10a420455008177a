"""What a job shows (issue 14): per-process log files (``--log-dir``, ``--tee``), time-stamped
records at ``PSKV_LOG_LEVEL``, the start line, live ``\\r`` progress, and the ssh preflight.

Real jobs through ``pskv launch`` (local, and ssh through the fake ``ssh`` of
``test_launcher.py``), plus the supervisor with stand-in processes for restarts.
"""

from __future__ import annotations

import io
import logging
import os
import re
import select
import sys
import threading
import time
from pathlib import Path

import pytest

import pskv
import pskv.logs
from pskv.cli import main as cli_main
from pskv.config import ClusterConfig
from pskv.launch import main as launch_main
from pskv.launch.contract import ProcessSpec
from pskv.launch.supervisor import Console, Supervisor
from pskv.logs import show_records
from tests.integration.conftest import tagged_pids
from tests.integration.test_departures import kill_launcher, start_launcher
from tests.integration.test_launcher import (
    FAKE_SSH,
    JOB_DEADLINE,
    free_port,
    run_launcher,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="finds leftover processes through /proc")

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}"  # 2026-11-24 09:12:03.123

WORKER = """
import logging, os, sys
import pskv
kv = pskv.create("dist_sync")
print(f"rank {kv.rank} here", flush=True)
logging.getLogger("pskv.dist").warning("rank %d ready", kv.rank)  # as pskv's own records are shown
kv.barrier()  # both wrote their lines before worker 1 fails (else the job may stop worker 0 before it did)
if kv.rank == 1:
    for i in range(30):
        print(f"line {i}")
    print("worker 1 gives up", file=sys.stderr, flush=True)
    os._exit(3)  # without leaving the job: worker 0 waits in the barrier until the launcher stops it
kv.barrier()
"""

PROGRESS = """
import os, sys, time
from tqdm import tqdm
bar = tqdm(total=2, desc="steps", file=sys.stdout, ascii=True, mininterval=0)
bar.update(1)
limit = time.monotonic() + 30
while not os.path.exists(sys.argv[1]) and time.monotonic() < limit:  # until the test saw the update
    time.sleep(0.01)
bar.update(1)
bar.close()
"""


def script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.timeout(60)
def test_log_dir_gets_each_process_and_the_terminal_the_launcher_and_the_root_cause(tag, tmp_path):
    logs = tmp_path / "logs"
    worker = script(tmp_path, "worker.py", WORKER)
    code, out = run_launcher(["-n", "2", "-s", "1", "--stop-grace", "2", "--log-dir", str(logs), "--",
                              sys.executable, str(worker)], tag, tmp_path)
    assert code == 3, out
    lines = out.splitlines()
    # the start line first, then the launcher's lines only: none of the processes' output
    assert lines[0] == f"pskv launch: 2 workers, 1 server, scheduler on 127.0.0.1 (a free port), launcher local, " \
                       f"logs in {logs}", out
    assert "pskv launch: all 3 nodes registered, " in out, out
    assert not any(line.startswith(("[scheduler]", "[server 0]", "[worker 0]")) for line in lines), out
    assert sorted(p.name for p in logs.iterdir()) == ["scheduler.log", "server-0.log", "worker-0.log",
                                                      "worker-1.log"]
    assert re.fullmatch(rf"rank 0 here\n{STAMP} WARNING \[worker 0\] pskv.dist: rank 0 ready\n",
                        (logs / "worker-0.log").read_text()), (logs / "worker-0.log").read_text()
    # pskv's records: time, level, node, logger (the roles' default level: INFO)
    assert re.search(rf"^{STAMP} INFO \[scheduler\] pskv.scheduler: scheduler: all 3 nodes registered$",
                     (logs / "scheduler.log").read_text(), flags=re.M), (logs / "scheduler.log").read_text()
    assert re.search(rf"^{STAMP} INFO \[server 0\] pskv.server: ", (logs / "server-0.log").read_text(), flags=re.M)
    # the root cause names the failed process's file and shows its last lines
    at = lines.index("pskv launch: worker 1 on 127.0.0.1 exited with code 3; stopping the job")
    assert lines[at + 1] == f"pskv launch: worker 1's output is in {logs / 'worker-1.log'}; its last 15 lines:", out
    assert lines[at + 2:at + 17] == [f"[worker 1] line {i}" for i in range(16, 30)] + ["[worker 1] worker 1 gives up"]
    assert lines[-1] == "pskv launch: stopped scheduler, server 0, worker 0", out
    assert tagged_pids(tag) == []


@pytest.mark.timeout(30)
def test_tee_passes_output_on_live_with_carriage_return_updates_prefixed(tag, tmp_path):
    go = tmp_path / "go"
    worker = script(tmp_path, "progress.py", PROGRESS)
    # PSKV_LOG_LEVEL=WARNING: the roles' INFO lines stay out of the bar's line
    proc = start_launcher(["-n", "1", "-s", "1", "--log-dir", str(tmp_path / "logs"), "--tee", "--",
                           sys.executable, str(worker), str(go)], tag, tmp_path, env={"PSKV_LOG_LEVEL": "WARNING"})
    assert proc.stdout is not None
    out = b""  # read as bytes: text mode would turn each \r into a newline
    try:
        limit = time.monotonic() + JOB_DEADLINE
        while True:  # until the launcher's end closes its output
            assert time.monotonic() < limit, out
            if select.select([proc.stdout], [], [], 0.5)[0]:
                data = os.read(proc.stdout.fileno(), 65536)
                if not data:
                    break
                out += data
                if b"\r[worker 0] steps:  50%" in out:  # the first update came while the worker waits
                    go.touch()
        assert go.exists(), out
        if proc.wait(JOB_DEADLINE) != 0:  # the whole story: pytest would cut a long bytes repr short
            logs = "".join(f"\n--- {p.name}:\n{p.read_text(errors='replace')}"
                           for p in sorted((tmp_path / "logs").glob("*.log")))
            pytest.fail(f"launcher exited {proc.returncode}:\n{out.decode(errors='replace')}{logs}", pytrace=False)
    finally:
        kill_launcher(proc)
        proc.stdout.close()
    assert re.search(rb"\r\[worker 0\] steps: 100%\|#+\| 2/2 [^\r\n]*\n", out), out
    assert b"[worker 0] steps:" not in out.replace(b"\r[worker 0] steps:", b""), out  # every update prefixed
    log = (tmp_path / "logs" / "worker-0.log").read_bytes()
    assert log.startswith(b"\rsteps:   0%") and b"\rsteps:  50%" in log, log  # the file: as written
    assert b"INFO" not in out and b"INFO" not in (tmp_path / "logs" / "scheduler.log").read_bytes()
    assert tagged_pids(tag) == []


def test_a_restarted_worker_appends_to_its_file_after_a_marker(tmp_path):
    flag = tmp_path / "failed-once"
    code = (f"import os, sys\nif not os.path.exists({str(flag)!r}):\n    open({str(flag)!r}, 'w').close()\n"
            "    print('first', end='', flush=True)\n    sys.exit(3)\nprint('second')")
    out, err = io.BytesIO(), io.StringIO()
    with Supervisor(Console(out, err, log_dir=str(tmp_path / "logs")), stop_grace=1, worker_restarts=1) as sup:
        sup.start(ProcessSpec("worker", 0, "127.0.0.1", (sys.executable, "-c", code)))
        assert sup.run() == 0, err.getvalue()
    text = (tmp_path / "logs" / "worker-0.log").read_text()
    assert re.fullmatch(r"first\n----- pskv launch: worker 0 started again at [\d: -]+ -----\nsecond\n", text), text
    assert out.getvalue() == b""  # no --tee: nothing of the process on the terminal
    assert "worker 0 on 127.0.0.1 exited with code 3; starting it again" in err.getvalue()
    # the quiet terminal's last line says the job ended well (one worker, though started twice)
    assert re.search(rf"1 worker finished \(exit 0\), [\d.]+ s after the start; their output is in "
                     rf"{re.escape(str(tmp_path / 'logs'))}\n\Z", err.getvalue()), err.getvalue()


def test_console_keeps_lines_whole_between_processes_and_prefixes_each_update():
    out, err = io.BytesIO(), io.StringIO()
    console = Console(out, err)
    a = console.output(ProcessSpec("worker", 0, "h", ("x",)))
    b = console.output(ProcessSpec("worker", 1, "h", ("x",)))
    a.write(b"\r 10%")
    a.show_held()  # the reader shows a line's start when no more came in time
    b.write(b"hello\n")  # ends worker 0's unfinished line first
    a.write(b"\r 20%")
    a.write(b"\n")
    assert a.write(b"\r 30%\r 40%\ndo") == [b" 40%"]  # lines as last shown
    b.write(b"bye\n")  # worker 0's "do" waits for the rest of its line: not cut
    a.write(b"ne")
    a.show_held()
    console.note("a note")  # ends the unfinished "done"
    a.write(b"\nrank ")  # (the end of "done", which the note ended on the terminal already)
    b.write(b"rank 1\n")
    a.write(b"0\n")  # a line written in pieces stays whole beside another's
    a.close()
    assert out.getvalue() == (b"\r[worker 0]  10%\n[worker 1] hello\n\r[worker 0]  20%\n"
                              b"\r[worker 0]  30%\r[worker 0]  40%\n[worker 1] bye\n[worker 0] done\n"
                              b"[worker 1] rank 1\n[worker 0] rank 0\n")
    assert a.last_lines()[-3:] == [b" 40%", b"done", b"rank 0"]
    assert err.getvalue() == "pskv launch: a note\n"


@pytest.mark.parametrize("notes_to", ["the-same-pipe", "a-file"])  # `2>&1 | less`, `| less`
def test_a_stalled_terminal_blocks_no_note_and_gets_its_output_back_with_the_count_of_lines_lost(tmp_path, notes_to):
    read_end, write_end = os.pipe()  # the terminal: a `| less` that was paused (nobody reads)
    got = bytearray()

    def read_all() -> None:
        while chunk := os.read(read_end, 65536):
            got.extend(chunk)

    reader = threading.Thread(target=read_all, daemon=True)
    err_file = tmp_path / "err"
    with (open(write_end, "wb") as out,
          open(write_end, "w", closefd=False) if notes_to == "the-same-pipe" else open(err_file, "w") as err):
        console = Console(out, err, log_dir=str(tmp_path / "logs"), tee=True)
        worker = console.output(ProcessSpec("worker", 0, "h", ("x",)))
        written = [b"%04d " % i + b"x" * 995 for i in range(2000)]
        for line in written:  # 2 MB: more than the pipe and the console's queue hold
            worker.write(line + b"\n")
        started = time.monotonic()
        console.note("worker 1 did not stop within 5 s; killing it")  # the supervisor's control path
        assert time.monotonic() - started < 1
        reader.start()  # the terminal reads again
        console.flush()
        worker.write(b"after the stall\n")
        worker.close()
        console.flush()
    reader.join(5)
    os.close(read_end)
    shown = bytes(got).split(b"\n")
    notes = [line.decode() for line in shown if line.startswith(b"pskv launch: ")]
    if notes_to == "a-file":
        notes = err_file.read_text().splitlines()
    shown = [line for line in shown if not line.startswith(b"pskv launch: ")]
    assert shown[-2:] == [b"[worker 0] after the stall", b""]
    assert {line.removeprefix(b"[worker 0] ") for line in shown[:-2]} <= set(written)  # whole lines, prefixed
    dropped = len(written) - len(shown[:-2])
    assert dropped > 0
    assert notes == [f"pskv launch: output stalled, {dropped} lines dropped",
                     "pskv launch: worker 1 did not stop within 5 s; killing it"]
    assert (tmp_path / "logs" / "worker-0.log").read_bytes() == b"\n".join([*written, b"after the stall", b""])


def test_usage_errors_of_logs_and_levels_start_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PSKV_LOG_LEVEL", "LOUD")
    assert launch_main(["-n", "1", "--", "true"]) == 2
    assert capsys.readouterr().err == ("pskv launch: error: environment variable PSKV_LOG_LEVEL='LOUD': log_level "
                                       "must be one of DEBUG, INFO, WARNING, ERROR, got 'LOUD'\n")
    assert cli_main(["server"]) == 2  # a role started by hand: one line, no traceback
    assert capsys.readouterr().err.startswith("pskv server: error: environment variable PSKV_LOG_LEVEL='LOUD'")
    monkeypatch.delenv("PSKV_LOG_LEVEL")
    assert launch_main(["-n", "1", "--tee", "--", "true"]) == 2
    assert "--tee needs --log-dir" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert launch_main(["-n", "1", "--log-dir", str(tmp_path / "file" / "logs"), "--", "true"]) == 2
    assert f"--log-dir {str(tmp_path / 'file' / 'logs')!r}: cannot create it" in capsys.readouterr().err
    with pytest.raises(pskv.InvalidArgumentError, match="PSKV_LOG_LEVEL='verbose'"):
        ClusterConfig.from_env({"PSKV_LOG_LEVEL": "verbose"})
    assert ClusterConfig.from_env({"PSKV_LOG_LEVEL": "debug"}).log_level == "DEBUG"


def test_records_carry_time_level_and_node_and_stand_aside_for_the_programs_own_logging(monkeypatch, capsys):
    pskv_logger = logging.getLogger("pskv")
    monkeypatch.setattr(logging.root, "handlers", [])  # a program that configured no logging (not pytest)
    monkeypatch.setattr(pskv_logger, "handlers", [])
    monkeypatch.setattr(pskv_logger, "level", pskv_logger.level)
    monkeypatch.setattr(pskv.logs, "_handler", None)
    assert show_records("worker", "", "WARNING")
    assert show_records("worker 3", "", "WARNING")  # named again once registered: the same handler
    log = logging.getLogger("pskv.dist")
    log.info("not shown")
    log.warning("shown")
    assert re.fullmatch(rf"{STAMP} WARNING \[worker 3\] pskv.dist: shown\n", capsys.readouterr().err)
    assert len(pskv_logger.handlers) == 1
    show_records("server 0", "debug".upper(), "INFO")
    logging.getLogger("pskv.server").debug("at DEBUG")
    assert capsys.readouterr().err.endswith(" DEBUG [server 0] pskv.server: at DEBUG\n")
    root = logging.StreamHandler(io.StringIO())  # the program configures logging later: its handler only
    monkeypatch.setattr(logging.root, "handlers", [root])
    log.warning("once")
    assert capsys.readouterr().err == "" and root.stream.getvalue() == "once\n"


# -- ssh: the preflight and the launcher's interpreter ------------------------------------
# A login shell whose python and python3 lack pskv (as on a fresh host); "far" hosts also lack
# the launcher's interpreter path; host "down" refuses connections, as ssh says it; "slow" never answers.
FAKE_LOGIN = """#!/bin/bash
host="$1"; shift
if [ "$host" = down ]; then echo "ssh: connect to host down port 22: Connection refused" >&2; exit 255; fi
if [ "$host" = slow ]; then exec sleep 60; fi
cmd="$*"
if [ "${host#far}" != "$host" ]; then cmd="${cmd//$LAUNCHER_PYTHON//nonexistent/bin/python}"; fi
PATH="$FAKE_LOGIN_BIN:$PATH" exec bash -c "$cmd"
"""
NO_PSKV = "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'pskv'\" >&2\nexit 1\n"


def fake_hosts(tmp_path: Path) -> dict[str, str]:
    """ssh (the test_launcher stand-in, then FAKE_LOGIN) and a login PATH without pskv; the env to use them."""
    bindir, login = tmp_path / "bin", tmp_path / "login"
    bindir.mkdir()
    login.mkdir()
    files = {bindir / "ssh": FAKE_SSH.replace('exec bash -c "$*"', f'exec {tmp_path / "login.sh"} "$host" "$*"'),
             tmp_path / "login.sh": FAKE_LOGIN, login / "python": NO_PSKV, login / "python3": NO_PSKV}
    for path, text in files.items():
        path.write_text(text)
        path.chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ['PATH']}", "FAKE_SSH_LOG": str(tmp_path / "ssh.log"),
            "FAKE_LOGIN_BIN": str(login), "LAUNCHER_PYTHON": sys.executable, "PSKV_LOG_LEVEL": "warning"}


@pytest.mark.timeout(60)
def test_ssh_preflight_names_each_host_that_cannot_run_pskv_and_starts_nothing(tag, tmp_path):
    (tmp_path / "hosts").write_text("127.0.0.1\nfar1\ndown\n")
    code, out = run_launcher(["--launcher", "ssh", "-H", str(tmp_path / "hosts"), "--port", str(free_port()),
                              "-n", "3", "-s", "1", "--", "python", "-c", "pass"], tag, tmp_path,
                             env=fake_hosts(tmp_path))
    assert code == 1, out
    lines = out.splitlines()
    assert lines[0].startswith("pskv launch: 3 workers, 1 server, scheduler on 127.0.0.1:"), out
    assert lines[1:] == [
        "pskv launch: host far1: cannot run pskv: /nonexistent/bin/python: not found; "
        "python3: ModuleNotFoundError: No module named 'pskv'",
        "pskv launch: host down: cannot run pskv: ssh exited with code 255 (255 is also ssh's own code for a "
        "failed connection or login): ssh: connect to host down port 22: Connection refused",
        "pskv launch: error: the preflight failed on 2 of 3 host(s) (pskv must import there with --python PATH "
        "or python3, in the same directory); nothing was started",
    ], out
    calls = (tmp_path / "ssh.log").read_text().splitlines()
    assert len(calls) == 3 and all("pskv-check:" in call for call in calls), calls  # the checks only


@pytest.mark.timeout(60)
def test_ssh_preflight_gives_up_on_a_host_that_does_not_answer_within_the_startup_timeout(tag, tmp_path):
    (tmp_path / "hosts").write_text("slow\n")
    (tmp_path / "servers").write_text("slow\n")  # the server hosts are checked too (once per host)
    start = time.monotonic()
    code, out = run_launcher(["--launcher", "ssh", "-H", str(tmp_path / "hosts"), "--server-hostfile",
                              str(tmp_path / "servers"), "--startup-timeout", "1", "-n", "1", "--", "true"],
                             tag, tmp_path, env=fake_hosts(tmp_path))
    assert code == 1, out
    assert "pskv launch: host slow: cannot run pskv: no answer within 1 s" in out.splitlines(), out
    assert len((tmp_path / "ssh.log").read_text().splitlines()) == 1
    assert time.monotonic() - start < 15, out


@pytest.mark.timeout(60)
def test_ssh_workers_python_runs_as_the_launchers_interpreter_where_the_login_one_lacks_pskv(tag, tmp_path):
    (tmp_path / "hosts").write_text("127.0.0.1 2\n")
    code, out = run_launcher(["--launcher", "ssh", "-H", str(tmp_path / "hosts"), "--port", str(free_port()),
                              "-n", "2", "-s", "1", "--", "python", "-c",
                              "import pskv; kv = pskv.create('dist_sync'); print('rank', kv.rank); kv.close()"],
                             tag, tmp_path, env=fake_hosts(tmp_path))
    assert code == 0, out
    assert f"pskv launch: the worker command's python runs as {sys.executable} on the hosts (it imports pskv " \
           "there)" in out.splitlines(), out
    assert {"[worker 0] rank 0", "[worker 1] rank 1"} <= set(out.splitlines()), out
    calls = (tmp_path / "ssh.log").read_text().splitlines()
    # the launcher passes its PSKV_LOG_LEVEL to every process (a remote login has not got it)
    assert sum("pskv-check:" in call for call in calls) == 1
    assert all(" PSKV_LOG_LEVEL=WARNING " in call for call in calls if "pskv-check:" not in call), calls
    assert tagged_pids(tag) == []
