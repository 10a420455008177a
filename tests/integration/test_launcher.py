"""``pskv launch``: real jobs (local and through a fake ``ssh``), the env contract,
root-cause reporting, signals, timeouts, and LaunchConfig validation.

Every launched process gets ``PSKV_TEST_TAG=<unique>`` through ``--env``; the ``tag``
fixture finds them through ``/proc`` to prove nobody is left running, and kills any
straggler when the test ends. Launchers run in their own session and are killed with
their group when a test runs out of time.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import signal
import socket
import sys
from pathlib import Path

import pytest

import pskv
from pskv.cli import main as cli_main
from pskv.launch import CONTRACT, LaunchConfig, config_from_args, parse_env_pairs
from pskv.launch import add_arguments as add_launch_arguments
from pskv.launch.contract import JobLayout, ProcessSpec, contract_env, env_argv
from pskv.launch.ssh import Host, parse_hostfile, place, read_hostfile, ssh_argv, ssh_specs
from pskv.launch.supervisor import Console, Supervisor, describe_exit
from pskv.testing.jobs import ProcessGroup, child_env, free_port, run_launch, start_launch
from tests.integration.conftest import tagged_pids

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="finds leftover processes through /proc")

REPO = Path(__file__).resolve().parents[2]
JOB_DEADLINE = 40.0  # seconds a launched job may take before the test kills it

WORKER = """
import json, os, signal, sys, time
import numpy as np
import pskv
from pskv.launch import CONTRACT

mode = sys.argv[1]
kv = pskv.create("dist_sync")
n = kv.num_workers
kv.init(7, np.zeros((2, 3), np.float32))
kv.push(7, np.full((2, 3), kv.rank + 1, np.float32))
total = kv.pull(7)
assert (total == n * (n + 1) // 2).all(), total
print(f"rank {kv.rank} of {n}: sum {total[0, 0]:g}")
print("contract " + json.dumps({name: os.environ.get(name) for name in list(CONTRACT) + ["PSKV_TEST_EXTRA",
                                                                                         "OMP_NUM_THREADS"]}))
if kv.rank == 1 and mode == "exit3":
    sys.exit(3)
if kv.rank == 1 and mode == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "hang":
    print("ready")
    time.sleep(120)
if mode == "leave":  # worker 0 is done early (out of data); worker 1 pulls a round it will never push
    if kv.rank == 0:
        kv.close()
        sys.exit(0)
    kv.push(7, np.ones((2, 3), np.float32))
    kv.pull(7)
if mode == "stop":  # worker 1 hangs (stopped, not dead); worker 0 keeps training until it notices
    if kv.rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    for _ in range(10_000):
        kv.push(7, np.ones((2, 3), np.float32))
        kv.pull(7)
kv.close()
"""

FAKE_SSH = """#!/bin/bash
# A stand-in for ssh: drop the options and the host, run the remote command here.
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-i|-l) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host="$1"; shift
echo "$host ${*//$'\n'/ }" >> "$FAKE_SSH_LOG"  # one line per call (the guard's text has newlines)
exec bash -c "$*"
"""


# -- helpers ------------------------------------------------------------------------------
@pytest.fixture
def worker_script(tmp_path: Path) -> Path:
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return path


def run_launcher(args: list[str], tag: str, cwd: Path, env: dict[str, str] | None = None,
                 module: tuple[str, ...] = ("pskv", "launch")) -> tuple[int, str]:
    """Run a launcher to its end (within JOB_DEADLINE); returns (exit code, merged output)."""
    return run_launch(args, cwd, JOB_DEADLINE, env=child_env(env), tag=tag, module=module)


def job(workers: int, servers: int, script: Path, mode: str, *extra: str) -> list[str]:
    return ["-n", str(workers), "-s", str(servers), "--stop-grace", "2", *extra, "--",
            sys.executable, str(script), mode]


START_LINE = re.compile(r"pskv launch: \d+ workers?, \d+ servers?, scheduler on \S+.*, launcher \w+")


def launcher_notes(out: str) -> list[str]:
    """The launcher's own lines, but for its start line (what it starts: tests/integration/test_launch_logs.py)."""
    return [line for line in out.splitlines() if line.startswith("pskv launch: ") and not START_LINE.match(line)
            and not line.startswith((OMP_NOTE, "pskv launch: scheduler at "))]


OMP_NOTE = "pskv launch: each worker gets OMP_NUM_THREADS"  # the launcher's line when it sets it (as torchrun)


def contracts(out: str) -> dict[int, dict[str, str]]:
    """worker rank -> the contract variables it printed."""
    found = {}
    for line in out.splitlines():
        m = re.match(r"\[worker (\d+)\] contract (.*)", line)
        if m:
            found[int(m.group(1))] = json.loads(m.group(2))
    return found


# -- real jobs ----------------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("servers", [1, 2], ids=["1-server", "2-servers"])
def test_a_job_succeeds_and_every_line_carries_its_prefix(servers, tag, tmp_path, worker_script):
    code, out = run_launcher(job(2, servers, worker_script, "ok"), tag, tmp_path)
    assert code == 0, out
    lines = out.splitlines()
    for rank in range(2):
        assert f"[worker {rank}] rank {rank} of 2: sum 3" in lines, out
    assert any(line.startswith("[scheduler] ") for line in lines), out
    for rank in range(servers):
        assert any(line.startswith(f"[server {rank}] ") for line in lines), out
    assert launcher_notes(out) == [], out  # a successful job is quiet
    assert tagged_pids(tag) == []


@pytest.mark.timeout(60)
def test_env_contract_reaches_every_worker(tag, tmp_path, worker_script):
    # python -m pskv.launch is the same command as pskv launch
    code, out = run_launcher(job(2, 1, worker_script, "ok", "--env", "PSKV_TEST_EXTRA=a b=c"), tag, tmp_path,
                             module=("pskv.launch",))
    assert code == 0, out
    seen = contracts(out)
    assert sorted(seen) == [0, 1], out
    port = seen[0]["DMLC_PS_ROOT_PORT"]
    assert port is not None and int(port) > 0
    job_ids = {env.pop("PSKV_JOB_ID") for env in seen.values()}
    assert len(job_ids) == 1 and len(job_ids.pop()) == 12  # one random id per job
    master_port = seen[0]["MASTER_PORT"]  # torch.distributed's: a free port, not the scheduler's
    assert master_port is not None and int(master_port) > 0 and master_port != port
    # as torchrun: CPUs // workers on the host, unless the user set it
    omp = os.environ.get("OMP_NUM_THREADS") or str(max(1, len(os.sched_getaffinity(0)) // 2))
    for rank, env in seen.items():
        assert env == {
            "DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": port,
            "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "2", "DMLC_NODE_HOST": "127.0.0.1",
            "DMLC_WORKER_ID": str(rank), "PSKV_LOCAL_RANK": str(rank), "PYTHONUNBUFFERED": "1",
            "PSKV_TEST_EXTRA": "a b=c", "PSKV_SERVER_RANK": None,  # a server-only variable
            "PSKV_CURVE_KEY_FILE": None,  # only with --curve-key / --secure
            "PSKV_CHECKPOINT_DIR": None, "PSKV_RESUME_FROM": None, "PSKV_RESTART_COUNT": None,  # restarts only
            "PSKV_RECOVERY_TIMEOUT": None, "PSKV_SERVER_RECOVERY": None,  # only with --restart-workers/-servers
            "PSKV_MIN_WORKERS": None, "PSKV_MAX_WORKERS": None, "PSKV_ELASTIC_TIMEOUT": None,  # elastic jobs only
            "PSKV_LAUNCH_TOKEN": None,  # an elastic job's scheduler's only
            "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",  # torchrun's
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": master_port, "OMP_NUM_THREADS": omp,
        }
    assert pskv.config.ClusterConfig.from_env(seen[1]).local_rank == 1
    assert pskv.config.rank_env(seen[1]) == pskv.config.RankEnv("pskv", 1, 2, 1, 2, "127.0.0.1", int(master_port))
    if "OMP_NUM_THREADS" not in os.environ:
        assert f"{OMP_NOTE}={omp} ({len(os.sched_getaffinity(0))} CPUs // 2 workers on this host), as torchrun " \
               "does; set OMP_NUM_THREADS (or --env OMP_NUM_THREADS=N) to choose" in out.splitlines(), out
    code, out = run_launcher(job(2, 1, worker_script, "ok", "--env", "OMP_NUM_THREADS=3"), tag, tmp_path)
    assert code == 0 and {env["OMP_NUM_THREADS"] for env in contracts(out).values()} == {"3"}, out
    assert OMP_NOTE not in out, out


@pytest.mark.timeout(60)
def test_a_failing_worker_is_named_as_the_root_cause(tag, tmp_path, worker_script):
    code, out = run_launcher(job(2, 1, worker_script, "exit3"), tag, tmp_path)
    assert code == 3, out
    notes = launcher_notes(out)
    assert notes[0] == "pskv launch: worker 1 on 127.0.0.1 exited with code 3; stopping the job", out
    assert sum("stopping the job" in note for note in notes) == 1, out  # one root cause
    assert "[worker 1] rank 1 of 2: sum 3" in out.splitlines()  # its output came before the verdict
    assert tagged_pids(tag) == []


@pytest.mark.timeout(60)
def test_a_worker_killed_by_a_signal_is_named_with_the_signal(tag, tmp_path, worker_script):
    code, out = run_launcher(job(2, 2, worker_script, "sigkill"), tag, tmp_path)
    assert code == 128 + signal.SIGKILL, out
    assert launcher_notes(out)[0] == "pskv launch: worker 1 on 127.0.0.1 was killed by SIGKILL; stopping the job"
    assert tagged_pids(tag) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_launcher_stops_everything(signum, tag, tmp_path, worker_script):
    with ProcessGroup("pskv launch") as group:
        proc = start_launch(group, job(2, 1, worker_script, "hang"), tmp_path, tag=tag)
        for ready in ("[worker 0] ready", "[worker 1] ready"):  # readiness, not a sleep
            assert proc.find(ready.__eq__, JOB_DEADLINE), group.describe()
        proc.signal(signum)
        assert proc.wait(JOB_DEADLINE) == 128 + signum, proc.output()
        seen = proc.text()
    name = signal.Signals(signum).name
    assert f"pskv launch: received {name}; stopping the job" in seen, seen
    assert "pskv launch: stopped scheduler, server 0, worker 0, worker 1" in seen, seen
    assert tagged_pids(tag) == []


@pytest.mark.timeout(60)
def test_timeout_stops_the_job(tag, tmp_path, worker_script):
    code, out = run_launcher(job(2, 1, worker_script, "hang", "--timeout", "2"), tag, tmp_path)
    assert code == 124, out
    assert "pskv launch: the job did not finish within --timeout 2 s; stopping it" in out.splitlines(), out
    assert tagged_pids(tag) == []


@pytest.mark.timeout(60)
def test_ssh_launcher_runs_each_role_through_ssh(tag, tmp_path, worker_script):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ssh").write_text(FAKE_SSH)
    (bindir / "ssh").chmod(0o755)
    (tmp_path / "hosts").write_text("# two entries, one machine\n127.0.0.1 2\n\n127.0.0.1   # one slot\n")
    log = tmp_path / "ssh.log"
    port = free_port()
    args = ["--launcher", "ssh", "-H", str(tmp_path / "hosts"), "--port", str(port),
            *job(3, 2, worker_script, "ok")]
    code, out = run_launcher(args, tag, tmp_path, env={"PATH": f"{bindir}:{os.environ['PATH']}",
                                                       "FAKE_SSH_LOG": str(log)})
    assert code == 0, out
    for rank in range(3):
        assert f"[worker {rank}] rank {rank} of 3: sum 6" in out.splitlines(), out
    calls = log.read_text().splitlines()
    checks = [call for call in calls if "pskv-check:" in call]  # the preflight: once per distinct host
    calls = [call for call in calls if call not in checks]
    assert len(checks) == 1 and len(calls) == 1 + 2 + 3, checks + calls
    # each runs under the guard (pskv.launch.guard's text), which ends it when ssh's stdin closes
    assert all(call.startswith(f"127.0.0.1 cd {tmp_path} && {sys.executable} -S -c ") and " -- env " in call
               for call in calls), calls
    seen = contracts(out)
    assert [seen[r]["PSKV_LOCAL_RANK"] for r in range(3)] == ["0", "1", "2"]  # one address: 0, 1, 2
    assert {seen[r]["DMLC_PS_ROOT_PORT"] for r in range(3)} == {str(port)}
    assert {seen[r]["DMLC_NODE_HOST"] for r in range(3)} == {"127.0.0.1"}
    assert tagged_pids(tag) == []


# -- the supervisor with stand-in processes -----------------------------------------------
def fake(role: str, rank: int | None, code: str) -> ProcessSpec:
    return ProcessSpec(role, rank, "127.0.0.1", (sys.executable, "-c", code))


def supervise(specs: list[ProcessSpec], stop_grace: float = 5.0, exit_grace: float = 30.0) -> tuple[int, str, str]:
    out, err = io.BytesIO(), io.StringIO()
    with Supervisor(Console(out, err), stop_grace=stop_grace, exit_grace=exit_grace) as supervisor:
        for spec in specs:
            supervisor.start(spec)
        code = supervisor.run()
    return code, out.getvalue().decode(), err.getvalue()


@pytest.mark.timeout(30)
def test_later_failures_are_consequences_and_stubborn_processes_get_sigkill(tmp_path):
    b, c = tmp_path / "b-ready", tmp_path / "c-ready"
    first = (f"import os, sys, time\nwhile not (os.path.exists({str(b)!r}) and os.path.exists({str(c)!r})):\n"
             "    time.sleep(0.01)\nprint('failing')\nsys.exit(3)")
    exits_1_on_term = (f"import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(1))\n"
                       f"open({str(b)!r}, 'w').close()\ntime.sleep(60)")
    ignores_term = (f"import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                    f"open({str(c)!r}, 'w').close()\ntime.sleep(60)")
    code, out, err = supervise([fake("server", 0, ignores_term), fake("worker", 0, first),
                                fake("worker", 1, exits_1_on_term)], stop_grace=1.0)
    assert code == 3
    assert out == "[worker 0] failing\n"
    assert err.splitlines() == [
        "pskv launch: worker 0 on 127.0.0.1 exited with code 3; stopping the job",
        "pskv launch: worker 1 on 127.0.0.1 exited with code 1; a consequence of worker 0's failure, not a cause",
        "pskv launch: server 0 on 127.0.0.1 did not stop within 1 s; killing (SIGKILL)",
        "pskv launch: stopped server 0",
    ]


@pytest.mark.timeout(30)
def test_servers_that_outlive_the_workers_are_stopped_and_reported():
    code, out, err = supervise([fake("server", 0, "import time; time.sleep(60)"),
                                fake("worker", 0, "print('done', end='')")], exit_grace=0.3)
    assert code == 1
    assert out == "[worker 0] done\n"  # a last line without newline is kept
    assert err.splitlines() == [
        "pskv launch: every worker exited 0, but server 0 on 127.0.0.1 did not exit within 0.3 s after "
        "the last worker; stopping them",
        "pskv launch: stopped server 0",
    ]


@pytest.mark.timeout(30)
def test_a_job_whose_workers_all_exited_0_is_not_restarted_for_a_lingering_server(monkeypatch):
    import pskv.launch as launch_module

    attempts = []

    def lingering(config: LaunchConfig, console: Console) -> int:  # the lingering server as above, through launch()
        attempts.append(config.restart_count)
        with Supervisor(console, stop_grace=1.0, exit_grace=0.3) as supervisor:
            supervisor.start(fake("server", 0, "import time; time.sleep(60)"))
            supervisor.start(fake("worker", 0, "pass"))
            return supervisor.run()

    monkeypatch.setitem(launch_module._RUNNERS, "local", lingering)
    out, err = io.BytesIO(), io.StringIO()
    config = LaunchConfig(num_workers=1, num_servers=1, command=("prog",), max_restarts=2)
    assert launch_module.launch(config, Console(out, err)) == 1
    assert attempts == [0], err.getvalue()  # the training is not run again
    assert "restarting" not in err.getvalue() and "did not exit within 0.3 s" in err.getvalue()


def test_the_scheduler_line_gives_pskv_top_the_jobs_key(tmp_path):
    from pskv.launch.on_host import publish_address
    from pskv.transport.security import generate_keys, write_key_file

    key = str(write_key_file(tmp_path / "cluster.key", generate_keys()))
    config = LaunchConfig(num_workers=1, num_servers=1, command=("prog",), curve_key_file=key)
    err = io.StringIO()
    publish_address(config, Console(io.BytesIO(), err), "127.0.0.1:5")
    publish_address(config, Console(io.BytesIO(), err), "127.0.0.1:5", fresh_key=True)  # --secure's
    publish_address(LaunchConfig(num_workers=1, num_servers=1, command=("prog",)), Console(io.BytesIO(), err), "h:5")
    assert err.getvalue().splitlines() == [
        f"pskv launch: scheduler at 127.0.0.1:5 (watch the job: pskv top --scheduler 127.0.0.1:5 --curve-key {key})",
        f"pskv launch: scheduler at 127.0.0.1:5 (watch the job: pskv top --scheduler 127.0.0.1:5 --curve-key {key}; "
        "--secure's key, readable by you only, removed when the job ends)",
        "pskv launch: scheduler at h:5 (watch the job: pskv top --scheduler h:5)"]


def test_exit_descriptions():
    assert describe_exit(-9) == "was killed by SIGKILL"
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(127) == "exited with code 127 (command not found)"
    assert "killed by SIGKILL" in describe_exit(137)
    assert "ssh" in describe_exit(255, via_ssh=True) and "ssh" not in describe_exit(255)


# -- contract, placement, validation (no processes) ---------------------------------------
def test_contract_env_per_role_and_docs():
    layout = JobLayout("10.0.0.1", 9091, 2, 4)
    server = contract_env(layout, "server", "10.0.0.2", rank=1)
    worker = contract_env(layout, "worker", "10.0.0.3", rank=3, local_rank=1)
    assert "DMLC_WORKER_ID" not in server and server["DMLC_NODE_HOST"] == "10.0.0.2"
    assert server["PSKV_SERVER_RANK"] == "1" and "PSKV_SERVER_RANK" not in worker
    assert (worker["DMLC_WORKER_ID"], worker["PSKV_LOCAL_RANK"]) == ("3", "1")
    argv = env_argv(server, {"PYTHONUNBUFFERED": "0", "X": "y z"}, ["prog", "arg"])
    assert argv[:5] == ["env", "-u", "DMLC_WORKER_ID", "-u", "PSKV_LOCAL_RANK"]  # no stray worker ids
    assert argv[-5:] == ["PYTHONUNBUFFERED=0", "PSKV_SERVER_RANK=1", "X=y z", "prog", "arg"]
    text = (REPO / "docs" / "launch.md").read_text(encoding="utf-8")
    for var in CONTRACT:
        assert f"`{var}`" in text, var


def test_hostfile_and_placement():
    hosts = parse_hostfile("# cluster\nalice@a 2\nb slots=3 # trailing\n\nc\n")
    assert hosts == [Host("alice@a", 2), Host("b", 3), Host("c", 1)]
    where = place(hosts, num_servers=4, num_workers=8)
    assert where.scheduler.address == "a"
    assert [h.name for h in where.servers] == ["alice@a", "b", "c", "alice@a"]
    assert [(h.address, lr) for h, lr in where.workers] == [
        ("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1), ("b", 2),  # round 1, 2, 3 by slots
        ("a", 2), ("b", 3),  # more workers than slots: start over
    ]
    for bad, match in [("", "lists no host"), ("a 0", "slots must be"), ("a b c", "expected 'HOST"),
                       ("-oProxyCommand=x", "starts with '-'"), ("a many", "slots must be")]:
        with pytest.raises(pskv.InvalidArgumentError, match=match):
            parse_hostfile(bad)


def test_dedicated_server_hosts_take_the_servers_and_the_workers_stay_on_the_hostfile(tmp_path):
    hosts, server_hosts = [Host("a", 2), Host("b", 2)], [Host("s1"), Host("root@s2", 4), Host("s3")]
    where = place(hosts, num_servers=4, num_workers=4, server_hosts=server_hosts)
    assert where.scheduler.address == "a"  # the scheduler stays on the first (worker) host
    assert [h.name for h in where.servers] == ["s1", "root@s2", "s3", "s1"]  # entry i mod len; slots ignored
    assert [(h.address, lr) for h, lr in where.workers] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    assert place(hosts, 2, 4).servers == (Host("a", 2), Host("b", 2))  # without: co-located, one per host
    with pytest.raises(pskv.InvalidArgumentError, match="no server host"):
        place(hosts, 2, 4, server_hosts=[])
    # through the launcher's specs: the servers' ssh targets and DMLC_NODE_HOST are the server hosts
    config = LaunchConfig(num_workers=2, num_servers=2, command=("prog",), launcher="ssh", hostfile="h",
                          server_hostfile="s")
    specs = ssh_specs(config, [Host("10.0.0.1"), Host("10.0.0.2")], [Host("10.0.1.1"), Host("10.0.1.2")])
    assert [(s.role, s.rank, s.host, s.argv[3]) for s in specs] == [
        ("scheduler", None, "10.0.0.1", "10.0.0.1"), ("server", 0, "10.0.1.1", "10.0.1.1"),
        ("server", 1, "10.0.1.2", "10.0.1.2"), ("worker", 0, "10.0.0.1", "10.0.0.1"),
        ("worker", 1, "10.0.0.2", "10.0.0.2")]
    assert "DMLC_NODE_HOST=10.0.1.2" in specs[2].argv[-1] and "DMLC_PS_ROOT_URI=10.0.0.1" in specs[2].argv[-1]
    args = argparse.ArgumentParser()
    add_launch_arguments(args)
    parsed = args.parse_args(["-n", "1", "--launcher", "ssh", "-H", "h", "--server-hostfile", "s", "--", "p"])
    assert config_from_args(parsed).server_hostfile == "s"
    (tmp_path / "bad").write_bytes(b"\xff\xfe host\n")
    with pytest.raises(pskv.InvalidArgumentError, match="cannot read the server hostfile"):
        read_hostfile(str(tmp_path / "bad"), "server hostfile")


def test_ssh_command_replaces_the_remote_shell_program():
    assert ssh_argv(Host("u@h"), "/w d", ["prog", "a b"]) == ["ssh", "-o", "BatchMode=yes", "u@h",
                                                              "cd '/w d' && prog 'a b'"]
    assert ssh_argv(Host("h"), "/w", ["prog"], "python -m 'my shell' -q")[:5] == [
        "python", "-m", "my shell", "-q", "-o"]
    config = LaunchConfig(num_workers=2, num_servers=1, command=("prog",), launcher="ssh", hostfile="hosts",
                          ssh_command="enter --x")
    specs = ssh_specs(config, [Host("10.0.0.1"), Host("10.0.0.2")])
    assert [s.argv[:4] for s in specs] == [("enter", "--x", "-o", "BatchMode=yes")] * 4
    assert [s.argv[4] for s in specs] == ["10.0.0.1", "10.0.0.1", "10.0.0.1", "10.0.0.2"]
    args = argparse.ArgumentParser()
    add_launch_arguments(args)
    parsed = args.parse_args(["-n", "1", "--launcher", "ssh", "-H", "h", "--ssh-command", "my-ssh -v", "--", "p"])
    assert config_from_args(parsed).ssh_command == "my-ssh -v"


@pytest.mark.parametrize("change,match", [
    ({"num_workers": 0}, "-n/--num-workers must be >= 1"),
    ({"num_servers": -1}, "-s/--num-servers must be >= 0"),
    ({"num_servers": 0, "address_file": "a"}, "-s 0 starts no scheduler"),
    ({"launcher": "mpi"}, "--launcher mpi needs a hostfile (-H FILE) or a host list"),
    ({"launcher_command": "srun -v"}, "--launcher-command only applies to --launcher slurm or mpi"),
    ({"launcher": "slurm", "launcher_command": "a 'b"}, "--launcher-command \"a 'b\": No closing quotation"),
    ({"command": ()}, "no worker command given"),
    ({"command": ("A=1", "prog")}, "contains '='"),
    ({"launcher": "ssh"}, "--launcher ssh needs a hostfile"),
    ({"hostfile": "hosts"}, "only applies to --launcher ssh"),
    ({"launcher": "pbs"}, "--launcher must be one of local, ssh, slurm, mpi, got 'pbs'"),
    ({"env": {"DMLC_NUM_WORKER": "3"}}, "DMLC_NUM_WORKER is set by the launcher"),
    ({"env": {"PYTHONUNBUFFERED": "0"}}, "PYTHONUNBUFFERED is set by the launcher"),  # docs/launch.md: refused too
    ({"stop_grace": float("inf")}, "--stop-grace must be >= 0 seconds (finite), got inf"),
    ({"exit_grace": float("nan")}, "--exit-grace must be >= 0 seconds (finite), got nan"),
    ({"timeout": 0}, "--timeout must be > 0"),
    ({"port": 70000}, "--port must be a TCP port"),
    ({"ssh_command": "my-ssh"}, "--ssh-command only applies to --launcher ssh"),
    ({"server_hostfile": "servers"}, "--server-hostfile only applies to --launcher ssh"),
    ({"launcher": "ssh", "hostfile": "h", "server_hostfile": ""}, "--server-hostfile needs a file name"),
    ({"launcher": "ssh", "hostfile": "h", "ssh_command": " "}, "--ssh-command is empty"),
    ({"launcher": "ssh", "hostfile": "h", "ssh_command": "a 'b"}, "--ssh-command \"a 'b\": No closing quotation"),
])
def test_launch_config_rejects(change, match):
    settings = {"num_workers": 2, "num_servers": 1, "command": ("python", "train.py"), **change}
    with pytest.raises(pskv.InvalidArgumentError, match=re.escape(match)):
        LaunchConfig(**settings)


@pytest.mark.parametrize("pairs,match", [(["NOEQUALS"], "expected NAME=VALUE"),
                                         (["1BAD=x"], "not a valid environment variable name")])
def test_bad_env_pairs(pairs, match):
    with pytest.raises(pskv.InvalidArgumentError, match=match):
        parse_env_pairs(pairs)


@pytest.mark.parametrize("argv,match", [
    (["-n", "0", "--", "prog"], "-n/--num-workers must be >= 1"),
    (["-n", "2", "--env", "oops", "--", "prog"], "expected NAME=VALUE"),
    (["-n", "2"], "no worker command given"),
    (["-n", "2", "--launcher", "ssh", "--", "prog"], "needs a hostfile"),
    (["-n", "2", "--launcher", "ssh", "-H", "/nonexistent/hosts", "--", "prog"], "cannot read the hostfile"),
    (["-n", "2", "--server-hostfile", "servers", "--", "prog"], "--server-hostfile only applies to --launcher ssh"),
    (["-n", "2", "--launcher", "ssh", "-H", "{hosts}", "--server-hostfile", "/nonexistent/servers", "--", "prog"],
     "cannot read the server hostfile '/nonexistent/servers'"),
    (["-n", "2", "--launcher", "ssh", "-H", "{hosts}", "--server-hostfile", "{bad}", "--", "prog"],
     "bad:1: slots must be a positive integer"),
])
def test_cli_usage_errors_start_nothing(argv, match, capsys, tmp_path):
    (tmp_path / "hosts").write_text("127.0.0.1\n")  # a good hostfile, for the server hostfile's errors
    (tmp_path / "bad").write_text("127.0.0.1 0\n")
    argv = [a.format(hosts=tmp_path / "hosts", bad=tmp_path / "bad") for a in argv]
    assert cli_main(["launch", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pskv launch: error: ") and match in err, err


@pytest.mark.timeout(60)
def test_a_hung_worker_is_named_next_to_the_survivor_that_noticed_it(tag, tmp_path, worker_script):
    code, out = run_launcher(job(2, 1, worker_script, "stop", "--env", "PS_HEARTBEAT_TIMEOUT=2",
                                 "--env", "PS_HEARTBEAT_INTERVAL=0.2"), tag, tmp_path)
    assert code == 1, out
    assert ("pskv launch: worker 0 on 127.0.0.1 exited with code 1 after its NodeFailedError named worker 1 "
            "(look there first); stopping the job") in out, out


@pytest.mark.timeout(60)
def test_a_worker_that_left_early_is_named_as_having_left_not_as_failed(tag, tmp_path, worker_script):
    code, out = run_launcher(job(2, 1, worker_script, "leave"), tag, tmp_path)
    assert code == 1, out
    assert ("pskv launch: worker 1 on 127.0.0.1 exited with code 1 after its NodeFailedError said worker 0 "
            "left the job early") in out, out
    assert "(look there first)" not in out, out


@pytest.mark.timeout(60)
def test_a_local_job_runs_its_scheduler_on_the_port_given(tag, tmp_path, worker_script):
    port = free_port()  # free a moment ago: the scheduler binds it again
    code, out = run_launcher(job(1, 1, worker_script, "ok", "--port", str(port)), tag, tmp_path)
    assert code == 0, out
    assert contracts(out)[0]["DMLC_PS_ROOT_PORT"] == str(port), out


@pytest.mark.timeout(60)
def test_a_local_port_in_use_ends_the_job_with_one_line_naming_it(tag, tmp_path, worker_script):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out = run_launcher(job(1, 1, worker_script, "ok", "--port", str(port)), tag, tmp_path)
    assert code != 0, out
    assert f"[scheduler] pskv scheduler: error: cannot bind tcp://127.0.0.1:{port}: Address already in use" in out, out
    assert "Traceback" not in out, out
    assert "scheduler on 127.0.0.1 exited with code 1" in out, out
