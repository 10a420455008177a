"""``pskv launch --launcher slurm|mpi`` through fake ``srun`` / ``mpirun`` (like the fake ssh of
test_launcher), and ``-s 0``.

The fakes run the command here with the variables a real one sets for a one-task step /
a one-process MPI job, and log each call. Hosts are loopback addresses (127.0.0.1,
127.0.0.2: one machine, two host names).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pskv.config import slurm_allocation
from pskv.launch import LaunchConfig
from pskv.launch.mpi import mpirun_argv
from pskv.launch.slurm import srun_argv, step_specs
from pskv.launch.ssh import Host, read_hostfile, ssh_specs
from tests.integration.conftest import tagged_pids
from tests.integration.test_launcher import REPO, free_port, job, launcher_notes, run_launcher

FAKE_SRUN = """#!/bin/bash
# A stand-in for srun inside an allocation: one task on --nodelist's host, run here.
echo "srun $*" >> "$FAKE_LOG"
node=""
while [ $# -gt 0 ]; do
  case "$1" in
    --nodelist=*) node="${1#--nodelist=}"; shift ;;
    --*) shift ;;
    *) break ;;
  esac
done
export SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_LOCALID=0 SLURM_NODEID=0 SLURM_STEP_NODELIST="$node" SLURMD_NODENAME="$node"
exec "$@"
"""

FAKE_MPIRUN = """#!/bin/bash
# A stand-in for Open MPI's mpirun: -np 1 -host HOST, run here.
echo "mpirun $*" >> "$FAKE_LOG"
while [ $# -gt 0 ]; do
  case "$1" in
    -np|-host) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
export OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=1 OMPI_COMM_WORLD_LOCAL_RANK=0 OMPI_COMM_WORLD_LOCAL_SIZE=1
exec "$@"
"""

WORKER = """
import os, sys
import numpy as np
import pskv
from pskv.config import rank_env

kv = pskv.create("dist_sync")
kv.init(3, np.zeros(2, np.float32))
kv.push(3, np.full(2, kv.rank + 1, np.float32))
print(f"rank {kv.rank} of {kv.num_workers} local {kv.local_rank} on {os.environ['DMLC_NODE_HOST']}: "
      f"sum {kv.pull(3)[0]:g}; {rank_env()}", flush=True)
if kv.rank == 1 and sys.argv[1] == "exit3":
    sys.exit(3)
kv.close()
"""


def fakes(tmp_path: Path, **scripts: str) -> dict[str, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in scripts.items():
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ['PATH']}", "FAKE_LOG": str(tmp_path / "calls.log")}


def ranks(out: str) -> dict[int, str]:
    """worker prefix rank -> what it printed about itself."""
    found = {}
    for line in out.splitlines():
        if line.startswith("[worker ") and "] rank " in line:
            found[int(line[8:line.index("]")])] = line.split("] ", 1)[1]
    return found


@pytest.mark.timeout(60)
def test_slurm_runs_each_process_as_a_step_on_the_allocations_hosts_and_names_the_failed_rank(tag, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**fakes(tmp_path, srun=FAKE_SRUN), "SLURM_JOB_NODELIST": "127.0.0.[1-2]",
           "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_ID": "77"}
    port = free_port()
    code, out = run_launcher(["--launcher", "slurm", "--port", str(port), *job(3, 2, script, "exit3")],
                             tag, tmp_path, env=env)
    assert code == 3, out
    # placement on the allocation's hosts: by slots, the scheduler's host first
    seen = ranks(out)
    for rank, (host, local) in enumerate([("127.0.0.1", 0), ("127.0.0.2", 0), ("127.0.0.1", 1)]):
        assert seen[rank].startswith(f"rank {rank} of 3 local {local} on {host}: sum 6; "
                                     f"RankEnv(source='pskv', rank={rank}, world_size=3, local_rank={local}, "
                                     f"local_world_size={2 if host == '127.0.0.1' else 1}, "
                                     f"master_addr='127.0.0.1', master_port={port + 1})"), out
    assert launcher_notes(out)[0] == "pskv launch: worker 1 on 127.0.0.2 exited with code 3; stopping the job", out
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert len(calls) == 1 + 2 + 3
    # scheduler, servers, workers on .1: 1 + 1 + 2; on .2: 1 server, 1 worker (the fakes log in any order)
    assert sorted(c.split()[3] for c in calls) == ["--nodelist=127.0.0.1"] * 4 + ["--nodelist=127.0.0.2"] * 2
    assert all(c.startswith("srun --nodes=1 --ntasks=1 --nodelist=") and " --overlap " in c for c in calls), calls
    assert tagged_pids(tag) == []


@pytest.mark.timeout(60)
def test_mpi_runs_each_process_through_mpirun_on_a_host_list_and_names_the_failed_rank(tag, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    code, out = run_launcher(["--launcher", "mpi", "-H", "127.0.0.2:1,127.0.0.1:2", "--port", str(free_port()),
                              *job(3, 1, script, "exit3")], tag, tmp_path, env=fakes(tmp_path, mpirun=FAKE_MPIRUN))
    assert code == 3, out
    seen = ranks(out)
    for rank, (host, local) in enumerate([("127.0.0.2", 0), ("127.0.0.1", 0), ("127.0.0.1", 1)]):
        # pskv's ranks win over the one-process MPI job's OMPI_COMM_WORLD_RANK=0
        assert seen[rank].startswith(f"rank {rank} of 3 local {local} on {host}: sum 6; RankEnv(source='pskv', "
                                     f"rank={rank}, world_size=3"), out
    assert launcher_notes(out)[0] == "pskv launch: worker 1 on 127.0.0.1 exited with code 3; stopping the job", out
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert sorted(c.split()[:5] for c in calls) == [["mpirun", "-np", "1", "-host", h] for h in
                                                   ["127.0.0.1"] * 2 + ["127.0.0.2"] * 3]
    assert tagged_pids(tag) == []


@pytest.mark.timeout(60)
def test_workers_only_with_no_servers(tag, tmp_path):
    code, out = run_launcher(["-n", "2", "-s", "0", "--", sys.executable, "-c",
                              "import os, pskv; from pskv.config import rank_env\n"
                              "try:\n    pskv.create('dist_sync')\nexcept pskv.InvalidArgumentError as e:\n    print(e)\n"
                              "print(rank_env(), os.environ['DMLC_NUM_SERVER'])"], tag, tmp_path)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == "pskv launch: 2 workers, 0 servers, scheduler on no host (-s 0: workers only), launcher local"
    assert not any(line.startswith(("[scheduler]", "[server")) for line in lines), out
    assert "[worker 1] a distributed store needs the cluster environment (pskv launch sets it): DMLC_PS_ROOT_PORT " \
           "(the scheduler's port) is not set or not a port; DMLC_NUM_SERVER must be >= 1" in lines, out
    for rank in range(2):
        assert any(line.startswith(f"[worker {rank}] RankEnv(source='pskv', rank={rank}, world_size=2, "
                                   f"local_rank={rank}, local_world_size=2, master_addr='127.0.0.1'")
                   and line.endswith(" 0") for line in lines), out
    assert tagged_pids(tag) == []


def test_step_commands_and_hosts():
    config = LaunchConfig(2, 1, ("python", "t.py"), launcher="slurm", launcher_command="srun --cpus-per-task=4")
    specs = step_specs(config, [Host("n1", 2)], None, lambda host, argv: srun_argv(host, argv, "srun -c 4"))
    assert [s.name for s in specs] == ["scheduler", "server 0", "worker 0", "worker 1"]
    assert specs[0].argv[:8] == ("srun", "-c", "4", "--nodes=1", "--ntasks=1", "--nodelist=n1", "--overlap",
                                 "--kill-on-bad-exit=1")
    assert mpirun_argv(Host("n2"), ["env", "x"]) == ["mpirun", "-np", "1", "-host", "n2", "env", "x"]
    workers_only = LaunchConfig(2, 0, ("p",), launcher="ssh", hostfile="h")  # -s 0: no scheduler, no servers
    assert [s.name for s in ssh_specs(workers_only, [Host("n1", 2)])] == ["worker 0", "worker 1"]
    assert [s.name for s in step_specs(workers_only, [Host("n1", 2)], None, srun_argv)] == ["worker 0", "worker 1"]
    assert read_hostfile("a:2,alice@b:3,c") == [Host("a", 2), Host("alice@b", 3), Host("c", 1)]
    with pytest.raises(ValueError, match="host list 'a:0,b' entry:1: slots must be a positive integer"):
        read_hostfile("a:0,b")
    with pytest.raises(ValueError, match="cannot read the hostfile 'nofile'.*a host list has a ':' or ','"):
        read_hostfile("nofile")
    assert slurm_allocation({"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2,1(x2)"}) == [
        ("n1", 2), ("n2", 1), ("n3", 1)]
    assert slurm_allocation({}) == []
    with pytest.raises(ValueError, match="SLURM_TASKS_PER_NODE='2' counts 1 nodes, SLURM_JOB_NODELIST='n\\[1-3\\]'"):
        slurm_allocation({"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2"})


def test_slurm_outside_an_allocation_starts_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run([sys.executable, "-m", "pskv", "launch", "--launcher", "slurm", "-n", "1", "--", "true"],
                          env={**env, "PYTHONPATH": str(REPO)}, cwd=tmp_path, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 2
    assert "SLURM_JOB_NODELIST is not set here; or name the hosts with -H" in proc.stderr, proc.stderr



@pytest.mark.timeout(60)
def test_pytorchjob_pods_run_scheduler_servers_and_workers_with_the_operators_variables(tag, tmp_path):
    """examples/cluster/pytorchjob-pod.sh in two "pods" here, each with what the operator and the
    manifest give it (POD_IP 127.0.0.1 / 127.0.0.2; the master pod's MASTER_ADDR is localhost)."""
    master_port = free_port() - 1  # the scheduler takes MASTER_PORT + 1
    pods = []
    for rank, (ip, master) in enumerate([("127.0.0.1", "localhost"), ("127.0.0.2", "127.0.0.1")]):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DMLC_", "PSKV_", "SLURM_", "OMPI_", "PMI_"))}
        env.update(PYTHONPATH=str(REPO), PYTHON=sys.executable, PSKV_TEST_TAG=tag, RANK=str(rank), WORLD_SIZE="2",
                   MASTER_ADDR=master, MASTER_PORT=str(master_port), POD_IP=ip, DMLC_NUM_SERVER="2")
        pods.append(subprocess.Popen(["sh", str(REPO / "examples/cluster/pytorchjob-pod.sh"), sys.executable,
                                      str(REPO / "examples/cluster/train.py")], env=env, cwd=tmp_path,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True))
    outs = []
    try:
        for pod in pods:
            outs.append(pod.communicate(timeout=45)[0])
    finally:
        for pod in pods:
            if pod.poll() is None:
                os.killpg(pod.pid, 9)
                pod.wait()
    for rank, (pod, out) in enumerate(zip(pods, outs)):
        assert pod.returncode == 0, out
        assert f"worker {rank} of 2 (local rank 0): sum 3" in out, out
    assert "server 0 serving on tcp://127.0.0.1:" in outs[0] and "server 1 serving on tcp://127.0.0.2:" in outs[1]
    assert tagged_pids(tag) == []
